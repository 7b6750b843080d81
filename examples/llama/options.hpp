#pragma once
// Command line of tessera-llama. The run's flags and a sequence model's are
// the trainer kit's (the same as tessera-gpt's); the architecture's are
// transformers' LlamaConfig under the names its fields have.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <string>

#include "llama/host_compute.hpp"
#include "llama/model.hpp"
#include "trainer_kit/run_options.hpp"
#include "trainer_kit/sequence_lm.hpp"

namespace llama {

struct options : trainer_kit::run_options, trainer_kit::sequence_options {
  std::string model;  // a preset name, or "" for the shape flags
  model_shape shape{};
  std::string attention = "auto";
  bool recompute = false;
  options() { lr = 3e-4, min_lr = 3e-5; }
};

//! Parses argv into o. Returns -1 to continue, else the exit code (0 after --help).
//! Errors print one line starting with "tessera:" to stderr and return 2.
inline int parse(int argc, char** argv, options& o) {
  CLI::App app{"tessera-llama: Llama 3 trained with Tessera's sharded data parallelism"};
  trainer_kit::add_run_options(app, o);
  app.get_option("--accum")->description("micro-batches per step and rank (--deterministic: over all ranks)");
  app.get_option("--data")->description(
      "llm.c token shards (Llama 3's 32-bit, or GPT-2's 16-bit): a file or a glob (default: the text of Debian's "
      "fortunes package, as bytes)");
  trainer_kit::add_sequence_options(app, o);
  app.add_option("--model", o.model, "llama3.2-1b, llama3.2-3b or llama3.1-8b (vocabulary 128256, --seq 2048 unless "
                                     "given); or the shape flags")
      ->check(CLI::IsMember({"llama3.2-1b", "llama3.2-3b", "llama3.1-8b"}));
  model_shape& s = o.shape;
  app.add_option("--layers", s.layers, "transformer blocks")->check(CLI::Range(1, 1 << 10));
  app.add_option("--heads", s.heads, "attention heads")->check(CLI::Range(1, 1 << 10));
  app.add_option("--kv-heads", s.kv_heads, "key and value heads (grouped-query attention; divides --heads)")
      ->check(CLI::Range(1, 1 << 10));
  app.add_option("--d", s.d, "model width")->check(CLI::Range(2, 1 << 16));
  app.add_option("--ffn", s.ffn, "the SwiGLU MLP's width (intermediate_size)")->check(CLI::Range(1, 1 << 18));
  app.add_option("--head-dim", s.head_dim_, "head dimension (default --d / --heads; even)")->check(CLI::Range(0, 1024));
  app.add_option("--vocab", s.vocab, "vocabulary size (padded to a multiple of 128 in the tables)")
      ->check(CLI::Range(2, 1 << 24));
  app.add_option("--seq", s.seq, "tokens per sequence")->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-seq", s.max_seq, "positions the model is built for (default --seq)")->check(CLI::Range(0, 1 << 24));
  app.add_option("--rope-theta", s.rope_theta, "rotary base (rope_theta)");
  app.add_option("--rope-factor", s.scaling.factor, "Llama 3 rope scaling's factor (0: no scaling)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rope-low-freq-factor", s.scaling.low_freq_factor, "Llama 3 rope scaling's low_freq_factor");
  app.add_option("--rope-high-freq-factor", s.scaling.high_freq_factor, "Llama 3 rope scaling's high_freq_factor");
  app.add_option("--rope-original-positions", s.scaling.original_max_position,
                 "Llama 3 rope scaling's original_max_position_embeddings")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--norm-eps", s.norm_eps, "RMSNorm's epsilon (rms_norm_eps)");
  app.add_flag("--tie-embeddings", s.tie_embeddings, "the head is the token table (Llama 3.2 1B and 3B)");
  app.add_option("--attention", o.attention,
                 "--backend cuda: auto (cuDNN's fused attention where this build has cuDNN and it runs the shape, "
                 "else exact), cudnn or exact (ours, fp32 arithmetic)")
      ->check(CLI::IsMember({"auto", "cudnn", "exact"}));
  app.add_flag("--recompute", o.recompute, "keep each block's input only; recompute the block in backward (less memory)");
  if (const int rc = trainer_kit::parse_command_line(app, argc, argv); rc >= 0) return rc;
  const auto bad = trainer_kit::bad_option;
  const auto given = [&app](const char* f) { return app.count(f) > 0; };
  if (const std::string e = resolve_shape(o.model, s, given); !e.empty()) return bad(e);
  if (trainer_kit::is_hf_directory(o.init_from))  // its config.json is the shape
    for (const char* f : {"--model", "--layers", "--heads", "--kv-heads", "--d", "--ffn", "--head-dim", "--vocab",
                          "--max-seq", "--rope-theta", "--rope-factor", "--rope-low-freq-factor", "--rope-high-freq-factor",
                          "--rope-original-positions", "--norm-eps", "--tie-embeddings"})
      if (app.count(f)) return bad(std::string("--init-from ") + o.init_from + " sets the shape from its config.json; drop " + f);
  if (const std::string e = trainer_kit::run_options_error(app, o); !e.empty()) return bad(e);
  if (const std::string e = trainer_kit::sequence_options_error(o, o, s.vocab); !e.empty()) return bad(e);
  if (o.attention != "auto" && o.backend != "cuda") return bad("--attention chooses the CUDA net's kernels; give --backend cuda");
  return -1;
}

//! Every option as "name=value" lines, for the agreement across ranks.
inline std::string describe(const options& o) {
  trainer_kit::option_lines put;
  trainer_kit::describe_run_options(put, o);
  trainer_kit::describe_sequence_options(put, o);
  const model_shape& s = o.shape;
  put("model", o.model), put("layers", s.layers), put("heads", s.heads);
  put("kv-heads", s.kv_heads), put("d", s.d), put("ffn", s.ffn), put("head-dim", s.head_dim_), put("vocab", s.vocab);
  put("seq", s.seq), put("max-seq", s.max_seq), put("rope-theta", s.rope_theta), put("rope-factor", s.scaling.factor);
  put("rope-low-freq-factor", s.scaling.low_freq_factor), put("rope-high-freq-factor", s.scaling.high_freq_factor);
  put("rope-original-positions", s.scaling.original_max_position), put("norm-eps", s.norm_eps);
  put("tie-embeddings", s.tie_embeddings), put("attention", o.attention), put("recompute", o.recompute);
  return put.text;
}

}  // namespace llama
