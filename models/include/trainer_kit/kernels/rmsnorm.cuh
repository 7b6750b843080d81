#pragma once
// RMSNorm on the GPU, the host layer's arithmetic (trainer_kit/host_layers.hpp):
// statistics and the residual stream in fp32, the normalised output (what the
// next product reads) in the compute type C; a warp per row. The backward
// adds into dx (and writes dx in C where asked) and leaves dy x_hat in an fp32
// scratch whose column sums (column_sums.cuh, a fixed order) are the weight's
// gradient: no atomics, the same bits every run.
#include <cuda_runtime.h>

#include <cstddef>

#include "tessera/core/dtype.hpp"
#include "trainer_kit/kernels/column_sums.cuh"
#include "trainer_kit/kernels/launch.cuh"
#include "trainer_kit/kernels/reduce.cuh"

namespace trainer_kit::kernels {

//! out = w (x rsqrt(mean(x^2) + eps)) per row of D; rstd kept for backward.
template <class C>
__global__ void rmsnorm_kernel(const float* x, const C* w, C* out, float* rstd, int n, int D, float eps) {
  const int lane = int(threadIdx.x) & 31;
  const int row = int(blockIdx.x) * int(blockDim.x / 32) + int(threadIdx.x >> 5);
  if (row >= n) return;
  const float* r = x + std::size_t(row) * std::size_t(D);
  float s2 = 0;
  for (int c = lane; c < D; c += 32) s2 += r[c] * r[c];
  const float rs = rsqrtf(warp_sum(s2) / float(D) + eps);
  if (lane == 0) rstd[row] = rs;
  C* o = out + std::size_t(row) * std::size_t(D);
  for (int c = lane; c < D; c += 32) o[c] = tessera::convert<C>(tessera::convert<float>(w[c]) * (r[c] * rs));
}
template <class C>
void rmsnorm(const float* x, const C* w, C* out, float* rstd, int n, int D, float eps, cudaStream_t s) {
  if (n <= 0) return;
  rmsnorm_kernel<C><<<blocks_for(std::size_t(n), 8), 256, 0, s>>>(x, w, out, rstd, n, D, eps);
  check_launch();
}

//! dx += rstd (dy w - x_hat mean(dy w x_hat)); dxc = dx in C where given;
//! p = dy x_hat (the weight gradient's terms, fp32).
template <class C>
__global__ void rmsnorm_backward_kernel(const float* dy, const float* x, const C* w, const float* rstd, float* dx, C* dxc,
                                        float* p, int n, int D) {
  const int lane = int(threadIdx.x) & 31;
  const int row = int(blockIdx.x) * int(blockDim.x / 32) + int(threadIdx.x >> 5);
  if (row >= n) return;
  const std::size_t at = std::size_t(row) * std::size_t(D);
  const float rs = rstd[row];
  float m = 0;
  for (int c = lane; c < D; c += 32) m += dy[at + c] * tessera::convert<float>(w[c]) * (x[at + c] * rs);
  m = warp_sum(m) / float(D);
  for (int c = lane; c < D; c += 32) {
    const float xh = x[at + c] * rs, g = dy[at + c];
    const float v = dx[at + c] + rs * (g * tessera::convert<float>(w[c]) - xh * m);
    dx[at + c] = v;
    if (dxc) dxc[at + c] = tessera::convert<C>(v);
    p[at + c] = g * xh;
  }
}
//! The backward of rmsnorm: dx (fp32, added into; and in C where dxc is
//! given) and dw (+)= the column sums of dy x_hat (`p`: n x D floats of
//! scratch; `scratch`: column_scratch_floats(D)). `fresh`: dw holds nothing yet.
template <class C>
void rmsnorm_backward(const float* dy, const float* x, const C* w, const float* rstd, float* dx, C* dxc, float* dw,
                      bool fresh, float* p, std::span<float> scratch, int n, int D, cudaStream_t s) {
  if (n <= 0) return;
  rmsnorm_backward_kernel<C><<<blocks_for(std::size_t(n), 8), 256, 0, s>>>(dy, x, w, rstd, dx, dxc, p, n, D);
  check_launch();
  column_sums(p, n, D, dw, fresh, scratch, s);
}

}  // namespace trainer_kit::kernels
