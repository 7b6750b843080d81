#pragma once
// Command line of tessera-mlp-lm. The flag names are an interface: scripts
// and tests rely on them.
#include <CLI/CLI.hpp>

#include "trainer_kit/run_options.hpp"

#include <cmath>
#include <cstdint>
#include <charconv>
#include <string>
#include <type_traits>

#include "tessera/policy/config.hpp"

namespace mlp_lm {

//! The run's options (trainer_kit::run_options: backend, parallel
//! configuration, schedule, files, logging) and the MLP's own.
struct options : trainer_kit::run_options {
  std::string comm = "auto", fusion = "auto";
  int layers = 2, d = 64, ctx = 8;
  long tokens = 1024;
  int gemm_sms = -1, nccl_ctas = 0;  // -1: the default for the communicator (see cuda_main.cuh)
  bool recompute_gelu = false, lend_grad_shards = false, copy_engine_gathers = false;
  // --deterministic: fixed micro-batches of micro_tokens tokens, rank r
  // taking micro-batches r, r + N, ... (accum is then their global count,
  // tokens / micro_tokens).
  long micro_tokens = 0;
  // --plan auto: the planner (mlp_lm/planning.hpp) picks wrapper, strategy,
  // mesh and memory savings for the world size, on this topology file
  // (empty: published 8xH200 figures), within gpu_memory GiB per GPU.
  std::string plan, topology;
  double gpu_memory = 0;
  options() { lr = 3e-3; }  // held after the warm-up (min_lr < 0)
};

//! Parses argv into o. Returns -1 to continue, else the exit code (0 after --help).
//! Errors print one line starting with "tessera:" to stderr.
inline int parse(int argc, char** argv, options& o) {
  CLI::App app{"tessera-mlp-lm: byte-level MLP language model trained with Tessera's sharded data parallelism"};
  trainer_kit::add_run_options(app, o);
  app.get_option("--deterministic")
      ->description("the same bits at any world size, strategy and wrapper: exact (fixed-point) gradient and norm "
                    "sums, and fixed micro-batches of --micro-tokens, rank r taking micro-batches r, r + N, ...");
  app.get_option("--accum")->description("micro-batches per step (divides --tokens)");
  app.get_option("--data")->description("train on the bytes of this file (default: generated text)");
  app.get_option("--weight-decay")->description("AdamW decoupled weight decay (not on biases, embeddings)");
  app.add_option("--comm", o.comm, "cuda backend: nccl (a GPU per rank), mpi (staged through host memory) or auto")
      ->check(CLI::IsMember({"auto", "nccl", "mpi"}));
  app.add_option("--fusion", o.fusion,
                 "cuda backend: fused cuBLASLt epilogues where they measure faster (auto), always (on), never (off)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--gemm-sms", o.gemm_sms,
                 "cuda backend: SMs each GEMM is shaped for (0: all; default: all but --nccl-ctas when NCCL overlaps)")
      ->check(CLI::Range(-1, 1 << 12));
  app.add_option("--nccl-ctas", o.nccl_ctas, "cuda backend: most SMs an NCCL collective may hold (0: NCCL's choice)")
      ->check(CLI::Range(0, 64));
  app.add_flag("--copy-engine-gathers", o.copy_engine_gathers,
               "cuda backend with NCCL: all-gathers on copy engines, no SMs (symmetric windows, zero-CTA policy)");
  app.add_flag("--recompute-gelu", o.recompute_gelu,
               "cuda backend: keep each block's GELU input only, recompute its output in backward (less memory)");
  app.add_flag("--lend-grad-shards", o.lend_grad_shards,
               "cuda backend: reduced gradient shards live in their own unit's activations between its backward and "
               "the next forward (less memory; --accum 1 under optim_grads and optim_grads_params)");
  app.add_option("--micro-tokens", o.micro_tokens,
                 "--deterministic: tokens per micro-batch (divides --tokens; the world size must divide the count)")
      ->check(CLI::Range(1L, 1L << 30));
  app.add_option("--plan", o.plan,
                 "auto: the planner picks --wrapper, --strategy, --shard-group, --outer, --copy-engine-gathers, "
                 "--recompute-gelu and --lend-grad-shards for this world size (the fastest predicted that fits "
                 "--gpu-memory; tessera-plan best shows the ranking)")
      ->check(CLI::IsMember({"auto"}));
  app.add_option("--topology", o.topology, "--plan auto: a topology JSON (tessera-plan calibrate writes one)");
  app.add_option("--gpu-memory", o.gpu_memory,
                 "--plan auto: GiB per GPU the configuration must fit (default: the GPU's memory less 2 GiB for the "
                 "CUDA context and NCCL; none on the host backend)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--layers", o.layers, "residual MLP blocks")->check(CLI::Range(0, 1 << 12));
  app.add_option("--d", o.d, "model width (a multiple of --ctx)")->check(CLI::Range(1, 1 << 16));
  app.add_option("--ctx", o.ctx, "previous bytes the model sees")->check(CLI::Range(1, 1 << 12));
  app.add_option("--tokens", o.tokens, "global batch in tokens per step, over all ranks")->check(CLI::Range(1L, 1L << 30));
  if (const int rc = trainer_kit::parse_command_line(app, argc, argv); rc >= 0) return rc;
  const auto bad = trainer_kit::bad_option;
  if (const std::string e = trainer_kit::run_options_error(app, o); !e.empty()) return bad(e);
  if (o.precision == "fp8")
    return bad("tessera-mlp-lm has no fp8 products; --precision fp8 is tessera-gpt's and tessera-llama's");
  if (o.backend == "host" && o.comm != "auto") return bad("--comm " + o.comm + " applies to --backend cuda only");
  if (o.backend == "host" && (o.recompute_gelu || o.copy_engine_gathers || o.gemm_sms >= 0 || o.nccl_ctas > 0))
    return bad("--recompute-gelu, --copy-engine-gathers, --gemm-sms and --nccl-ctas apply to --backend cuda only");
  if (o.d % o.ctx != 0) return bad("--d " + std::to_string(o.d) + " is not a multiple of --ctx " + std::to_string(o.ctx));
  if (o.tokens % o.accum != 0)
    return bad("--tokens " + std::to_string(o.tokens) + " does not split into --accum " + std::to_string(o.accum) +
               " equal micro-batches");
  if (o.micro_tokens > 0 && !o.deterministic) return bad("--micro-tokens applies to --deterministic only");
  if (o.deterministic) {
    if (o.micro_tokens <= 0) return bad("--deterministic needs --micro-tokens M (tokens per fixed micro-batch)");
    if (app.count("--accum")) return bad("--deterministic takes its micro-batches from --micro-tokens; drop --accum");
    if (o.tokens % o.micro_tokens != 0)
      return bad("--tokens " + std::to_string(o.tokens) + " does not split into micro-batches of --micro-tokens " +
                 std::to_string(o.micro_tokens));
    o.accum = int(o.tokens / o.micro_tokens);  // the global count; each rank runs accum / N of them
  }
  if (o.lend_grad_shards && o.backend != "cuda") return bad("--lend-grad-shards needs --backend cuda");
  // (--deterministic: --accum is then the global count; each rank's, accum / N, is checked by the wrapper.)
  if (o.lend_grad_shards && o.accum > 1 && !o.deterministic && (o.strategy == "optim_grads" || o.strategy == "optim_grads_params"))
    return bad("--lend-grad-shards holds one micro-batch's reduction; use --accum 1 with --strategy " + o.strategy);
  if (!o.plan.empty()) {
    for (const char* f : {"--wrapper", "--strategy", "--shard-group", "--outer", "--copy-engine-gathers", "--recompute-gelu",
                          "--lend-grad-shards"})
      if (app.count(f)) return bad(std::string("--plan auto chooses ") + f + " itself; drop it (or drop --plan)");
  } else if (app.count("--topology") || app.count("--gpu-memory")) {
    return bad("--topology and --gpu-memory apply to --plan auto only");
  }
  return -1;
}

//! --plan auto: sets the options the planner chooses for `world` ranks
//! (plan_auto.cpp); `gpu_bytes` is the limit where --gpu-memory is not
//! given (0: none). Returns a line saying what it chose and why.
std::string apply_plan_auto(options& o, int world, double gpu_bytes);

//! Every option as "name=value" lines: ranks compare it before training
//! (a flag given to one rank only would otherwise train inconsistently, or
//! fail deep inside a collective).
inline std::string describe(const options& o) {
  trainer_kit::option_lines put;
  trainer_kit::describe_run_options(put, o);
  put("comm", o.comm), put("fusion", o.fusion), put("layers", o.layers), put("d", o.d), put("ctx", o.ctx);
  put("tokens", o.tokens), put("gemm-sms", o.gemm_sms), put("nccl-ctas", o.nccl_ctas);
  put("recompute-gelu", o.recompute_gelu), put("lend-grad-shards", o.lend_grad_shards);
  put("copy-engine-gathers", o.copy_engine_gathers), put("micro-tokens", o.micro_tokens);
  put("plan", o.plan), put("topology", o.topology), put("gpu-memory", o.gpu_memory);
  return put.text;
}

}  // namespace mlp_lm
