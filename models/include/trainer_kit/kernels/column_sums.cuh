#pragma once
// Column sums (bias gradients: the sum over rows of dY) in two fixed-order
// passes, no atomics: partial sums over slices of rows, then the slices added
// in order. The same bits on every run at one shape, on any GPU, and as fast
// as the bytes allow (16-byte loads where rows allow; several loads in
// flight). column_finish is also the second pass of any kernel that leaves
// per-block partial sums (the LayerNorm backward's). column_add_atomic is the
// form without scratch, for callers that need no fixed order.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <span>

#include "tessera/backend/cuda/stream.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/vec.hpp"
#include "trainer_kit/kernels/launch.cuh"
#include "trainer_kit/kernels/scratch.hpp"

namespace trainer_kit::kernels {

using tessera::convert;
using tessera::load_vec;
using tessera::vec;

// Column sums in two fixed-order passes: partial[p, c] over a slice of rows, then out[c] (+)= sum_p.
template <class C>
__global__ void column_partial_kernel(const C* Y, int n, int cols, int rows_per_part, float* partial) {
  const int c = int(blockIdx.x) * 32 + int(threadIdx.x);
  const int r0 = int(blockIdx.y) * rows_per_part, r1 = min(n, r0 + rows_per_part);
  float s = 0, s1 = 0, s2 = 0, s3 = 0;  // four loads in flight
  if (c < cols) {
    int r = r0 + int(threadIdx.y);
    const std::size_t w = std::size_t(cols);
    for (; r + 24 < r1; r += 32) {
      s += convert<float>(Y[std::size_t(r) * w + std::size_t(c)]);
      s1 += convert<float>(Y[std::size_t(r + 8) * w + std::size_t(c)]);
      s2 += convert<float>(Y[std::size_t(r + 16) * w + std::size_t(c)]);
      s3 += convert<float>(Y[std::size_t(r + 24) * w + std::size_t(c)]);
    }
    for (; r < r1; r += 8) s += convert<float>(Y[std::size_t(r) * w + std::size_t(c)]);
    s = (s + s1) + (s2 + s3);
  }
  __shared__ float part[8][33];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0;
#pragma unroll
    for (int y = 0; y < 8; ++y) t += part[y][threadIdx.x];
    partial[std::size_t(blockIdx.y) * std::size_t(cols) + std::size_t(c)] = t;
  }
}
// The same partial sums, V columns per thread in one 16-byte load per row:
// each column is summed by the same thread rows, into the same four
// accumulators, in the same order, and the block combines them as above, so
// the partials equal column_partial_kernel's bit for bit (with 8x fewer loads).
template <class C, int V>
__global__ void column_partial_vec_kernel(const C* Y, int n, int cols, int rows_per_part, float* partial) {
  const int c = (int(blockIdx.x) * 32 + int(threadIdx.x)) * V;
  const int r0 = int(blockIdx.y) * rows_per_part, r1 = min(n, r0 + rows_per_part);
  float s[V] = {}, s1[V] = {}, s2[V] = {}, s3[V] = {};
  auto add = [](float* acc, const vec<C, V>& x) {
    #pragma unroll
    for (int k = 0; k < V; ++k) acc[k] += convert<float>(x.v[k]);
  };
  if (c < cols) {
    int r = r0 + int(threadIdx.y);
    const std::size_t w = std::size_t(cols);
    for (; r + 24 < r1; r += 32) {
      const vec<C, V> a = load_vec<V>(Y + std::size_t(r) * w + std::size_t(c));
      const vec<C, V> b = load_vec<V>(Y + std::size_t(r + 8) * w + std::size_t(c));
      const vec<C, V> d = load_vec<V>(Y + std::size_t(r + 16) * w + std::size_t(c));
      const vec<C, V> e = load_vec<V>(Y + std::size_t(r + 24) * w + std::size_t(c));
      add(s, a);
      add(s1, b);
      add(s2, d);
      add(s3, e);
    }
    for (; r < r1; r += 8) add(s, load_vec<V>(Y + std::size_t(r) * w + std::size_t(c)));
    #pragma unroll
    for (int k = 0; k < V; ++k) s[k] = (s[k] + s1[k]) + (s2[k] + s3[k]);
  }
  __shared__ float part[8][32 * V + 1];
  #pragma unroll
  for (int k = 0; k < V; ++k) part[threadIdx.y][int(threadIdx.x) * V + k] = s[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    #pragma unroll
    for (int k = 0; k < V; ++k) {
      float t = 0;
#pragma unroll
      for (int y = 0; y < 8; ++y) t += part[y][int(threadIdx.x) * V + k];
      partial[std::size_t(blockIdx.y) * std::size_t(cols) + std::size_t(c + k)] = t;
    }
  }
}
//! out[c] (+)= the sum over p < parts of partial[p cols + c], in p's order;
//! columns at or past `split` go to out2[c - split] instead (two gradients
//! from one pass: a LayerNorm's weight and bias).
template <class T>
__global__ void column_finish_kernel(const T* partial, int parts, int cols, float* out, bool overwrite, int split,
                                     float* out2) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= cols) return;
  float t = 0;
  for (int p = 0; p < parts; ++p) t += convert<float>(partial[std::size_t(p) * std::size_t(cols) + std::size_t(c)]);
  float& o = c < split ? out[c] : out2[c - split];
  o = overwrite ? t : o + t;
}
template <class T>
void column_finish(const T* partial, int parts, int cols, float* out, bool overwrite, cudaStream_t s,
                   int split = -1, float* out2 = nullptr) {
  column_finish_kernel<<<blocks_for(std::size_t(cols), 256), 256, 0, s>>>(partial, parts, cols, out, overwrite,
                                                                          split < 0 ? cols : split, out2);
  check_launch();
}

