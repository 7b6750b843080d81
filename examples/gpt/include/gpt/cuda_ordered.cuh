#pragma once
// The sums tessera-gpt's CUDA net takes in a fixed order under --deterministic.
// The default kernels add gradients with atomics (bias and LayerNorm weight
// gradients per block, embedding rows per token, the loss per row), in an
// order that differs run to run; here every such sum has one order, fixed by
// the shape alone: partial sums written per block and added by a second
// kernel in block order, the loss per row summed by one block, the position
// embedding's rows added in sequence order, and the token embedding's rows
// grouped by token on the host (token_groups) and summed group by group
// (trainer_kit/grouped_rows.cuh). The same bits on every run of one
// micro-batch shape, so that exact_reduction's sums over micro-batches see
// the same gradients at any world size.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpt/cuda_kernels.cuh"
#include "gpt/workspace.hpp"
#include "tessera/backend/cuda/error.hpp"
#include "tessera/core/error.hpp"
#include "trainer_kit/grouped_rows.cuh"

namespace gpt::kernels {

//! out[c] += the sum over k < chunks of partial[k cols + c], in k's order;
//! columns at or past `split` go to out2[c - split] instead (two gradients
//! from one pass: LayerNorm's weight and bias).
//! (A template, as every kernel in these headers: one definition in any number of translation units.)
template <class T = float>
__global__ void column_finish_kernel(const T* partial, int chunks, int cols, float* out, int split, float* out2) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= cols) return;
  float s = 0;
  for (int k = 0; k < chunks; ++k) s += partial[std::size_t(k) * std::size_t(cols) + std::size_t(c)];
  if (c < split) out[c] += s;
  else out2[c - split] += s;
}

//! out[c] += the sum over n rows of y[row, c] (rows of cols): atomics per
//! block, or with `partial` (workspace::column_sum_partial_floats) in row order.
template <class T>
void column_sum(const T* y, int n, int cols, float* out, float* partial, cudaStream_t s) {
  const dim3 g(unsigned((cols + 255) / 256), unsigned((n + 255) / 256));
  column_sum_kernel<T><<<g, 256, 0, s>>>(y, n, cols, out, partial);
  if (partial) column_finish_kernel<float><<<g.x, 256, 0, s>>>(partial, int(g.y), cols, out, cols, nullptr);
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
inline void ordered_sum(const double* v, std::size_t n, double* out, cudaStream_t s) {
  ordered_sum_kernel<double><<<1, 1024, 0, s>>>(v, n, out);
  check_launch();
}

//! gwpe[p] += the sum over sequences b of dx[b T + p], in b's order: a thread per (position, column).
template <class T>
__global__ void position_backward_kernel(const T* dx, float* gwpe, int B, int seq, int D) {
  const std::size_t per = std::size_t(seq) * std::size_t(D);
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < per; k += std::size_t(gridDim.x) * blockDim.x) {
    float s = 0;
    for (int b = 0; b < B; ++b) s += float(dx[std::size_t(b) * per + k]);
    gwpe[k] += s;
  }
}

//! The rows of n tokens grouped by token, stably (a counting sort on the
//! host, which has the tokens before the device does): `ints` is
//! [order (n) | starts (cap + 1) | keys (cap)], what grouped_rows reads
//! (at most workspace::token_group_ints(n)). The layout is the same for any
//! tokens of n rows: cap = min(n, vocab) groups, those past the real ones
//! empty (grouped_rows skips them), so a step graph that
//! captured backward() replays it on the next micro-batch's groups.
struct token_groups {
  std::vector<int> ints;
  int groups = 0;  // the real groups (distinct tokens)
  std::size_t n = 0, cap = 0;

  void build(const std::uint16_t* tok, std::size_t rows, int vocab) {
    n = rows;
    cap = std::min(n, std::size_t(vocab));
    count_.assign(std::size_t(vocab) + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      TESSERA_CHECK(tok[i] < vocab, "token_groups: token ", tok[i], " past the vocabulary of ", vocab);
      ++count_[std::size_t(tok[i]) + 1];
    }
    groups = 0;
    for (std::size_t v = 0; v < std::size_t(vocab); ++v) groups += count_[v + 1] > 0;
    ints.assign(n + 2 * cap + 1, 0);
    int* order = ints.data();
    int* starts = order + n;
    int* keys = starts + cap + 1;
    std::size_t g = 0;
    for (std::size_t v = 0; v < std::size_t(vocab); ++v) {
      const int c = count_[v + 1];
      count_[v + 1] += count_[v];  // count_[v]: where token v's rows start
      if (c > 0) starts[g] = count_[v], keys[g] = int(v), ++g;
    }
    for (; g < cap; ++g) starts[g] = int(n), keys[g] = 0;  // empty
    starts[cap] = int(n);
    for (std::size_t i = 0; i < n; ++i) order[count_[tok[i]]++] = int(i);  // increasing i within a token
  }
  //! gwte[token] += its rows of dx (rows of D), with `dev` a device copy of ints.
  template <class T>
  void backward(const T* dx, const int* dev, float* gwte, int D, cudaStream_t s) const {
    trainer_kit::grouped_rows(dx, dev, dev + n, dev + n + cap + 1, int(cap), D, gwte, false, s);
  }

private:
  std::vector<int> count_;
};

}  // namespace gpt::kernels
