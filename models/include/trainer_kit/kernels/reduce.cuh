#pragma once
// Warp- and block-wide sums and maxima for the reference models' kernels.
#include <cuda_runtime.h>

#include <cfloat>

namespace trainer_kit::kernels {

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
//! Block-wide sum or max (blockDim.x a multiple of 32, at most 1024); every
//! thread gets the result. `smem` holds 32 floats.
template <bool Max>
__device__ inline float block_reduce(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = Max ? warp_max(v) : warp_sum(v);
  __syncthreads();  // smem may still be read from a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < warps ? smem[lane] : (Max ? -FLT_MAX : 0.0f);
  return Max ? warp_max(v) : warp_sum(v);
}

}  // namespace trainer_kit::kernels
