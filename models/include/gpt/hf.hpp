#pragma once
// A Hugging Face GPT2LMHeadModel directory's configuration as tessera-gpt's
// shape. A field that asks for another network than the one Tessera computes
// (another activation or LayerNorm epsilon, an inner width other than 4 d,
// attention scaled by layer, cross-attention, an untied head) is one tessera
// error naming it.
#include <nlohmann/json.hpp>

#include <string>

#include "gpt/hf_table.hpp"
#include "gpt/model.hpp"
#include "tessera/core/error.hpp"
#include "trainer_kit/hf.hpp"

namespace gpt {

//! The shape a config.json describes, at `seq` tokens per sequence.
inline model_shape shape_from_hf(const nlohmann::json& c, const std::string& where, int seq) {
  const auto fail = [&](const std::string& field, const std::string& why) {
    throw tessera::error(where + ": config.json field '" + field + "' " + why);
  };
  const auto integer = [&](const char* k, long long lo) -> int {
    if (!c.contains(k) || !c[k].is_number_integer() || c[k].get<long long>() < lo || c[k].get<long long>() > (1LL << 30))
      fail(k, "is missing or not an integer of at least " + std::to_string(lo));
    return int(c[k].get<long long>());
  };
  if (c.value("model_type", std::string()) != "gpt2") fail("model_type", "is not \"gpt2\" (this bridge reads GPT2LMHeadModel)");
  const std::string act = c.value("activation_function", std::string("gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") fail("activation_function", "is \"" + act + "\"; Tessera's GPT-2 computes the tanh GELU (gelu_new)");
  if (c.contains("layer_norm_epsilon") && c["layer_norm_epsilon"] != 1e-5) fail("layer_norm_epsilon", "is not 1e-5");
  for (const char* k : {"scale_attn_by_inverse_layer_idx", "add_cross_attention"})
    if (c.value(k, false)) fail(k, "is true: Tessera's GPT-2 has no such attention");
  if (!c.value("tie_word_embeddings", true)) fail("tie_word_embeddings", "is false: Tessera's GPT-2 ties its head");
  model_shape s;
  s.layers = integer("n_layer", 1), s.heads = integer("n_head", 1), s.d = integer("n_embd", 1);
  s.vocab = integer("vocab_size", 2), s.max_seq = integer("n_positions", 1);
  if (c.contains("n_inner") && !c["n_inner"].is_null() && c["n_inner"] != 4 * s.d)
    fail("n_inner", "is not 4 n_embd (" + std::to_string(4 * s.d) + ")");
  s.seq = seq > 0 ? seq : s.max_seq;
  if (const std::string e = resolve_shape("", s, [](const char*) { return false; }); !e.empty())
    throw tessera::error(where + ": " + e);
  return s;
}

//! The conversion table for a shape (trainer_kit::hf::mapping rows).
inline std::vector<trainer_kit::hf::mapping> hf_table(const model_shape& s) {
  return trainer_kit::hf::expand_table(hf_table_json, s.layers, true);
}

}  // namespace gpt
