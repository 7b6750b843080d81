#pragma once
// Command line of tessera-gpt. Flags mean what they mean in tessera-mlp-lm
// where both have them; the flag names are an interface (scripts, tests and
// docs/trainers.md rely on them).
#include <CLI/CLI.hpp>

#include "trainer_kit/cli.hpp"

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

struct options {
  std::string backend = "host", wrapper = "fsdp", strategy = "optim_grads_params", precision = "fp32";
  std::string model;  // a preset name, or "" for --layers/--heads/--d/--seq/--vocab
  model_shape shape{};
  int batch = 4, steps = 50, accum = 1, log_every = 10, warmup = 0, val_every = 0, val_batches = 4, sample = 0;
  double lr = 6e-4, min_lr = 0, clip = 1.0, weight_decay = 0.1;
  double timeout = -1;  // seconds; < 0: the library's default
  std::string order_check = "auto";
  std::string attention = "auto";  // the CUDA net's, in bf16: auto, cudnn, flash, exact
  // tessera::step_graph: auto, on, off. Off by default: 0.999x / 0.990x of eager steps at 124M and
  // 1.5B on an H100 (bench/RESULTS.md), where the MLP trainer's small steps gain from it.
  std::string cuda_graphs = "off";
  std::string shard_group, outer = "no_shard";  // mesh: "" = flat world, "node", or S ranks per shard group
  std::uint64_t seed = 1;
  std::string data, val_data, save, load, dump_weights;
  int save_every = 0, keep = 0;
  bool json = false, recompute = false, text = false;
  bool keep_gelu = false;  // net_options::keep_gelu
  // --deterministic: exact_reduction; --accum then counts the global batch's
  // micro-batches of --batch sequences, rank r running r, r + N, ...
  bool deterministic = false;
};