//! out[c] (+)= sum_r Y[r, c] for Y[n, cols]; scratch holds column_scratch_floats(cols) floats
//! (checked: an undersized scratch is an error, not a write past its end).
template <class C>
void column_sums(const C* Y, int n, int cols, float* out, bool overwrite, std::span<float> scratch,
                 cudaStream_t s = tessera::cuda::current_stream()) {
  const int chunks = (cols + 31) / 32;
  // Enough slices for about 2048 blocks (all SMs busy with loads in flight), each of at least 64 rows.
  int parts = std::max(1, std::min({column_parts_max, (n + 63) / 64, std::max(1, 2048 / chunks)}));
  const int rows = (n + parts - 1) / std::max(parts, 1);
  parts = n == 0 ? 0 : (n + rows - 1) / rows;
  TESSERA_CHECK(std::size_t(parts) * std::size_t(std::max(cols, 0)) <= scratch.size(), "column_sums over ", n, " rows of ",
                cols, " columns needs ", std::size_t(parts) * std::size_t(cols), " floats of scratch; ", scratch.size(),
                " given");
  if (parts > 0) {
    // The slices stay those of 32-column chunks whichever kernel runs, so both give the same sums.
    constexpr int V = 16 / int(sizeof(C));
    if (cols % V == 0 && aligned16(Y)) {
      const unsigned wide = unsigned((cols / V + 31) / 32);
      column_partial_vec_kernel<C, V><<<dim3(wide, unsigned(parts)), dim3(32, 8), 0, s>>>(Y, n, cols, rows, scratch.data());
    } else {
      column_partial_kernel<<<dim3(unsigned(chunks), unsigned(parts)), dim3(32, 8), 0, s>>>(Y, n, cols, rows, scratch.data());
    }
    TESSERA_CUDA(cudaGetLastError());
  }
  column_finish(scratch.data(), parts, cols, out, overwrite, s);
}

//! out[c] += sum_r Y[r, c] with one atomic per column and block of 256 rows:
//! no scratch, but the order of the additions varies run to run (where a
//! caller has no scratch and no need of the same bits).
template <class T>
__global__ void column_add_atomic_kernel(const T* y, int n, int cols, float* out) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= cols) return;
  const int r0 = int(blockIdx.y) * 256, r1 = min(n, r0 + 256);
  float s = 0;
  for (int r = r0; r < r1; ++r) s += convert<float>(y[std::size_t(r) * std::size_t(cols) + c]);
  atomicAdd(out + c, s);
}
template <class T>
void column_add_atomic(const T* y, int n, int cols, float* out, cudaStream_t s = tessera::cuda::current_stream()) {
  if (n <= 0 || cols <= 0) return;
  column_add_atomic_kernel<T><<<dim3(unsigned((cols + 255) / 256), unsigned((n + 255) / 256)), 256, 0, s>>>(y, n, cols, out);
  check_launch();
}

}  // namespace trainer_kit::kernels
