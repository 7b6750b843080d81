#pragma once
// A Hugging Face LlamaForCausalLM directory's configuration as tessera-llama's
// shape: the fields Tessera computes are read (transformers 4's rope_theta and
// rope_scaling or 5's rope_parameters), and a field that asks for anything
// else (biases, a sliding window, experts, another rotary scaling, another
// activation) is one tessera error naming it, never a model that silently
// differs from the one the directory holds.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "llama/hf_table.hpp"
#include "llama/model.hpp"
#include "tessera/core/error.hpp"
#include "trainer_kit/hf.hpp"

namespace llama {

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
  const auto number = [&](const nlohmann::json& o, const char* k, const std::string& name) -> double {
    if (!o.contains(k) || !o[k].is_number()) fail(name, "is missing or not a number");
    return o[k].get<double>();
  };
  if (c.value("model_type", std::string()) != "llama") fail("model_type", "is not \"llama\" (this bridge reads LlamaForCausalLM)");
  if (c.contains("architectures") && c["architectures"].is_array())
    for (const auto& a : c["architectures"])
      if (a != "LlamaForCausalLM" && a != "LlamaModel") fail("architectures", "names " + a.dump() + ", not LlamaForCausalLM");
  if (c.value("hidden_act", std::string("silu")) != "silu") fail("hidden_act", "is not \"silu\" (the SwiGLU MLP Tessera computes)");
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (c.contains(k) && c[k].is_boolean() && c[k].get<bool>()) fail(k, "is true: Tessera's Llama has no biases");
  for (const char* k : {"sliding_window", "num_local_experts", "num_experts", "moe_intermediate_size"})
    if (c.contains(k) && !c[k].is_null() && !(c[k].is_number() && c[k].get<double>() == 0))
      fail(k, "is set: Tessera's Llama has no " + std::string(k[0] == 's' ? "sliding window" : "experts"));
  model_shape s;
  s.layers = integer("num_hidden_layers", 1), s.d = integer("hidden_size", 2), s.heads = integer("num_attention_heads", 1);
  s.kv_heads = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null() ? integer("num_key_value_heads", 1)
                                                                                         : s.heads;
  s.ffn = integer("intermediate_size", 1), s.vocab = integer("vocab_size", 2);
  s.max_seq = c.contains("max_position_embeddings") ? integer("max_position_embeddings", 1) : 0;
  if (c.contains("head_dim") && !c["head_dim"].is_null()) {
    s.head_dim_ = integer("head_dim", 2);
    if (s.head_dim_ == s.d / s.heads && s.d % s.heads == 0) s.head_dim_ = 0;
  }
  s.norm_eps = c.contains("rms_norm_eps") ? number(c, "rms_norm_eps", "rms_norm_eps") : 1e-6;  // LlamaConfig's default
  s.tie_embeddings = c.value("tie_word_embeddings", false);
  // The rotary embedding: transformers 5's rope_parameters, or 4's rope_theta and rope_scaling.
  const bool v5 = c.contains("rope_parameters") && c["rope_parameters"].is_object();
  const nlohmann::json rope = v5 ? c["rope_parameters"]
                              : (c.contains("rope_scaling") && c["rope_scaling"].is_object() ? c["rope_scaling"]
                                                                                             : nlohmann::json::object());
  const std::string rope_field = v5 ? "rope_parameters" : "rope_scaling";
  s.rope_theta = v5 && rope.contains("rope_theta") ? number(rope, "rope_theta", "rope_parameters.rope_theta")
                 : c.contains("rope_theta")      ? number(c, "rope_theta", "rope_theta")
                                                 : 10000.0;
  const std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
  if (type == "llama3") {
    s.scaling.factor = number(rope, "factor", rope_field + ".factor");
    s.scaling.low_freq_factor = number(rope, "low_freq_factor", rope_field + ".low_freq_factor");
    s.scaling.high_freq_factor = number(rope, "high_freq_factor", rope_field + ".high_freq_factor");
    s.scaling.original_max_position = int(number(rope, "original_max_position_embeddings",
                                                 rope_field + ".original_max_position_embeddings"));
  } else if (type != "default") {
    fail(rope_field + ".rope_type", "is \"" + type + "\"; Tessera computes the default rotary embedding and Llama 3's "
         "scaling (\"llama3\")");
  }
  if (seq > 0) s.seq = seq;
  if (const std::string e = shape_error(s); !e.empty()) throw tessera::error(where + ": " + e);
  return s;
}

//! The conversion table for a shape (trainer_kit::hf::mapping rows).
inline std::vector<trainer_kit::hf::mapping> hf_table(const model_shape& s) {
  return trainer_kit::hf::expand_table(hf_table_json, s.layers, s.tie_embeddings);
}

}  // namespace llama