//! Parses argv into o. Returns -1 to continue, else the exit code (0 after --help).
//! Errors print one line starting with "tessera:" to stderr and return 2.
inline int parse(int argc, char** argv, options& o) {
  CLI::App app{"tessera-gpt: GPT-2 trained with Tessera's sharded data parallelism"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--backend", o.backend, "host (CPU buffers, CBLAS) or cuda (a GPU per rank; NCCL, or MPI staged "
                                         "through host memory where ranks share a GPU)")
      ->check(CLI::IsMember({"host", "cuda"}));
  trainer_kit::add_parallel_options(app, o.wrapper, o.strategy, o.precision);
  trainer_kit::add_mesh_options(app, o.shard_group, o.outer);
  app.add_flag("--deterministic", o.deterministic,
               "the same bits at any world size, strategy, wrapper and mesh: exact (fixed-point) gradient and norm "
               "sums, and fixed micro-batches (--accum then counts the global batch's micro-batches of --batch "
               "sequences; the world size must divide it). On the GPU every kernel sums in a fixed order too (--d a "
               "multiple of 4 up to 2048), and the products run fused where cuBLASLt can, untimed");
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
  app.add_option("--batch", o.batch, "sequences per micro-batch per rank")->check(CLI::Range(1, 1 << 20));
  app.add_option("--accum", o.accum, "micro-batches per step and rank (--deterministic: over all ranks)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--steps", o.steps, "optimizer steps (the total, counting steps a --load resumes past)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--lr", o.lr, "AdamW peak learning rate")->check(CLI::PositiveNumber);
  app.add_option("--min-lr", o.min_lr, "cosine schedule's final learning rate (after --warmup steps of linear warm-up)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", o.warmup, "linear learning-rate warm-up steps")->check(CLI::NonNegativeNumber);
  app.add_option("--clip", o.clip, "global gradient-norm clip, 0 for none")->check(CLI::NonNegativeNumber);
  app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (2-D weights only)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, "seed of initialisation and batch sampling");
  app.add_option("--data", o.data,
                 "llm.c / nanoGPT token shards: a file or a glob (default: the text of Debian's fortunes package, as bytes)");
  app.add_flag("--text", o.text, "--data and --val-data are plain text files, tokenised as bytes (--vocab 256)");
  app.add_option("--val-data", o.val_data, "validation shards (a file or a glob; text with --text)");
  app.add_option("--val-every", o.val_every, "evaluate on --val-data every N steps (and after the last)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--val-batches", o.val_batches, "global batches of the fixed validation set")->check(CLI::Range(1, 1 << 20));
  app.add_option("--attention", o.attention,
                 "--backend cuda: auto (cuDNN's fused attention where this build has cuDNN and it runs the shape, "
                 "else flash), cudnn, flash (ours, bf16 tensor cores) or exact (ours, fp32 arithmetic)")
      ->check(CLI::IsMember({"auto", "cudnn", "flash", "exact"}));
  app.add_option("--cuda-graphs", o.cuda_graphs,
                 "--backend cuda: each step after the first two as one CUDA graph launch (tessera::step_graph). auto: "
                 "where it can (one rank; not --deterministic with several micro-batches per rank); on: the same, an "
                 "error where it cannot; off (the default: GPT-2's steps are long enough that graphs do not pay): "
                 "every kernel issued one by one")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_flag("--recompute", o.recompute, "keep each block's input only; recompute the block in backward (less memory)");
  app.add_flag("--keep-gelu", o.keep_gelu,
               "--backend cuda: keep every block's GELU output for backward instead of recomputing it there (one "
               "element-wise pass a block less; batch x seq x 4 d more bytes of the compute type a block). Nothing "
               "to keep with --recompute, whose forward in backward makes it anyway");
  app.add_option("--log-every", o.log_every, "log every N steps")->check(CLI::Range(1, 1 << 30));
  app.add_option("--save", o.save, "write a checkpoint under this directory at the end (and every --save-every steps)");
  app.add_option("--save-every", o.save_every, "also checkpoint every N steps")->check(CLI::NonNegativeNumber);
  app.add_option("--keep", o.keep, "keep only the newest K checkpoints under --save (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--load", o.load, "resume from this checkpoint, or the newest complete one under this directory");
  app.add_option("--dump-weights", o.dump_weights, "write the final weights as one safetensors file (rank 0)");
  app.add_option("--sample", o.sample, "after training, generate N tokens from the data's first tokens and print them")
      ->check(CLI::Range(0, 1 << 16));
  app.add_flag("--json", o.json, "one JSON object per logged step on rank 0, and a summary line");
  app.add_option("--timeout", o.timeout,
                 "seconds a rank may wait in one collective before the job ends with the collective named (0: never; "
                 "default 600 or TESSERA_TIMEOUT_S)")
      ->check(CLI::Range(0.0, 1e7));
  app.add_option("--order-check", o.order_check, "check before each collective that every rank issues the same one")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  if (const int rc = trainer_kit::parse_command_line(app, argc, argv); rc >= 0) return rc;
  const auto bad = trainer_kit::bad_option;
  if (const std::string e = resolve_shape(o.model, o.shape, [&](const char* f) { return app.count(f) > 0; }); !e.empty())
    return bad(e);
  // NaN passes every range check (each comparison is false) and would turn the watchdog off.
  if (std::isnan(o.timeout)) return bad("--timeout nan is not a number of seconds (0 turns the watchdog off)");
  if (!std::isfinite(o.lr) || o.lr > 10) return bad("--lr " + std::to_string(o.lr) + " is not a learning rate (0 < lr <= 10)");
  if (!std::isfinite(o.min_lr) || o.min_lr > o.lr) return bad("--min-lr must be finite and at most --lr");
  if (!std::isfinite(o.clip) || !std::isfinite(o.weight_decay) || o.weight_decay > 10)
    return bad("--clip and --weight-decay must be finite (and --weight-decay at most 10)");
  if ((o.text || o.data.empty()) && o.shape.vocab < 256)
    return bad("byte-level text needs --vocab 256 or more (it is " + std::to_string(o.shape.vocab) + ")");
  if (o.steps == 0 && o.save.empty() && o.dump_weights.empty())
    return bad("--steps 0 trains nothing; give --save DIR (the initial checkpoint) or --dump-weights FILE");
  if (app.count("--load") && o.load.empty()) return bad("--load needs a path");
  if (app.count("--save") && o.save.empty()) return bad("--save needs a path");
  if (o.save_every > 0 && o.save.empty()) return bad("--save-every needs --save DIR");
  if (o.val_every > 0 && o.val_data.empty()) return bad("--val-every needs --val-data");
  if (const std::string e = trainer_kit::mesh_options_error(o.shard_group, o.outer, o.wrapper, o.strategy); !e.empty())
    return bad(e);
  if (o.attention != "auto" && o.backend != "cuda") return bad("--attention chooses the CUDA net's kernels; give --backend cuda");
  if (o.cuda_graphs == "on" && o.backend != "cuda") return bad("--cuda-graphs on needs --backend cuda");
  if (o.keep_gelu && o.backend != "cuda") return bad("--keep-gelu keeps the CUDA net's GELU outputs; give --backend cuda");
  if (o.deterministic && o.backend == "cuda" && !workspace::layernorm_ordered_fits(o.shape.d))
    return bad(workspace::layernorm_ordered_refusal(o.shape.d));
  if (!tessera::wrapper_supports(o.wrapper, o.strategy))
    return bad(o.wrapper == "ddp" ? "--wrapper ddp cannot shard parameters; use --wrapper fsdp or fsdp2 for optim_grads_params"
                                   : "--wrapper fsdp2 runs optim_grads_params only; use --wrapper fsdp or ddp for " + o.strategy);
  return -1;
}

//! Every option as "name=value" lines, for the agreement across ranks.
inline std::string describe(const options& o) {
  trainer_kit::option_lines put;
  put("backend", o.backend), put("wrapper", o.wrapper), put("strategy", o.strategy), put("precision", o.precision);
  put("model", o.model), put("layers", o.shape.layers), put("heads", o.shape.heads), put("d", o.shape.d);
  put("seq", o.shape.seq), put("max-seq", o.shape.max_seq), put("vocab", o.shape.vocab), put("batch", o.batch);
  put("accum", o.accum), put("steps", o.steps), put("lr", o.lr), put("min-lr", o.min_lr), put("warmup", o.warmup);
  put("clip", o.clip), put("weight-decay", o.weight_decay), put("seed", o.seed), put("data", o.data);
  put("text", o.text), put("val-data", o.val_data), put("val-every", o.val_every), put("val-batches", o.val_batches);
  put("recompute", o.recompute), put("keep-gelu", o.keep_gelu), put("log-every", o.log_every), put("save", o.save);
  put("save-every", o.save_every);
  put("keep", o.keep), put("load", o.load), put("dump-weights", o.dump_weights), put("sample", o.sample);
  put("json", o.json), put("timeout", o.timeout), put("order-check", o.order_check);
  put("shard-group", o.shard_group), put("outer", o.outer), put("deterministic", o.deterministic);
  put("attention", o.attention), put("cuda-graphs", o.cuda_graphs);
  return put.text;
}

}  // namespace gpt
