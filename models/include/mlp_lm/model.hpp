#pragma once
// The byte-level MLP language model: its parameters, their registration as
// Tessera units, and their deterministic initialisation.
//
//   x0 = concat_k E[byte_{t-ctx+k}]                 (ctx embeddings of width d/ctx)
//   x_{l+1} = x_l + W2_l gelu_tanh(W1_l x_l + b1_l) + b2_l   (hidden width 4d)
//   logits = Wh x_L + bh,  loss = softmax cross-entropy over 256 bytes
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "mlp_lm/data.hpp"
#include "tessera/shard/layout.hpp"
#include "tessera/wrapper/options.hpp"

namespace mlp_lm {

constexpr int vocab = 256;

struct model_shape {
  int layers, d, ctx;
  [[nodiscard]] int e() const noexcept { return d / ctx; }
  [[nodiscard]] int hidden() const noexcept { return 4 * d; }
  [[nodiscard]] std::size_t params() const noexcept {
    const std::size_t D = std::size_t(d);
    return std::size_t(vocab) * std::size_t(e()) + std::size_t(layers) * (8 * D * D + 5 * D) + vocab * D + vocab;
  }
  //! Forward + backward GEMM flops per token (6 per weight of the matmuls).
  [[nodiscard]] double flops_per_token() const noexcept {
    const double D = d;
    return 6.0 * (layers * 8.0 * D * D + vocab * D);
  }
};

//! How a compute back end keeps activations for backward.
struct net_options {
  //! Keep each block's GELU input only and recompute its output in backward
  //! (one elementwise pass per block): L x tokens x 4d activations fewer. The
  //! host back end always does.
  bool recompute_gelu = false;
  //! Micro-batches whose inputs stay staged in device memory at once (the
  //! CUDA back end): a step graph stages every micro-batch of a step before
  //! its launch, each in its own slot.
  int input_slots = 1;
};

struct block_ids {
  tessera::unit_id unit;
  tessera::param_id w1, b1, w2, b2;
};
struct model_ids {
  tessera::unit_id embed, head;
  tessera::param_id table, hw, hb;
  std::vector<block_ids> blocks;
};

//! Registers the model: one unit for the embedding, one per block, one for the head.
template <class Wrapper>
model_ids register_model(Wrapper& m, const model_shape& s) {
  using tessera::shape;
  const std::int64_t d = s.d, h = s.hidden();
  model_ids ids;
  ids.embed = m.add_unit("embed");
  ids.table = m.add_param(ids.embed, "table", shape({vocab, s.e()}), false);
  for (int l = 0; l < s.layers; ++l) {
    block_ids b;
    b.unit = m.add_unit("block" + std::to_string(l));
    b.w1 = m.add_param(b.unit, "w1", shape({h, d}));
    b.b1 = m.add_param(b.unit, "b1", shape({h}), false);
    b.w2 = m.add_param(b.unit, "w2", shape({d, h}));
    b.b2 = m.add_param(b.unit, "b2", shape({d}), false);
    ids.blocks.push_back(b);
  }
  ids.head = m.add_unit("head");
  ids.hw = m.add_param(ids.head, "w", shape({vocab, d}));
  ids.hb = m.add_param(ids.head, "b", shape({vocab}), false);
  return ids;
}

//! A normal(0, std) value for element i of tensor `tag`, independent of world size.
inline float init_normal(std::uint64_t seed, std::uint64_t tag, std::size_t i, double stdev) {
  const std::uint64_t a = hash64(seed * 0x9e3779b97f4a7c15ull ^ (tag << 32) ^ (2 * i));
  const std::uint64_t b = hash64(a ^ 0x632be59bd9b4e019ull);
  const double u1 = (double(a >> 11) + 1.0) * 0x1p-53, u2 = double(b >> 11) * 0x1p-53;
  return float(stdev * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

//! GPT-2-style initialisation: N(0, 0.02) matrices, residual projections
//! scaled by 1/sqrt(2 layers), zero biases, N(0, 0.1) embeddings.
template <class Wrapper>
void init_model(Wrapper& m, const model_ids& ids, const model_shape& s, std::uint64_t seed) {
  using M = typename Wrapper::main_type;
  auto fill = [&](tessera::param_id p, std::uint64_t tag, std::size_t n, double stdev) {
    std::vector<M> v(n);
    auto part = [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) v[i] = stdev == 0 ? M(0) : M(init_normal(seed, tag, i, stdev));
    };
    // Each value depends on its index alone, so threads change nothing but the
    // time (a 1B model took ~20 s on one core).
    const std::size_t threads = std::min<std::size_t>({16, std::max(1u, std::thread::hardware_concurrency()), n >> 20});
    if (threads <= 1) {
      part(0, n);
    } else {
      std::vector<std::jthread> pool;
      for (std::size_t t = 0; t < threads; ++t) pool.emplace_back(part, n * t / threads, n * (t + 1) / threads);
    }
    m.set_param(p, v);
  };
  const std::size_t d = std::size_t(s.d), h = std::size_t(s.hidden());
  fill(ids.table, 1, std::size_t(vocab) * std::size_t(s.e()), 0.1);
  for (std::size_t l = 0; l < ids.blocks.size(); ++l) {
    const auto& b = ids.blocks[l];
    fill(b.w1, 100 + 4 * l, h * d, 0.02);
    fill(b.b1, 101 + 4 * l, h, 0.0);
    fill(b.w2, 102 + 4 * l, d * h, 0.02 / std::sqrt(2.0 * double(s.layers)));
    fill(b.b2, 103 + 4 * l, d, 0.0);
  }
  fill(ids.hw, 2, std::size_t(vocab) * d, 0.02);
  fill(ids.hb, 3, vocab, 0.0);
}

}  // namespace mlp_lm
