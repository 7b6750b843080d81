#pragma once
// The loss every reference language model ends in: softmax cross-entropy over
// rows of logits, the loss summed and dL/dz written over the logits in place,
// in two forms: a block a row for large vocabularies (GPT-2's 50k, Llama's
// 128k; logits in rows padded to a multiple of 16 bytes, the padding's
// gradient zero) and a warp a row for a small one known at compile time (the
// byte MLP's 256). Sums that must be reproducible take a fixed order:
// per-row losses added by ordered_sum, or fixed-point integer atomics.
#include <cuda_runtime.h>

#include <array>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "tessera/backend/cuda/error.hpp"
#include "tessera/backend/cuda/stream.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "trainer_kit/kernels/launch.cuh"
#include "trainer_kit/kernels/reduce.cuh"

namespace trainer_kit::kernels {

using tessera::convert;

//! One block per row of logits in C (fp32, or bf16 as the bf16 classifier
//! writes them), rows ld apart with the real vocabulary V <= ld first: the
//! row's cross-entropy over the V real entries into *loss (double atomics;
//! or, with row_loss, into row_loss[row] for a sum in a fixed order) and,
//! with `grad`, dloss/dz x scale written over the logits in place, zero
//! in the ld - V padded columns (so the padded rows of a tied table get no
//! gradient). 16 bytes a thread at a time (ld a multiple of 16 / sizeof(C),
//! rows 16-byte aligned: cross_entropy() checks), several loads in flight:
//! one element a thread at a time left the kernel waiting on memory, 3x
//! slower than its bytes. Three passes (max; sum of exp; gradient), each
//! element independent of the last: an online softmax chains every element's
//! update on the one before and left the kernel bound by that latency.
//! Cached: the first pass keeps the row in shared memory, so global memory
//! sees one read and one write of it (a GPT-2 row of bf16 logits is 98 KiB:
//! two rows per SM); otherwise each pass reads it again. The padding lets
//! the classifier's GEMMs run on aligned rows.
template <class C, bool Cached, class Tgt>
__global__ void cross_entropy_kernel(C* z, const Tgt* target, int V, int ld, float scale, bool grad,
                                     double* loss, double* row_loss) {
  constexpr int N = 16 / int(sizeof(C));  // elements per 16-byte chunk
  constexpr float log2e = 1.4426950408889634f;
  extern __shared__ uint4 cache[];        // Cached: the row, ld / N chunks
  __shared__ float red[32];
  const std::size_t r = blockIdx.x;
  C* row = z + r * std::size_t(ld);
  uint4* chunks = reinterpret_cast<uint4*>(row);
  const uint4* from = Cached ? cache : chunks;  // passes 2 and 3 read here
  const int nchunks = ld / N;
  auto unpack = [](const uint4& u, float* v) {
    C e[N];
    memcpy(e, &u, sizeof u);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = float(e[i]);
  };
  float m = -FLT_MAX;
#pragma unroll 4
  for (int k = int(threadIdx.x); k < nchunks; k += int(blockDim.x)) {
    const uint4 u = chunks[k];
    if constexpr (Cached) cache[k] = u;
    float v[N];
    unpack(u, v);
#pragma unroll
    for (int i = 0; i < N; ++i) m = fmaxf(m, k * N + i < V ? v[i] : -FLT_MAX);
  }
  m = block_reduce<true>(m, red);  // its __syncthreads: the cached row is whole
  const float mb = m * log2e;      // exp(v - m) = 2^(v log2 e - m log2 e)
  float s = 0;
#pragma unroll 4
  for (int k = int(threadIdx.x); k < nchunks; k += int(blockDim.x)) {
    float v[N];
    unpack(from[k], v);
#pragma unroll
    for (int i = 0; i < N; ++i) s += k * N + i < V ? exp2f(fmaf(v[i], log2e, -mb)) : 0.0f;
  }
  s = block_reduce<false>(s, red);
  const int t = int(target[r]);
  const float zt = float(reinterpret_cast<const C*>(from)[t]);
  if (threadIdx.x == 0) {
    const double l = double(logf(s) + m - zt);
    if (row_loss) row_loss[r] = l;
    else atomicAdd(loss, l);
  }
  if (!grad) return;
  if constexpr (!Cached) __syncthreads();  // every thread has read row[t] before it is overwritten
  const float inv = scale / s;
#pragma unroll 4
  for (int k = int(threadIdx.x); k < nchunks; k += int(blockDim.x)) {
    float v[N];
    unpack(from[k], v);
    C e[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int c = k * N + i;
      e[i] = convert<C>(c < V ? fmaf(exp2f(fmaf(v[i], log2e, -mb)), inv, c == t ? -scale : 0.0f) : 0.0f);
    }
    uint4 u;
    memcpy(&u, e, sizeof u);
    chunks[k] = u;
  }
}

//! The largest row (bytes) cross_entropy() keeps in shared memory on the
//! current device: its opt-in limit less the kernel's static arrays, raised
//! for the kernel once per device (the attribute is the device's; a process
//! may drive several). Past 64 devices: 0, the streamed form.
template <class C, class Tgt>
std::size_t cross_entropy_cache_limit() {
  constexpr int max_devices = 64;
  static std::array<std::once_flag, max_devices> once;
  static std::array<std::size_t, max_devices> limit{};
  int dev = 0;
  TESSERA_CUDA(cudaGetDevice(&dev));
  if (dev < 0 || dev >= max_devices) return 0;
  std::call_once(once[std::size_t(dev)], [dev] {
    int optin = 0;
    TESSERA_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const std::size_t bytes = std::size_t(optin) > 1024 ? std::size_t(optin) - 1024 : 0;
    TESSERA_CUDA(cudaFuncSetAttribute(cross_entropy_kernel<C, true, Tgt>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(bytes)));
    limit[std::size_t(dev)] = bytes;
  });
  return limit[std::size_t(dev)];
}

//! Launches cross_entropy_kernel over `rows` rows on stream s: the cached
//! form (512 threads) where a row fits in shared memory, else the one that
//! reads the row from global memory in each of its three passes. With
//! row_loss, each row's loss goes there instead of into *loss.
template <class C, class Tgt>
void cross_entropy(C* z, const Tgt* target, int V, int ld, float scale, bool grad, double* loss,
                   std::size_t rows, cudaStream_t s, bool allow_cache = true, double* row_loss = nullptr) {
  constexpr int N = 16 / int(sizeof(C));
  TESSERA_CHECK(ld % N == 0 && reinterpret_cast<std::uintptr_t>(z) % 16 == 0 && V <= ld,
                "cross_entropy: rows of ", ld, " logits must be 16-byte aligned and hold the vocabulary of ", V);
  if (rows == 0) return;
  const std::size_t bytes = std::size_t(ld) * sizeof(C);
  if (allow_cache && bytes <= cross_entropy_cache_limit<C, Tgt>())
    cross_entropy_kernel<C, true, Tgt><<<unsigned(rows), 512, bytes, s>>>(z, target, V, ld, scale, grad, loss, row_loss);
  else
    cross_entropy_kernel<C, false, Tgt><<<unsigned(rows), 256, 0, s>>>(z, target, V, ld, scale, grad, loss, row_loss);
  check_launch();
}

//! The small-vocabulary form (V known at compile time, a multiple of 32 up
//! to 1024: the MLP's 256 bytes): one warp per row of V logits, held in
//! registers. loss = logsumexp(z) - z[target], and dZ = scale (softmax(z) -
//! onehot(target)) written over Z. Each block adds its tokens' loss to *loss in fixed point
// (units of 2^-32 nats, an integer atomic): the same sum in any block order,
// so the logged loss is reproducible too.
inline constexpr double loss_unit = 0x1p32;
template <int vocab, class C, class Tgt>
__global__ void softmax_xent_kernel(C* Z, const Tgt* target, int n, float scale, unsigned long long* loss) {
  static_assert(vocab % 32 == 0 && vocab <= 1024, "softmax_xent: a multiple of 32 logits, at most 1024");
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int j = int(blockIdx.x) * int(blockDim.x / 32) + warp;
  __shared__ double block_loss[32];
  double mine = 0;
  if (j < n) {
    C* z = Z + std::size_t(j) * vocab;
    float v[vocab / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < vocab / 32; ++i) {
      v[i] = convert<float>(z[lane + 32 * i]);
      mx = fmaxf(mx, v[i]);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0;
#pragma unroll
    for (int i = 0; i < vocab / 32; ++i) sum += __expf(v[i] - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const int t = int(target[j]);
    const float zt = __shfl_sync(0xffffffffu, v[t / 32], t % 32);
    mine = lane == 0 ? double(logf(sum) + mx - zt) : 0.0;
    const float inv = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < vocab / 32; ++i) {
      const int c = lane + 32 * i;
      z[c] = convert<C>((__expf(v[i] - mx) * inv - (c == t ? 1.0f : 0.0f)) * scale);
    }
  }
  if (lane == 0) block_loss[warp] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    for (int w = 0; w < int(blockDim.x / 32); ++w) s += block_loss[w];
    if (s != 0) atomicAdd(loss, static_cast<unsigned long long>(llrint(s * loss_unit)));  // only the logged loss
  }
}

template <int vocab, class C, class Tgt>
void softmax_xent(C* Z, const Tgt* target, int n, float scale, unsigned long long* loss,
                  cudaStream_t s = tessera::cuda::current_stream()) {
  if (n == 0) return;
  softmax_xent_kernel<vocab><<<blocks_for(std::size_t(n), 8), 256, 0, s>>>(Z, target, n, scale, loss);
  check_launch();
}

//! *out += the sum of v[0, n) in a fixed order: one block of 1024 threads,
//! thread t adding t, t + 1024, ... in turn, then a fixed tree.
template <class T = double>
__global__ void ordered_sum_kernel(const T* v, std::size_t n, T* out) {
  __shared__ T s[1024];
  T a = 0;
  for (std::size_t k = threadIdx.x; k < n; k += blockDim.x) a += v[k];
  s[threadIdx.x] = a;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out += s[0];
}
inline void ordered_sum(const double* v, std::size_t n, double* out, cudaStream_t s = tessera::cuda::current_stream()) {
  ordered_sum_kernel<double><<<1, 1024, 0, s>>>(v, n, out);
  check_launch();
}

}  // namespace trainer_kit::kernels
