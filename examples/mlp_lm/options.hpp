#pragma once
// Command line of tessera-mlp-lm. The flag names are an interface: scripts
// and tests rely on them.
#include <CLI/CLI.hpp>

#include "trainer_kit/cli.hpp"

#include <cmath>
#include <cstdint>
#include <charconv>
#include <string>
#include <type_traits>

#include "mlp_lm/offload_flags.hpp"
#include "tessera/policy/config.hpp"

namespace mlp_lm {

struct options {
  std::string backend = "host", comm = "auto", fusion = "auto", wrapper = "fsdp", strategy = "optim_grads_params", precision = "fp32";
  int layers = 2, d = 64, ctx = 8;
  long tokens = 1024;
  int steps = 50, accum = 1, log_every = 10, warmup = 0;
  double lr = 3e-3, clip = 1.0, weight_decay = 0.1;
  double timeout = -1;               // seconds; < 0: the library's default (600, or TESSERA_TIMEOUT_S)
  std::string order_check = "auto";  // auto: on over MPI, off over NCCL
  std::string overlap_updates = "on";  // optimizer_options::overlap_updates
  std::string cuda_graphs = "auto";    // tessera::step_graph: auto, on, off
  double offload = 0;                  // wrapper_options::offload_optimizer
  std::string offload_update = "device";  // optimizer_options::offload_update
  std::uint64_t seed = 1;
  std::string data, save, load, dump_weights;
  std::string shard_group, outer = "no_shard";  // mesh: "" = flat world, "node", or S ranks per shard group
  int save_every = 0, keep = 0;
  int gemm_sms = -1, nccl_ctas = 0;  // -1: the default for the communicator (see cuda_main.cuh)
  bool json = false, recompute_gelu = false, lend_grad_shards = false, copy_engine_gathers = false;
  // --deterministic: exact_reduction and fixed micro-batches of micro_tokens
  // tokens, rank r taking micro-batches r, r + N, ... (accum is then their
  // global count, tokens / micro_tokens).
  bool deterministic = false;
  long micro_tokens = 0;
  // --plan auto: the planner (mlp_lm/planning.hpp) picks wrapper, strategy,
  // mesh and memory savings for the world size, on this topology file
  // (empty: published 8xH200 figures), within gpu_memory GiB per GPU.
  std::string plan, topology;
  double gpu_memory = 0;
};

//! Parses argv into o. Returns -1 to continue, else the exit code (0 after --help).
//! Errors print one line starting with "tessera:" to stderr.
inline int parse(int argc, char** argv, options& o) {
  CLI::App app{"tessera-mlp-lm: byte-level MLP language model trained with Tessera's sharded data parallelism"};
  // A later flag overrides an earlier one, so scripts can append to a default command line.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--backend", o.backend, "host or cuda")->check(CLI::IsMember({"host", "cuda"}));
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
  app.add_option("--overlap-updates", o.overlap_updates,
                 "on: each unit's optimizer update runs in the next forward's shadow, just before the unit is needed "
                 "(a side stream on the cuda backend); off: every update at the end of the step")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--cuda-graphs", o.cuda_graphs,
                 "cuda backend: each steady-state step as one CUDA graph launch (tessera::step_graph). auto: where it "
                 "can (one rank; not --deterministic with several micro-batches; no offloaded optimizer); on: the "
                 "same, an error where it cannot; off: every kernel issued one by one")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  add_offload_options(app, o.offload, o.offload_update);
  app.add_flag("--deterministic", o.deterministic,
               "the same bits at any world size, strategy and wrapper: exact (fixed-point) gradient and norm sums, "
               "and fixed micro-batches of --micro-tokens, rank r taking micro-batches r, r + N, ...");
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
  trainer_kit::add_parallel_options(app, o.wrapper, o.strategy, o.precision);
  trainer_kit::add_mesh_options(app, o.shard_group, o.outer);
  app.add_option("--layers", o.layers, "residual MLP blocks")->check(CLI::Range(0, 1 << 12));
  app.add_option("--d", o.d, "model width (a multiple of --ctx)")->check(CLI::Range(1, 1 << 16));
  app.add_option("--ctx", o.ctx, "previous bytes the model sees")->check(CLI::Range(1, 1 << 12));
  app.add_option("--tokens", o.tokens, "global batch in tokens per step, over all ranks")->check(CLI::Range(1L, 1L << 30));
  app.add_option("--steps", o.steps, "optimizer steps")->check(CLI::Range(0, 1 << 30));
  app.add_option("--accum", o.accum, "micro-batches per step (divides --tokens)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", o.lr, "AdamW learning rate")->check(CLI::PositiveNumber);
  app.add_option("--clip", o.clip, "global gradient-norm clip, 0 for none")->check(CLI::NonNegativeNumber);
  app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (not on biases, embeddings)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup", o.warmup, "linear learning-rate warm-up steps")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, "seed of initialisation and batch sampling");
  app.add_option("--data", o.data, "train on the bytes of this file (default: generated text)");
  app.add_option("--log-every", o.log_every, "log every N steps")->check(CLI::Range(1, 1 << 30));
  app.add_option("--save", o.save, "write a checkpoint under this directory at the end (and every --save-every steps)");
  app.add_option("--save-every", o.save_every, "also checkpoint every N steps")->check(CLI::NonNegativeNumber);
  app.add_option("--keep", o.keep, "keep only the newest K checkpoints under --save (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--load", o.load,
                 "resume from this checkpoint, or the newest complete one under this directory (any strategy and "
                 "world size); --steps stays the total");
  app.add_option("--dump-weights", o.dump_weights, "write the final weights as one safetensors file (rank 0)");
  app.add_flag("--json", o.json, "one JSON object per logged step on rank 0, and a summary line");
  app.add_option("--timeout", o.timeout,
                 "seconds a rank may wait in one collective before the job ends with the collective named and a trace "
                 "file per rank (0: never; default 600 or TESSERA_TIMEOUT_S)")
      ->check(CLI::Range(0.0, 1e7));
  app.add_option("--order-check", o.order_check,
                 "check before each collective that every rank issues the same one (auto: on over MPI, off over NCCL)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  if (const int rc = trainer_kit::parse_command_line(app, argc, argv); rc >= 0) return rc;
  const auto bad = trainer_kit::bad_option;
  // NaN passes every range check (each comparison is false) and would turn the watchdog off.
  if (std::isnan(o.timeout)) return bad("--timeout nan is not a number of seconds (0 turns the watchdog off)");
  if (!std::isfinite(o.lr) || o.lr > 10) return bad("--lr " + std::to_string(o.lr) + " is not a learning rate (0 < lr <= 10)");
  if (!std::isfinite(o.clip) || !std::isfinite(o.weight_decay) || o.weight_decay > 10)
    return bad("--clip and --weight-decay must be finite (and --weight-decay at most 10)");
  if (o.steps < 0) return bad("--steps must not be negative (it is the total, counting steps a --load resumes past)");
  if (o.steps == 0 && o.save.empty() && o.dump_weights.empty())
    return bad("--steps 0 trains nothing; give --save DIR (the initial checkpoint) or --dump-weights FILE");
  if (app.count("--load") && o.load.empty()) return bad("--load needs a path");
  if (app.count("--save") && o.save.empty()) return bad("--save needs a path");
  if (o.backend == "host" && o.comm != "auto") return bad("--comm " + o.comm + " applies to --backend cuda only");
  if (o.backend == "host" && (o.recompute_gelu || o.copy_engine_gathers || o.gemm_sms >= 0 || o.nccl_ctas > 0))
    return bad("--recompute-gelu, --copy-engine-gathers, --gemm-sms and --nccl-ctas apply to --backend cuda only");
  if (o.d % o.ctx != 0) return bad("--d " + std::to_string(o.d) + " is not a multiple of --ctx " + std::to_string(o.ctx));
  if (o.tokens % o.accum != 0)
    return bad("--tokens " + std::to_string(o.tokens) + " does not split into --accum " + std::to_string(o.accum) +
               " equal micro-batches");
  if (o.save_every > 0 && o.save.empty()) return bad("--save-every needs --save DIR");
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
  if (o.cuda_graphs == "on" && o.backend != "cuda") return bad("--cuda-graphs on needs --backend cuda");
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
  if (const std::string e = trainer_kit::mesh_options_error(o.shard_group, o.outer, o.wrapper, o.strategy); !e.empty())
    return bad(e);
  if (!tessera::wrapper_supports(o.wrapper, o.strategy))
    return bad(o.wrapper == "ddp" ? "--wrapper ddp cannot shard parameters; use --wrapper fsdp or fsdp2 for optim_grads_params"
                                   : "--wrapper fsdp2 runs optim_grads_params only; use --wrapper fsdp or ddp for " + o.strategy);
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
  put("backend", o.backend), put("comm", o.comm), put("fusion", o.fusion), put("wrapper", o.wrapper);
  put("strategy", o.strategy), put("precision", o.precision), put("layers", o.layers), put("d", o.d);
  put("ctx", o.ctx), put("tokens", o.tokens), put("steps", o.steps), put("accum", o.accum);
  put("log-every", o.log_every), put("warmup", o.warmup), put("lr", o.lr), put("clip", o.clip);
  put("weight-decay", o.weight_decay), put("seed", o.seed), put("data", o.data), put("save", o.save);
  put("load", o.load), put("dump-weights", o.dump_weights), put("save-every", o.save_every), put("keep", o.keep);
  put("gemm-sms", o.gemm_sms), put("nccl-ctas", o.nccl_ctas), put("json", o.json);
  put("recompute-gelu", o.recompute_gelu), put("lend-grad-shards", o.lend_grad_shards);
  put("copy-engine-gathers", o.copy_engine_gathers), put("timeout", o.timeout), put("order-check", o.order_check);
  put("shard-group", o.shard_group), put("outer", o.outer), put("overlap-updates", o.overlap_updates);
  put("offload-optimizer", o.offload), put("offload-update", o.offload_update);
  put("deterministic", o.deterministic), put("micro-tokens", o.micro_tokens);
  put("plan", o.plan), put("topology", o.topology), put("gpu-memory", o.gpu_memory);
  put("cuda-graphs", o.cuda_graphs);
  return put.text;
}

}  // namespace mlp_lm
