#pragma once
// An embedding's weight gradient without atomics, shared by the reference
// trainers: the rows of dX that looked up one table row are listed together
// (a stable counting sort on the host, which has the tokens first), and one
// block sums each group in a fixed order. Reproducible bit for bit, where
// atomics add a repeated token's rows in whatever order they arrive.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "tessera/backend/cuda/error.hpp"
#include "tessera/core/dtype.hpp"

namespace trainer_kit {

//! out[key(g), c] = (overwrite ? 0 : out[key(g), c]) + the sum over
//! i in [starts[g], starts[g + 1]) of dX[order[i], c], for each group g of
//! `groups`, key(g) = keys[g] (or g where keys is null); rows of e columns.
//! Without overwrite, an empty group leaves its row as it is.
//! Blocks of 32 columns x 8 row lanes, each lane taking every 8th row of the
//! group, then the 8 lanes added in order: a fixed summation order.
template <class C>
__global__ void grouped_rows_kernel(const C* dX, const int* order, const int* starts, const int* keys, int groups, int e,
                                    float* out, bool overwrite) {
  const int c = int(blockIdx.x) * 32 + int(threadIdx.x);
  __shared__ float part[8][33];
  for (int g = int(blockIdx.y); g < groups; g += int(gridDim.y)) {
    // Adding, an empty group writes nothing (the same g for the whole block,
    // so the barriers below stay uniform): a caller may pad its groups to a
    // fixed count, keyed to rows that real groups own. Overwriting, it writes 0.
    if (!overwrite && starts[g] == starts[g + 1]) continue;
    float s = 0;
    if (c < e)
      for (int i = starts[g] + int(threadIdx.y); i < starts[g + 1]; i += 8)
        s += tessera::convert<float>(dX[std::size_t(order[i]) * std::size_t(e) + std::size_t(c)]);
    __syncthreads();  // the previous group's parts are read
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < e) {
      float t = 0;
#pragma unroll
      for (int y = 0; y < 8; ++y) t += part[y][threadIdx.x];
      float& o = out[std::size_t(keys ? keys[g] : g) * std::size_t(e) + std::size_t(c)];
      o = overwrite ? t : o + t;
    }
  }
}

//! Launches grouped_rows_kernel on stream s.
template <class C>
void grouped_rows(const C* dX, const int* order, const int* starts, const int* keys, int groups, int e, float* out,
                  bool overwrite, cudaStream_t s) {
  if (groups <= 0 || e <= 0) return;
  const dim3 grid(unsigned((e + 31) / 32), unsigned(std::min(groups, 65535))), block(32, 8);
  grouped_rows_kernel<C><<<grid, block, 0, s>>>(dX, order, starts, keys, groups, e, out, overwrite);
  TESSERA_CUDA(cudaGetLastError());
}

}  // namespace trainer_kit
