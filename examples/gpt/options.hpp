#pragma once
// Command line of tessera-gpt. Flags mean what they mean in tessera-mlp-lm
// where both have them; the flag names are an interface (scripts, tests and
// docs/trainers.md rely on them).
#include <CLI/CLI.hpp>

#include "trainer_kit/run_options.hpp"
#include "trainer_kit/sequence_lm.hpp"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

#include "gpt/model.hpp"
#include "gpt/workspace.hpp"
#include "tessera/policy/config.hpp"

namespace gpt {

//! The run's options (trainer_kit::run_options: backend, parallel
//! configuration, schedule, files, logging), a sequence model's
//! (trainer_kit::sequence_options: batch, text, validation, sampling) and
//! GPT-2's own.
struct options : trainer_kit::run_options, trainer_kit::sequence_options {
  std::string model;  // a preset name, or "" for --layers/--heads/--d/--seq/--vocab
  model_shape shape{};
  std::string attention = "auto";  // the CUDA net's, in bf16: auto, cudnn, flash, exact
  bool recompute = false;
  bool keep_gelu = false;  // net_options::keep_gelu
  options() {
    lr = 6e-4, min_lr = 0;  // nanoGPT's: a cosine down to 0
    // tessera::step_graph off by default: 0.999x / 0.990x of eager steps at 124M and
    // 1.5B on an H100 (bench/RESULTS.md), where the MLP trainer's small steps gain from it.
    cuda_graphs = "off";
  }
};

//! Parses argv into o. Returns -1 to continue, else the exit code (0 after --help).
//! Errors print one line starting with "tessera:" to stderr and return 2.
inline int parse(int argc, char** argv, options& o) {
  CLI::App app{"tessera-gpt: GPT-2 trained with Tessera's sharded data parallelism"};
  trainer_kit::add_run_options(app, o);
  app.get_option("--deterministic")
      ->description("the same bits at any world size, strategy, wrapper and mesh: exact (fixed-point) gradient and "
                    "norm sums, and fixed micro-batches (--accum then counts the global batch's micro-batches of "
                    "--batch sequences; the world size must divide it). On the GPU every kernel sums in a fixed order "
                    "too (--d a multiple of 4 up to 2048), and the products run fused where cuBLASLt can, untimed");
  app.get_option("--accum")->description("micro-batches per step and rank (--deterministic: over all ranks)");
  app.get_option("--data")->description(
      "llm.c / nanoGPT token shards: a file or a glob (default: the text of Debian's fortunes package, as bytes)");
  app.get_option("--cuda-graphs")
      ->description("--backend cuda: each step after the first two as one CUDA graph launch (tessera::step_graph). "
                    "auto: where it can (one rank; not --deterministic with several micro-batches per rank; no "
                    "offloaded optimizer); on: the same, an error where it cannot; off (the default: GPT-2's steps are "
                    "long enough that graphs do not pay): every kernel issued one by one");
  app.add_option("--model", o.model, "gpt2 (124M), gpt2-medium (350M), gpt2-large (774M) or gpt2-xl (1.5B); "
                                     "vocabulary 50257, context 1024 unless --vocab / --seq say otherwise")
      ->check(CLI::IsMember({"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"}));
  app.add_option("--layers", o.shape.layers, "transformer blocks")->check(CLI::Range(1, 1 << 10));
  app.add_option("--heads", o.shape.heads, "attention heads (divide --d)")->check(CLI::Range(1, 1 << 10));
  app.add_option("--d", o.shape.d, "model width")->check(CLI::Range(1, 1 << 16));
  app.add_option("--seq", o.shape.seq, "tokens per sequence (at most the position table's rows)")->check(CLI::Range(1, 1 << 16));
  app.add_option("--max-seq", o.shape.max_seq, "rows of the position table (default --seq)")->check(CLI::Range(0, 1 << 16));
  app.add_option("--vocab", o.shape.vocab, "vocabulary size (padded to a multiple of 128 in the token table)")
      ->check(CLI::Range(2, 65536));
  trainer_kit::add_sequence_options(app, o);
  app.add_option("--attention", o.attention,
                 "--backend cuda: auto (cuDNN's fused attention where this build has cuDNN and it runs the shape, "
                 "else flash), cudnn, flash (ours, bf16 tensor cores) or exact (ours, fp32 arithmetic)")
      ->check(CLI::IsMember({"auto", "cudnn", "flash", "exact"}));
  app.add_flag("--recompute", o.recompute, "keep each block's input only; recompute the block in backward (less memory)");
  app.add_flag("--keep-gelu", o.keep_gelu,
               "--backend cuda: keep every block's GELU output for backward instead of recomputing it there (one "
               "element-wise pass a block less; batch x seq x 4 d more bytes of the compute type a block). Nothing "
               "to keep with --recompute, whose forward in backward makes it anyway");
  if (const int rc = trainer_kit::parse_command_line(app, argc, argv); rc >= 0) return rc;
  const auto bad = trainer_kit::bad_option;
  if (trainer_kit::is_hf_directory(o.init_from))  // its config.json is the shape
    for (const char* f : {"--model", "--layers", "--heads", "--d", "--max-seq", "--vocab"})
      if (app.count(f)) return bad(std::string("--init-from ") + o.init_from + " sets the shape from its config.json; drop " + f);
  if (const std::string e = resolve_shape(o.model, o.shape, [&](const char* f) { return app.count(f) > 0; }); !e.empty())
    return bad(e);
  if (const std::string e = trainer_kit::run_options_error(app, o); !e.empty()) return bad(e);
  if (const std::string e = trainer_kit::sequence_options_error(o, o, o.shape.vocab); !e.empty()) return bad(e);
  if (o.attention != "auto" && o.backend != "cuda") return bad("--attention chooses the CUDA net's kernels; give --backend cuda");
  if (o.keep_gelu && o.backend != "cuda") return bad("--keep-gelu keeps the CUDA net's GELU outputs; give --backend cuda");
  if (o.deterministic && o.backend == "cuda" && !workspace::layernorm_ordered_fits(o.shape.d))
    return bad(workspace::layernorm_ordered_refusal(o.shape.d));
  return -1;
}

//! Every option as "name=value" lines, for the agreement across ranks.
inline std::string describe(const options& o) {
  trainer_kit::option_lines put;
  trainer_kit::describe_run_options(put, o);
  put("model", o.model), put("layers", o.shape.layers), put("heads", o.shape.heads), put("d", o.shape.d);
  put("seq", o.shape.seq), put("max-seq", o.shape.max_seq), put("vocab", o.shape.vocab);
  trainer_kit::describe_sequence_options(put, o);
  put("recompute", o.recompute), put("keep-gelu", o.keep_gelu), put("attention", o.attention);
  return put.text;
}

}  // namespace gpt
