#pragma once
// The MLP language model's own CUDA kernels: the embedding gather and its
// gradient. The loss, the bias and GELU forms where cuBLASLt's epilogues do
// not run them, and the fixed-order column sums of bias gradients are the
// kernel kit's (trainer_kit/kernels/), brought into this namespace.
//
// Every reduction here runs in a fixed order (no floating-point atomics on
// the results), so a run is reproducible bit for bit on the same GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <span>

#include "tessera/backend/cuda/error.hpp"
#include "tessera/core/error.hpp"
#include "tessera/backend/cuda/stream.hpp"
#include "tessera/core/dtype.hpp"
#include "trainer_kit/grouped_rows.cuh"
#include "trainer_kit/kernels/column_sums.cuh"
#include "trainer_kit/kernels/elementwise.cuh"
#include "trainer_kit/kernels/launch.cuh"
#include "trainer_kit/kernels/loss.cuh"

namespace mlp_lm::gpu {

using namespace trainer_kit::kernels;
using tessera::convert;
constexpr int vocab = 256;

// X[j, k e + c] = E[ctx[j, k], c], moved in words of W (16 bytes where rows allow).
template <class W>
__global__ void embed_forward_kernel(const W* E, const std::uint8_t* ctx, std::size_t rows, int ew, W* X) {
  const std::size_t total = rows * std::size_t(ew);
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = i / std::size_t(ew);  // row r = token j, position k
    X[i] = E[std::size_t(ctx[r]) * std::size_t(ew) + i % std::size_t(ew)];
  }
}

//! X[n, ctx*e] from the embedding table E[256, e] (compute type C).
template <class C>
void embed_forward(const C* E, const std::uint8_t* ctx, int n, int ctxlen, int e, C* X) {
  const std::size_t rows = std::size_t(n) * std::size_t(ctxlen);
  if (rows == 0) return;
  const cudaStream_t s = tessera::cuda::current_stream();
  if ((std::size_t(e) * sizeof(C)) % 16 == 0) {
    const int ew = int(std::size_t(e) * sizeof(C) / 16);
    embed_forward_kernel<<<blocks_for(rows * std::size_t(ew), 256), 256, 0, s>>>(
        reinterpret_cast<const uint4*>(E), ctx, rows, ew, reinterpret_cast<uint4*>(X));
  } else {
    embed_forward_kernel<<<blocks_for(rows * std::size_t(e), 256), 256, 0, s>>>(E, ctx, rows, e, X);
  }
  TESSERA_CUDA(cudaGetLastError());
}

// S[r, v] = (bytes[r] == v): the one-hot rows whose product S^T dX is the
// embedding gradient (a GEMM: fast, exact products, a fixed summation order).
template <class C>
__global__ void one_hot_kernel(const std::uint8_t* bytes, std::size_t rows, C* S) {
  const std::size_t total = rows * vocab;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += std::size_t(gridDim.x) * blockDim.x)
    S[i] = convert<C>(bytes[i / vocab] == std::uint8_t(i % vocab) ? 1.0f : 0.0f);
}
template <class C>
void one_hot(const std::uint8_t* bytes, std::size_t rows, C* S) {
  if (rows == 0) return;
  one_hot_kernel<<<blocks_for(rows * vocab, 256), 256, 0, tessera::cuda::current_stream()>>>(bytes, rows, S);
  TESSERA_CUDA(cudaGetLastError());
}

// The embedding gradient without a GEMM (when cuBLASLt has none for the row width):
// gE[v, c] (+)= sum over rows r with byte v of dX[r, c]. `order` lists the rows
// grouped by byte (starts[v] .. starts[v+1]): trainer_kit's grouped rows, a
// fixed summation order with no atomics.
template <class C>
void embed_backward(const C* dX, const int* order, const int* starts, int e, float* gE, bool overwrite) {
  trainer_kit::grouped_rows(dX, order, starts, nullptr, vocab, e, gE, overwrite, tessera::cuda::current_stream());
}

}  // namespace mlp_lm::gpu
