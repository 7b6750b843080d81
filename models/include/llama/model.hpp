#pragma once
// Llama 3 as transformers' LlamaForCausalLM computes it: a token embedding,
// pre-norm blocks of RMSNorm (statistics in fp32), grouped-query causal
// attention with rotary position embeddings (rotate-half, rope_theta and
// Llama 3's frequency scaling), RMSNorm and the SwiGLU MLP
// (down(silu(gate x) * up x)), no biases; a final RMSNorm and a head, untied
// (Llama 3.1 8B) or tied to the embedding (Llama 3.2 1B and 3B). Its
// registration as Tessera units and its initialisation.
//
// Units: "embed" holds the token table (vocabulary padded to a multiple of
// 128), the final norm and the untied head; every block is a unit. As in
// GPT-2, the embed unit is gathered once per micro-batch and held for all of
// it (lookup, head, their backward), so a tied table's gradient is the sum of
// both uses before the unit's one reduce_grads. Each block's q, k and v
// projections are one tensor (qkv: q's rows, then k's, then v's) and its gate
// and up projections another (gate_up: gate's rows, then up's): one product
// each. The Hugging Face bridge (llama/hf.hpp) splits and joins them.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/random.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/wrapper/options.hpp"

namespace llama {

//! Llama 3's rotary frequency scaling (rope_scaling {"rope_type": "llama3"}); factor 0: none.
struct rope_scaling {
  double factor = 0, low_freq_factor = 1, high_freq_factor = 4;
  int original_max_position = 8192;
  [[nodiscard]] bool on() const noexcept { return factor > 0; }
};

struct model_shape {
  int layers = 2, heads = 4, kv_heads = 2, d = 64, ffn = 176, vocab = 256, seq = 32;
  int max_seq = 0;   // positions the model was built for (0: seq); the rotary table has seq rows
  int head_dim_ = 0;  // 0: d / heads
  double rope_theta = 500000.0, norm_eps = 1e-5;
  rope_scaling scaling;
  bool tie_embeddings = false;

