#pragma once
// Llama's tensors under Hugging Face's names (LlamaForCausalLM), one table
// read by tessera-llama's --init-from (trainer_kit/hf.hpp) and by
// tools/hf_import.py and tools/hf_export.py, which parse the JSON between the
// raw string's delimiters below: import and export cannot disagree.
// Linear weights are [out, in] on both sides (no transposes); qkv stacks
// q_proj, k_proj and v_proj, gate_up stacks gate_proj and up_proj; the
// tables' rows past the real vocabulary are zero here and absent there; a
// tied head is the embedding (no lm_head.weight).
namespace llama {

inline constexpr const char* hf_table_json = R"json({
  "model": "llama",
  "architecture": "LlamaForCausalLM",
  "prefix": "model.",
  "tensors": [
    {"tessera": "embed.tok", "hf": ["model.embed_tokens.weight"], "pad_rows": true},
    {"tessera": "embed.norm", "hf": ["model.norm.weight"]},
    {"tessera": "embed.head", "hf": ["lm_head.weight"], "pad_rows": true, "untied": true},
    {"tessera": "block{i}.attn_norm", "hf": ["model.layers.{i}.input_layernorm.weight"]},
    {"tessera": "block{i}.qkv", "hf": ["model.layers.{i}.self_attn.q_proj.weight",
                                       "model.layers.{i}.self_attn.k_proj.weight",
                                       "model.layers.{i}.self_attn.v_proj.weight"]},
    {"tessera": "block{i}.o", "hf": ["model.layers.{i}.self_attn.o_proj.weight"]},
    {"tessera": "block{i}.ffn_norm", "hf": ["model.layers.{i}.post_attention_layernorm.weight"]},
    {"tessera": "block{i}.gate_up", "hf": ["model.layers.{i}.mlp.gate_proj.weight",
                                           "model.layers.{i}.mlp.up_proj.weight"]},
    {"tessera": "block{i}.down", "hf": ["model.layers.{i}.mlp.down_proj.weight"]}
  ],
  "ignore": ["model.layers.{i}.self_attn.rotary_emb.inv_freq", "lm_head.weight"]
})json";

}  // namespace llama
