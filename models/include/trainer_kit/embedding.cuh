#pragma once
// The token embedding of the reference language models on the GPU: the
// lookup (with a learned position table where the model has one, GPT-2's),
// its backward (atomics, or under --deterministic each token's rows summed
// in a fixed order), and the device slots each micro-batch's tokens are
// staged into (a step graph's micro-batches each read their own).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tessera/backend/cuda/error.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "trainer_kit/grouped_rows.cuh"
#include "trainer_kit/kernels/launch.cuh"
#include "trainer_kit/kernels/scratch.hpp"
#include "trainer_kit/tokens.hpp"

namespace trainer_kit {

using kernels::token_group_ints;

namespace kernels {

//! x[i] = table[tok[i]] (+ pos[i % T] where pos is given), fp32 rows of D.
template <class Token, class C>
__global__ void embed_kernel(const Token* tok, const C* table, const C* pos, float* x, std::size_t n, int T, int D) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n * std::size_t(D);
       k += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t i = k / std::size_t(D), c = k % std::size_t(D);
    const float t = float(table[std::size_t(tok[i]) * std::size_t(D) + c]);
    x[k] = pos ? t + float(pos[(i % std::size_t(T)) * std::size_t(D) + c]) : t;
  }
}
template <class Token, class C>
void embed(const Token* tok, const C* table, const C* pos, float* x, std::size_t n, int T, int D, cudaStream_t s) {
  if (n == 0) return;
  embed_kernel<<<grid(n * std::size_t(D)), 256, 0, s>>>(tok, table, pos, x, n, T, D);
  check_launch();
}

//! The backward with atomics (tokens repeat): gtable[tok[i]] += dx[i], gpos[i % T] += dx[i] where given.
template <class Token, class T = float>
__global__ void embed_backward_kernel(const T* dx, const Token* tok, float* gtable, float* gpos, std::size_t n, int seq,
                                      int D) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n * std::size_t(D);
       k += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t i = k / std::size_t(D), c = k % std::size_t(D);
    atomicAdd(gtable + std::size_t(tok[i]) * std::size_t(D) + c, float(dx[k]));
    if (gpos) atomicAdd(gpos + (i % std::size_t(seq)) * std::size_t(D) + c, float(dx[k]));
  }
}
template <class Token>
void embed_backward(const float* dx, const Token* tok, float* gtable, float* gpos, std::size_t n, int T, int D,
                    cudaStream_t s) {
  if (n == 0) return;
  embed_backward_kernel<Token><<<grid(n * std::size_t(D)), 256, 0, s>>>(dx, tok, gtable, gpos, n, T, D);
  check_launch();
}

//! gpos[p] += the sum over sequences b of dx[b T + p], in b's order: a thread
//! per (position, column) (--deterministic's position-table gradient).
template <class T>
__global__ void position_backward_kernel(const T* dx, float* gpos, int B, int seq, int D) {
  const std::size_t per = std::size_t(seq) * std::size_t(D);
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < per; k += std::size_t(gridDim.x) * blockDim.x) {
    float s = 0;
    for (int b = 0; b < B; ++b) s += float(dx[std::size_t(b) * per + k]);
    gpos[k] += s;
  }
}

}  // namespace kernels

//! The rows of n tokens grouped by token, stably (a counting sort on the
//! host, which has the tokens before the device does): `ints` is
//! [order (n) | starts (cap + 1) | keys (cap)], what grouped_rows reads
//! (at most token_group_ints(n)). The layout is the same for any
//! tokens of n rows: cap = min(n, vocab) groups, those past the real ones
//! empty (grouped_rows skips them), so a step graph that
//! captured backward() replays it on the next micro-batch's groups.
template <class Token>
struct token_groups {
  std::vector<int> ints;
  int groups = 0;  // the real groups (distinct tokens)
  std::size_t n = 0, cap = 0;

  void build(const Token* tok, std::size_t rows, int vocab) {
    n = rows;
    cap = std::min(n, std::size_t(vocab));
    count_.assign(std::size_t(vocab) + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      TESSERA_CHECK(std::size_t(tok[i]) < std::size_t(vocab), "token_groups: token ", tok[i], " past the vocabulary of ", vocab);
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


//! Each input slot's tokens on the device (inputs, then next-token targets, n
//! of each; the spans come from a net's buffer list), and, under
//! --deterministic, the staged micro-batch's rows grouped by token for the
//! embedding's ordered backward.
template <class Token>
class token_slots {
public:
  token_slots() = default;
  //! `tok`: slots x 2 n tokens; `groups`: token_group_ints(n) ints (empty: no groups).
  token_slots(std::span<Token> tok, std::size_t n, std::span<int> groups, int vocab)
      : tok_(tok), n_(n), groups_dev_(groups), vocab_(vocab) {}
  [[nodiscard]] std::size_t slots() const { return n_ ? tok_.size() / (2 * n_) : 0; }
  //! B sequences of T + 1 tokens into `slot`: inputs and next-token targets
  //! (and the groups where held). Waits for the copy (the host buffers are
  //! reused): call it before a step, never inside one being captured.
  void stage(int slot, const Token* seqs, std::size_t B, std::size_t T, cudaStream_t s) {
    TESSERA_CHECK(slot >= 0 && std::size_t(slot) < slots(), "input slot ", slot, " of ", slots());
    TESSERA_CHECK(B * T <= n_, "micro-batch of ", B, " sequences over the planned ", n_ / T);
    host_.assign(2 * n_, Token(0));
    split_sequences(seqs, B, T, host_.data(), host_.data() + n_);
    slot_ = std::size_t(slot);
    TESSERA_CUDA(cudaMemcpyAsync(tok_.data() + slot_ * 2 * n_, host_.data(), host_.size() * sizeof(Token),
                                 cudaMemcpyHostToDevice, s));
    if (!groups_dev_.empty()) {
      groups_.build(host_.data(), B * T, vocab_);
      TESSERA_CUDA(cudaMemcpyAsync(groups_dev_.data(), groups_.ints.data(), groups_.ints.size() * sizeof(int),
                                   cudaMemcpyHostToDevice, s));
    }
    TESSERA_CUDA(cudaStreamSynchronize(s));
  }
  //! T tokens of one prompt into slot 0's inputs (sampling).
  void stage_prompt(const Token* tokens, std::size_t T, cudaStream_t s) {
    TESSERA_CHECK(T <= n_, "a prompt of ", T, " tokens over the planned ", n_);
    slot_ = 0;
    TESSERA_CUDA(cudaMemcpyAsync(tok_.data(), tokens, T * sizeof(Token), cudaMemcpyHostToDevice, s));
    TESSERA_CUDA(cudaStreamSynchronize(s));
  }
  //! Reads slot `slot` from now on (the micro-batch being issued).
  void use(int slot) {
    TESSERA_CHECK(slot >= 0 && std::size_t(slot) < slots(), "input slot ", slot, " of ", slots());
    slot_ = std::size_t(slot);
  }
  [[nodiscard]] const Token* inputs() const { return tok_.data() + slot_ * 2 * n_; }
  [[nodiscard]] const Token* targets() const { return inputs() + n_; }
  //! table[token] += its rows of dx (rows of D) in a fixed order (the groups of the last stage()).
  void grouped_backward(const float* dx, float* table, int D, cudaStream_t s) const {
    groups_.backward(dx, groups_dev_.data(), table, D, s);
  }

private:
  std::span<Token> tok_;
  std::size_t n_ = 0, slot_ = 0;
  std::span<int> groups_dev_;
  int vocab_ = 0;
  token_groups<Token> groups_;
  std::vector<Token> host_;
};

}  // namespace trainer_kit