  [[nodiscard]] int head_dim() const noexcept { return head_dim_ > 0 ? head_dim_ : d / heads; }
  [[nodiscard]] int q_dim() const noexcept { return heads * head_dim(); }
  [[nodiscard]] int kv_dim() const noexcept { return kv_heads * head_dim(); }
  [[nodiscard]] int qkv_dim() const noexcept { return q_dim() + 2 * kv_dim(); }
  [[nodiscard]] int padded_vocab() const noexcept { return (vocab + 127) / 128 * 128; }
  [[nodiscard]] int positions() const noexcept { return max_seq > 0 ? max_seq : seq; }
  [[nodiscard]] std::size_t block_params() const noexcept {
    const std::size_t D = std::size_t(d);
    return 2 * D + std::size_t(qkv_dim()) * D + D * std::size_t(q_dim()) + 3 * std::size_t(ffn) * D;
  }
  //! Every parameter, the padded rows of the tables included.
  [[nodiscard]] std::size_t params() const noexcept {
    const std::size_t table = std::size_t(padded_vocab()) * std::size_t(d);
    return table * (tie_embeddings ? 1 : 2) + std::size_t(d) + std::size_t(layers) * block_params();
  }
  //! Forward + backward FLOPs per token: 6 per weight of the matmuls (the head
  //! over the real vocabulary) plus attention's 12 L T (H hd) (PaLM's count,
  //! causal halves not taken off), as torchtitan reports MFU.
  [[nodiscard]] double flops_per_token() const noexcept {
    const double D = d, matmul = double(qkv_dim()) * D + D * q_dim() + 3.0 * ffn * D;
    return 6.0 * (layers * matmul + double(vocab) * D) + 12.0 * layers * double(seq) * q_dim();
  }
};

//! The published sizes (vocabulary 128256, rope_theta 500000, rms_norm_eps
//! 1e-5, Llama 3's scaling from 8192 positions), at --seq 2048.
inline bool preset(const std::string& name, model_shape& s) {
  struct p {
    const char* name;
    int layers, heads, kv_heads, d, ffn;
    double factor;
    bool tie;
    int positions;
  };
  for (const p& x : {p{"llama3.2-1b", 16, 32, 8, 2048, 8192, 32.0, true, 131072},
                     p{"llama3.2-3b", 28, 24, 8, 3072, 8192, 32.0, true, 131072},
                     p{"llama3.1-8b", 32, 32, 8, 4096, 14336, 8.0, false, 131072}})
    if (name == x.name) {
      s.layers = x.layers, s.heads = x.heads, s.kv_heads = x.kv_heads, s.d = x.d, s.ffn = x.ffn;
      s.vocab = 128256, s.seq = 2048, s.max_seq = x.positions, s.head_dim_ = 0;
      s.rope_theta = 500000.0, s.norm_eps = 1e-5, s.tie_embeddings = x.tie;
      s.scaling = {x.factor, 1.0, 4.0, 8192};
      return true;
    }
  return false;
}

//! What is wrong with a shape ("" when nothing), in the flags' terms.
inline std::string shape_error(const model_shape& s) {
  if (s.heads < 1 || s.kv_heads < 1 || s.heads % s.kv_heads != 0)
    return "--kv-heads " + std::to_string(s.kv_heads) + " does not divide --heads " + std::to_string(s.heads);
  if (s.head_dim_ == 0 && s.d % s.heads != 0)
    return "--heads " + std::to_string(s.heads) + " does not divide --d " + std::to_string(s.d);
  if (s.head_dim() % 2 != 0) return "the head dimension " + std::to_string(s.head_dim()) + " is odd (rotary pairs need it even)";
  if (s.seq > s.positions())
    return "--seq " + std::to_string(s.seq) + " is longer than the model's " + std::to_string(s.positions()) + " positions";
  if (!(s.rope_theta > 0) || !std::isfinite(s.rope_theta)) return "--rope-theta must be a positive number";
  if (!(s.norm_eps > 0) || !(s.norm_eps < 1)) return "the RMSNorm epsilon must lie in (0, 1)";
  if (s.scaling.on() && (!(s.scaling.high_freq_factor > s.scaling.low_freq_factor) || s.scaling.original_max_position < 1))
    return "Llama 3 rope scaling needs high_freq_factor > low_freq_factor and original_max_position_embeddings >= 1";
  return {};
}

//! The shape from the command line, as tessera-llama and tessera-plan read
//! it: `s` holds the flags' values and given(flag) says whether a flag was on
//! the command line. A preset sets the architecture (giving one of its flags
//! too is an error), and the vocabulary and --seq where those are absent.
template <class Given>
[[nodiscard]] std::string resolve_shape(const std::string& preset_name, model_shape& s, Given&& given) {
  if (!preset_name.empty()) {
    model_shape p;
    if (!preset(preset_name, p)) return "--model " + preset_name + " is not a Llama 3 size";
    for (const char* f : {"--layers", "--heads", "--kv-heads", "--d", "--ffn", "--rope-theta", "--tie-embeddings"})
      if (given(f)) return "--model " + preset_name + " sets " + f + "; drop one of them";
    const model_shape flags = s;
    s = p;
    if (given("--vocab")) s.vocab = flags.vocab;
    if (given("--seq")) s.seq = flags.seq;
  }
  return shape_error(s);
}

struct block_ids {
  tessera::unit_id unit;
  tessera::param_id attn_norm, qkv, o, ffn_norm, gate_up, down;
};
struct model_ids {
  tessera::unit_id embed;
  tessera::param_id tok, norm, head;  // head: the tok table where tied
  std::vector<block_ids> blocks;
  bool tied = false;
};

//! One block's parameters as pointers into its gathered unit `w`.
template <class T>
struct block_weights {
  const T *attn_norm, *qkv, *o, *ffn_norm, *gate_up, *down;
};
template <class T, class Wrapper>
block_weights<T> weights_of(const Wrapper& m, const block_ids& b, const T* w) {
  auto at = [&](tessera::param_id p) { return w + m.slot(p).offset; };
  return {at(b.attn_norm), at(b.qkv), at(b.o), at(b.ffn_norm), at(b.gate_up), at(b.down)};
}

//! Registers the model. Weight decay on 2-D weights only (the matrices and
//! the tables), not on the norms.
template <class Wrapper>
model_ids register_model(Wrapper& m, const model_shape& s) {
  using tessera::shape;
  const std::int64_t d = s.d, V = s.padded_vocab();
  model_ids ids;
  ids.tied = s.tie_embeddings;
  ids.embed = m.add_unit("embed");
  ids.tok = m.add_param(ids.embed, "tok", shape({V, d}));
  ids.norm = m.add_param(ids.embed, "norm", shape({d}), false);
  ids.head = s.tie_embeddings ? ids.tok : m.add_param(ids.embed, "head", shape({V, d}));
  for (int l = 0; l < s.layers; ++l) {
    block_ids b;
    b.unit = m.add_unit("block" + std::to_string(l));
    b.attn_norm = m.add_param(b.unit, "attn_norm", shape({d}), false);
    b.qkv = m.add_param(b.unit, "qkv", shape({s.qkv_dim(), d}));
    b.o = m.add_param(b.unit, "o", shape({d, s.q_dim()}));
    b.ffn_norm = m.add_param(b.unit, "ffn_norm", shape({d}), false);
    b.gate_up = m.add_param(b.unit, "gate_up", shape({2 * std::int64_t(s.ffn), d}));
    b.down = m.add_param(b.unit, "down", shape({d, std::int64_t(s.ffn)}));
    ids.blocks.push_back(b);
  }
  return ids;
}

//! Hugging Face's initialisation (initializer_range 0.02) through the
//! library's counter-based initializer: N(0, 0.02) matrices and tables (their
//! padded rows zero), norms 1. The same bits at every world size, strategy
//! and wrapper.
template <class Wrapper>
void init_model(Wrapper& m, const model_ids& ids, const model_shape& s, std::uint64_t seed) {
  using namespace tessera;
  const init::normal w{.seed = seed, .stdev = 0.02};
  const init::constant one{1.0};
  const init::first<init::normal> table{w, std::size_t(s.vocab) * std::size_t(s.d)};  // padded rows stay zero
  m.init_param(ids.tok, table);
  if (!ids.tied) m.init_param(ids.head, table);
  m.init_param(ids.norm, one);
  for (const block_ids& b : ids.blocks) {
    m.init_param(b.attn_norm, one), m.init_param(b.ffn_norm, one);
    m.init_param(b.qkv, w), m.init_param(b.o, w), m.init_param(b.gate_up, w), m.init_param(b.down, w);
  }
}

}  // namespace llama
