#pragma once
// GPT-2's tensors under Hugging Face's names (GPT2LMHeadModel), one table read
// by tessera-gpt's --init-from (trainer_kit/hf.hpp) and by tools/hf_import.py
// and tools/hf_export.py, which parse the JSON between the raw string's
// delimiters below: import and export cannot disagree. GPT-2's Conv1D keeps
// its matrices [in, out], so every matrix is transposed; the token table's
// rows past the real vocabulary are zero here and absent there; the head is
// tied (no lm_head.weight); the attention's causal-mask buffers that older
// files hold carry no weights.
namespace gpt {

inline constexpr const char* hf_table_json = R"json({
  "model": "gpt2",
  "architecture": "GPT2LMHeadModel",
  "prefix": "transformer.",
  "tensors": [
    {"tessera": "embed.wte", "hf": ["transformer.wte.weight"], "pad_rows": true},
    {"tessera": "embed.wpe", "hf": ["transformer.wpe.weight"]},
    {"tessera": "embed.ln_f.w", "hf": ["transformer.ln_f.weight"]},
    {"tessera": "embed.ln_f.b", "hf": ["transformer.ln_f.bias"]},
    {"tessera": "block{i}.ln_1.w", "hf": ["transformer.h.{i}.ln_1.weight"]},
    {"tessera": "block{i}.ln_1.b", "hf": ["transformer.h.{i}.ln_1.bias"]},
    {"tessera": "block{i}.qkv.w", "hf": ["transformer.h.{i}.attn.c_attn.weight"], "transpose": true},
    {"tessera": "block{i}.qkv.b", "hf": ["transformer.h.{i}.attn.c_attn.bias"]},
    {"tessera": "block{i}.proj.w", "hf": ["transformer.h.{i}.attn.c_proj.weight"], "transpose": true},
    {"tessera": "block{i}.proj.b", "hf": ["transformer.h.{i}.attn.c_proj.bias"]},
    {"tessera": "block{i}.ln_2.w", "hf": ["transformer.h.{i}.ln_2.weight"]},
    {"tessera": "block{i}.ln_2.b", "hf": ["transformer.h.{i}.ln_2.bias"]},
    {"tessera": "block{i}.fc.w", "hf": ["transformer.h.{i}.mlp.c_fc.weight"], "transpose": true},
    {"tessera": "block{i}.fc.b", "hf": ["transformer.h.{i}.mlp.c_fc.bias"]},
    {"tessera": "block{i}.fc_proj.w", "hf": ["transformer.h.{i}.mlp.c_proj.weight"], "transpose": true},
    {"tessera": "block{i}.fc_proj.b", "hf": ["transformer.h.{i}.mlp.c_proj.bias"]}
  ],
  "ignore": ["lm_head.weight", "transformer.h.{i}.attn.bias", "transformer.h.{i}.attn.masked_bias"]
})json";

}  // namespace gpt
