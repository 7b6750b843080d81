#pragma once
// Rotary position embeddings and SwiGLU on the GPU, the host layers'
// arithmetic (trainer_kit/host_layers.hpp), in fp32 with one rounding to the
// compute type per output.
//
// rope: in place on the q and k heads of packed qkv rows (the first
// (H + KV) hd columns of each row: q's heads, then k's), the rotate-half
// convention (x1 cos - x2 sin, x2 cos + x1 sin for a head's two halves), row
// i at position i % T, cos and sin [T, hd / 2] in fp32; `inverse` rotates
// back (the backward: R^T on dq and dk).
// swiglu: rows of [gate | up] (2 f wide) into a = silu(gate) up (f wide),
// and its backward into rows of [dgate | dup].
#include <cuda_runtime.h>

#include <cstddef>

#include "tessera/core/dtype.hpp"
#include "trainer_kit/host_math.hpp"
#include "trainer_kit/kernels/launch.cuh"

namespace trainer_kit::kernels {

template <class C>
__global__ void rope_kernel(C* qkv, std::size_t n, int T, int row, int heads, int hd, const float* cos, const float* sin,
                            float sign) {
  const int half = hd / 2;
  const std::size_t per_row = std::size_t(heads) * std::size_t(half), total = n * per_row;
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < total; k += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t i = k / per_row;
    const int h = int((k % per_row) / std::size_t(half)), c = int(k % std::size_t(half));
    const std::size_t t = (i % std::size_t(T)) * std::size_t(half) + std::size_t(c);
    C* v = qkv + i * std::size_t(row) + std::size_t(h) * std::size_t(hd);
    const float x1 = tessera::convert<float>(v[c]), x2 = tessera::convert<float>(v[c + half]);
    const float cs = cos[t], sn = sign * sin[t];
    v[c] = tessera::convert<C>(x1 * cs - x2 * sn);
    v[c + half] = tessera::convert<C>(x2 * cs + x1 * sn);
  }
}
//! The rotation of the q and k heads (H + KV of them) of n rows, row stride `row`.
template <class C>
void rope(C* qkv, std::size_t n, int T, int row, int heads, int hd, const float* cos, const float* sin, bool inverse,
          cudaStream_t s) {
  const std::size_t total = n * std::size_t(heads) * std::size_t(hd / 2);
  if (total == 0) return;
  rope_kernel<C><<<grid(total), 256, 0, s>>>(qkv, n, T, row, heads, hd, cos, sin, inverse ? -1.0f : 1.0f);
  check_launch();
}

template <class C>
__global__ void swiglu_kernel(const C* gu, C* a, std::size_t n, int f) {
  const std::size_t total = n * std::size_t(f);
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < total; k += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t i = k / std::size_t(f), c = k % std::size_t(f), at = i * 2 * std::size_t(f) + c;
    a[k] = tessera::convert<C>(silu(tessera::convert<float>(gu[at])) * tessera::convert<float>(gu[at + std::size_t(f)]));
  }
}
template <class DA, class C>
__global__ void swiglu_backward_kernel(const DA* da, const C* gu, C* dgu, std::size_t n, int f) {
  const std::size_t total = n * std::size_t(f);
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < total; k += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t i = k / std::size_t(f), c = k % std::size_t(f), at = i * 2 * std::size_t(f) + c;
    const float g = tessera::convert<float>(gu[at]), u = tessera::convert<float>(gu[at + std::size_t(f)]);
    const float dy = tessera::convert<float>(da[k]);
    dgu[at] = tessera::convert<C>(dy * u * silu_grad(g));
    dgu[at + std::size_t(f)] = tessera::convert<C>(dy * silu(g));
  }
}
//! a[n, f] = silu(gate) up from gu[n, 2 f] = [gate | up].
template <class C>
void swiglu(const C* gu, C* a, std::size_t n, int f, cudaStream_t s) {
  if (n * std::size_t(f) == 0) return;
  swiglu_kernel<C><<<grid(n * std::size_t(f)), 256, 0, s>>>(gu, a, n, f);
  check_launch();
}
//! dgu[n, 2 f] = [da up silu'(gate) | da silu(gate)].
template <class DA, class C>
void swiglu_backward(const DA* da, const C* gu, C* dgu, std::size_t n, int f, cudaStream_t s) {
  if (n * std::size_t(f) == 0) return;
  swiglu_backward_kernel<DA, C><<<grid(n * std::size_t(f)), 256, 0, s>>>(da, gu, dgu, n, f);
  check_launch();
}

}  // namespace trainer_kit::kernels
