#pragma once
// The fp8 kernels a linear layer's operands need (docs/fp8.md): the amax of a
// tensor, the cast with a scale held in device memory (recording the input's
// amax in the same pass, for delayed scaling's history), and the cast that
// also writes the transpose (the backward products take their operands with
// the other dimension contiguous: Hopper's fp8 GEMMs are TN only). Every cast
// is tessera::fp8::cast, so the codes equal the host backend's bit for bit.
//
// An amax is a float in device memory that these kernels raise with an atomic
// max (non-negative floats order like their bits); the caller zeroes it before
// the first kernel that raises it. fabsf's NaN does not raise it: a NaN in a
// tensor is the step's non-finite check's to catch, and the scale stays finite.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tessera/backend/cuda/stream.hpp"
#include "tessera/core/fp8_scaling.hpp"
#include "trainer_kit/kernels/launch.cuh"
#include "trainer_kit/kernels/reduce.cuh"

namespace trainer_kit::kernels {

namespace fp8_detail {
__device__ inline void raise_amax(float* amax, float v) {
  // v >= 0 (or +inf): its bits order like its value, so an integer max is a float max.
  if (v > 0.0f) atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(v));
}
// One block's largest |x| over the elements its threads saw, raised into *amax.
__device__ inline void block_amax(float m, float* amax) {
  __shared__ float smem[32];
  m = block_reduce<true>(m, smem);
  if (threadIdx.x == 0) raise_amax(amax, m);
}

template <class T>
__global__ void amax_kernel(const T* x, std::size_t n, float* amax) {
  float m = 0.0f;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(tessera::convert<float>(x[i])));
  block_amax(m, amax);
}

template <class F, class T>
__global__ void cast_kernel(const T* x, std::size_t n, const float* scale, F* out, float* amax) {
  const float s = *scale;
  float m = 0.0f;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    const float v = tessera::convert<float>(x[i]);
    m = fmaxf(m, fabsf(v));
    out[i] = tessera::fp8::cast<F>(v, s);
  }
  if (amax) block_amax(m, amax);
}

// 32 x 32 tiles, 32 x 8 threads: each thread casts four elements of a tile,
// writes them in place (out, optional) and through shared memory transposed.
template <class F, class T>
__global__ void cast_transpose_kernel(const T* x, int rows, int cols, const float* scale, F* out, F* out_t,
                                      float* amax) {
  __shared__ std::uint8_t tile[32][33];  // codes (F's default member initializer rules it out of __shared__)
  const float s = *scale;
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  float m = 0.0f;
  for (int j = threadIdx.y; j < 32; j += 8) {
    const int r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float v = tessera::convert<float>(x[std::size_t(r) * std::size_t(cols) + std::size_t(c)]);
      m = fmaxf(m, fabsf(v));
      const F q = tessera::fp8::cast<F>(v, s);
      tile[j][threadIdx.x] = q.bits;
      if (out) out[std::size_t(r) * std::size_t(cols) + std::size_t(c)] = q;
    }
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += 8) {
    const int c = c0 + j, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out_t[std::size_t(c) * std::size_t(rows) + std::size_t(r)] = F::from_bits(tile[threadIdx.x][j]);
  }
  if (amax) {  // each row of 32 threads is one warp
    __shared__ float smem[8];
    m = warp_max(m);
    if (threadIdx.x == 0) smem[threadIdx.y] = m;
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0) {
      for (int w = 1; w < 8; ++w) m = fmaxf(m, smem[w]);
      raise_amax(amax, m);
    }
  }
}
}  // namespace fp8_detail

//! Raises *amax (device) to the largest |x[i]|, i < n.
template <class T>
void fp8_amax(const T* x, std::size_t n, float* amax) {
  if (n == 0) return;
  fp8_detail::amax_kernel<<<grid(n), 256, 0, tessera::cuda::current_stream()>>>(x, n, amax);
  check_launch();
}

//! out[i] = fp8(x[i] * scale[0]) for i < n (scale in device memory); raises
//! *amax to the largest |x[i]| in the same pass when amax is given.
template <tessera::fp8_format F, class T>
void fp8_cast(const T* x, std::size_t n, const float* scale, F* out, float* amax = nullptr) {
  if (n == 0) return;
  fp8_detail::cast_kernel<<<grid(n), 256, 0, tessera::cuda::current_stream()>>>(x, n, scale, out, amax);
  check_launch();
}

//! x[rows, cols] row-major cast with scale[0]: into out[rows, cols] (if given)
//! and out_t[cols, rows] (its transpose); raises *amax as fp8_cast does.
template <tessera::fp8_format F, class T>
void fp8_cast_transpose(const T* x, int rows, int cols, const float* scale, F* out, F* out_t, float* amax = nullptr) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 blocks(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32)), threads(32, 8);
  fp8_detail::cast_transpose_kernel<<<blocks, threads, 0, tessera::cuda::current_stream()>>>(x, rows, cols, scale, out,
                                                                                             out_t, amax);
  check_launch();
}

}  // namespace trainer_kit::kernels
