#pragma once
// GPT-2 as published (Radford et al. 2019; the Hugging Face GPT2LMHeadModel
// layout): token and learned position embeddings, pre-LayerNorm blocks of
// causal multi-head attention (one fused qkv linear with bias, an output
// projection) and a tanh-GELU MLP of width 4d, a final LayerNorm, and an LM
// head tied to the token embedding. Its registration as Tessera units and its
// initialisation.
//
// Units: "embed" holds the tied token table (wte, vocabulary padded to a
// multiple of 128), the position table (wpe) and the final LayerNorm; every
// block is a unit. The embed unit is gathered once per micro-batch and held
// for all of it: the lookup at the start, the head and its backward at the
// end, and the embedding's backward last, so the tied weight's gradient is
// the sum of both uses before the unit's one reduce_grads (README, "Tying
// weights").
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/random.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/wrapper/options.hpp"
#include "trainer_kit/fp8_options.hpp"

namespace gpt {

struct model_shape {
  int layers = 2, heads = 4, d = 64, seq = 32, vocab = 256;  // vocab: the real vocabulary
  int max_seq = 0;  // rows of the position table (0: seq)
  [[nodiscard]] int padded_vocab() const noexcept { return (vocab + 127) / 128 * 128; }
  [[nodiscard]] int positions() const noexcept { return max_seq > 0 ? max_seq : seq; }
  [[nodiscard]] int head_dim() const noexcept { return d / heads; }
  [[nodiscard]] std::size_t block_params() const noexcept {
    const std::size_t D = std::size_t(d);
    return 12 * D * D + 13 * D;  // qkv 3d x d + 3d, proj d x d + d, fc 4d x d + 4d, fc_proj d x 4d + d, 2 LayerNorms
  }
  //! Every parameter, the padded rows of the token table included.
  [[nodiscard]] std::size_t params() const noexcept {
    const std::size_t D = std::size_t(d);
    return std::size_t(padded_vocab()) * D + std::size_t(positions()) * D + 2 * D +
           std::size_t(layers) * block_params();
  }
  //! Forward + backward FLOPs per token: 6 per weight of the matmuls (the
  //! head over the real vocabulary) plus attention's 12 L T d (PaLM's count,
  //! the one llm.c and nanoGPT report MFU with; causal halves are not taken off).
  [[nodiscard]] double flops_per_token() const noexcept {
    const double D = d;
    return 6.0 * (layers * 12.0 * D * D + double(vocab) * D) + 12.0 * layers * double(seq) * D;
  }
};

//! The published sizes (GPT-2's vocabulary of 50257, context 1024).
inline bool preset(const std::string& name, model_shape& s) {
  struct p {
    const char* name;
    int layers, heads, d;
  };
  for (const p& x : {p{"gpt2", 12, 12, 768}, p{"gpt2-medium", 24, 16, 1024}, p{"gpt2-large", 36, 20, 1280},
                     p{"gpt2-xl", 48, 25, 1600}})
    if (name == x.name) {
      s.layers = x.layers, s.heads = x.heads, s.d = x.d, s.vocab = 50257, s.seq = 1024;
      return true;
    }
  return false;
}

//! The shape from the command line, as tessera-gpt and tessera-plan read it:
//! `s` holds the flags' values (or their defaults) and given(flag) says
//! whether a flag was on the command line. A preset sets layers, heads and d
//! (giving one of those too is an error), and vocabulary, context and a
//! 1024-row position table where those flags are absent. Returns "" or the
//! problem, in the flags' terms (the callers report it their own way).
template <class Given>
[[nodiscard]] std::string resolve_shape(const std::string& preset_name, model_shape& s, Given&& given) {
  if (!preset_name.empty()) {
    model_shape p;
    if (!preset(preset_name, p)) return "--model " + preset_name + " is not a GPT-2 size";
    for (const char* f : {"--layers", "--heads", "--d"})
      if (given(f)) return "--model " + preset_name + " sets " + f + "; drop one of them";
    s.layers = p.layers, s.heads = p.heads, s.d = p.d;
    if (!given("--vocab")) s.vocab = p.vocab;
    if (!given("--seq")) s.seq = p.seq;
    if (!given("--max-seq")) s.max_seq = 1024;
  }
  if (s.heads < 1 || s.d % s.heads != 0)
    return "--heads " + std::to_string(s.heads) + " does not divide --d " + std::to_string(s.d);
  if (s.seq > s.positions())
    return "--seq " + std::to_string(s.seq) + " is longer than the position table's " + std::to_string(s.positions()) +
           " rows (--max-seq)";
  return {};
}

//! How a compute back end keeps activations for backward.
struct net_options {
  //! Keep each block's input only and recompute the block's forward in its
  //! backward (one block's activations instead of L).
  bool recompute = false;
  //! The CUDA net's attention in bf16: auto (cuDNN's fused SDPA where the
  //! build has it and it runs, else flash), cudnn, flash or exact. The host
  //! net has one (exact).
  std::string attention = "auto";
  //! The CUDA net sums every gradient and the loss in a fixed order
  //! (the kit's fixed-order sums; cuDNN's deterministic backward): the same bits on
  //! every run. The host net's sums are ordered already.
  bool deterministic = false;
  //! The CUDA net: micro-batches whose tokens it holds at once (stage()),
  //! so that a step graph's micro-batches each read their own (1: one at a
  //! time). The host net ignores it.
  int input_slots = 1;
  //! The CUDA net keeps each block's GELU output (n x 4 d in the compute
  //! type) from the forward for backward, instead of recomputing it from the
  //! GELU input there: an element-wise pass over n x 4 d a block less, L - 1
  //! more such buffers held. --recompute re-runs the block's forward and
  //! keeps the output it made either way. The host net recomputes nothing.
  bool keep_gelu = false;
  //! --precision fp8: the blocks' four products in fp8 (the host net; trainer_kit/fp8_linears.hpp).
  trainer_kit::fp8_options fp8{};
};

struct block_ids {
  tessera::unit_id unit;
  tessera::param_id ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc_proj_w, fc_proj_b;
};
struct model_ids {
  tessera::unit_id embed;
  tessera::param_id wte, wpe, lnf_w, lnf_b;
  std::vector<block_ids> blocks;
};

//! One block's parameters as pointers into its gathered unit `w` (either net,
//! either element type).
template <class T>
struct block_weights {
  const T *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *fc_proj_w, *fc_proj_b;
};
template <class T, class Wrapper>
block_weights<T> weights_of(const Wrapper& m, const block_ids& b, const T* w) {
  auto at = [&](tessera::param_id p) { return w + m.slot(p).offset; };
  return {at(b.ln1_w), at(b.ln1_b), at(b.qkv_w), at(b.qkv_b), at(b.proj_w), at(b.proj_b),
          at(b.ln2_w), at(b.ln2_b), at(b.fc_w), at(b.fc_b), at(b.fc_proj_w), at(b.fc_proj_b)};
}

//! Registers the model. Weight decay on 2-D weights only (matrices and the
//! two tables), as GPT-2 / nanoGPT train it.
template <class Wrapper>
model_ids register_model(Wrapper& m, const model_shape& s) {
  using tessera::shape;
  const std::int64_t d = s.d;
  model_ids ids;
  ids.embed = m.add_unit("embed");
  ids.wte = m.add_param(ids.embed, "wte", shape({s.padded_vocab(), d}));
  ids.wpe = m.add_param(ids.embed, "wpe", shape({s.positions(), d}));
  ids.lnf_w = m.add_param(ids.embed, "ln_f.w", shape({d}), false);
  ids.lnf_b = m.add_param(ids.embed, "ln_f.b", shape({d}), false);
  for (int l = 0; l < s.layers; ++l) {
    block_ids b;
    b.unit = m.add_unit("block" + std::to_string(l));
    b.ln1_w = m.add_param(b.unit, "ln_1.w", shape({d}), false);
    b.ln1_b = m.add_param(b.unit, "ln_1.b", shape({d}), false);
    b.qkv_w = m.add_param(b.unit, "qkv.w", shape({3 * d, d}));
    b.qkv_b = m.add_param(b.unit, "qkv.b", shape({3 * d}), false);
    b.proj_w = m.add_param(b.unit, "proj.w", shape({d, d}));
    b.proj_b = m.add_param(b.unit, "proj.b", shape({d}), false);
    b.ln2_w = m.add_param(b.unit, "ln_2.w", shape({d}), false);
    b.ln2_b = m.add_param(b.unit, "ln_2.b", shape({d}), false);
    b.fc_w = m.add_param(b.unit, "fc.w", shape({4 * d, d}));
    b.fc_b = m.add_param(b.unit, "fc.b", shape({4 * d}), false);
    b.fc_proj_w = m.add_param(b.unit, "fc_proj.w", shape({d, 4 * d}));
    b.fc_proj_b = m.add_param(b.unit, "fc_proj.b", shape({d}), false);
    ids.blocks.push_back(b);
  }
  return ids;
}

//! GPT-2's initialisation through the library's counter-based initializer
//! (the same bits at every world size, strategy and wrapper): N(0, 0.02)
//! matrices and tables, residual projections N(0, 0.02 / sqrt(2 layers)),
//! zero biases, LayerNorm scales 1.
template <class Wrapper>
void init_model(Wrapper& m, const model_ids& ids, const model_shape& s, std::uint64_t seed) {
  using namespace tessera;
  const init::normal w{.seed = seed, .stdev = 0.02};
  const init::normal resid{.seed = seed, .stdev = 0.02 / std::sqrt(2.0 * s.layers)};
  const init::constant zero{0.0}, one{1.0};
  // The padded rows of the token table start at zero (they never receive a gradient, so they stay there).
  m.init_param(ids.wte, init::first<init::normal>{w, std::size_t(s.vocab) * std::size_t(s.d)});
  m.init_param(ids.wpe, w);
  m.init_param(ids.lnf_w, one);
  m.init_param(ids.lnf_b, zero);
  for (const block_ids& b : ids.blocks) {
    m.init_param(b.ln1_w, one), m.init_param(b.ln1_b, zero);
    m.init_param(b.qkv_w, w), m.init_param(b.qkv_b, zero);
    m.init_param(b.proj_w, resid), m.init_param(b.proj_b, zero);
    m.init_param(b.ln2_w, one), m.init_param(b.ln2_b, zero);
    m.init_param(b.fc_w, w), m.init_param(b.fc_b, zero);
    m.init_param(b.fc_proj_w, resid), m.init_param(b.fc_proj_b, zero);
  }
}

}  // namespace gpt
