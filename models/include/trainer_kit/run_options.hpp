#pragma once
// The options every reference trainer has, parsed, checked and described in
// one place: the parallel configuration (backend, wrapper, strategy,
// precision, mesh, --deterministic), the schedule (steps, accumulation,
// learning rate, warm-up and cosine decay, clipping, decay, seed), where the
// optimizer lives (overlap, offload), the files (data, checkpoints, the final
// weights), logging and the never-hang settings. A model's options derive from
// run_options and add their own flags after add_run_options; the loop
// (trainer_kit/loop.hpp) reads only these.
#include <CLI/CLI.hpp>

#include <cmath>
#include <filesystem>
#include <cstdint>
#include <string>

#include "trainer_kit/cli.hpp"
#include "trainer_kit/fp8_options.hpp"
#include "tessera/optim/sharded_optimizer.hpp"
#include "tessera/policy/config.hpp"

namespace trainer_kit {

struct run_options {
  // The parallel configuration.
  std::string backend = "host", wrapper = "fsdp", strategy = "optim_grads_params", precision = "fp32";
  std::string fp8_recipe = "current";  // --precision fp8's scaling: current or delayed (tessera::fp8::recipe)
  std::string shard_group, outer = "no_shard";  // mesh: "" = flat world, "node", or S ranks per shard group
  //! exact_reduction and fixed micro-batches: the same bits at any world size
  //! (how a micro-batch is fixed is the model's: its --accum or --micro-tokens).
  bool deterministic = false;
  // The schedule: linear warm-up to lr, then a cosine to min_lr at the last
  // step (min_lr < 0: lr held after the warm-up).
  int steps = 50, accum = 1, warmup = 0;
  double lr = 6e-4, min_lr = -1, clip = 1.0, weight_decay = 0.1;
  std::uint64_t seed = 1;
  // Where the optimizer runs (optimizer_options, wrapper_options::offload_optimizer).
  std::string overlap_updates = "on", offload_update = "device";
  double offload = 0;
  // Files: the data, checkpoints, initial and final weights.
  std::string data, save, load, dump_weights;
  std::string init_from;  // a Hugging Face directory (the model's bridge) or a Tessera checkpoint's weights
  int save_every = 0, keep = 0;
  // Logging, step graphs and the never-hang settings.
  int log_every = 10;
  bool json = false;
  std::string cuda_graphs = "auto";  // tessera::step_graph: auto, on, off
  double timeout = -1;               // seconds; < 0: the library's default (600, or TESSERA_TIMEOUT_S)
  std::string order_check = "auto";  // auto: on over MPI, off over NCCL
};

//! The learning rate of step t (1-based): linear warm-up over `warmup` steps,
//! then a cosine from lr down to min_lr at the last step; lr after the
//! warm-up where min_lr < 0.
inline double scheduled_lr(long t, double lr, double min_lr, int warmup, int steps) {
  if (warmup > 0 && t <= warmup) return lr * double(t) / double(warmup);
  if (min_lr < 0) return lr;
  const double span = std::max(1, steps - warmup);
  const double progress = std::min(1.0, double(t - warmup) / span);
  return min_lr + 0.5 * (1.0 + std::cos(3.141592653589793 * progress)) * (lr - min_lr);
}

//! Whether --init-from names a Hugging Face directory (it holds config.json)
//! rather than a Tessera checkpoint.
inline bool is_hf_directory(const std::string& path) {
  std::error_code ec;
  return !path.empty() && std::filesystem::is_regular_file(std::filesystem::path(path) / "config.json", ec);
}

//! The --offload-update value as the optimizer's option.
inline tessera::update_site update_site_of(const std::string& where) {
  return where == "host" ? tessera::update_site::host : tessera::update_site::device;
}

//! --offload-optimizer [F] (wrapper_options::offload_optimizer; no value: 1)
//! and --offload-update host|device (optimizer_options::offload_update), as
//! the trainers, tessera-bench-train and tessera-plan take them.
inline void add_offload_options(CLI::App& app, double& fraction, std::string& where) {
  app.add_option("--offload-optimizer", fraction,
                 "this fraction of the optimizer (main weights and AdamW state; the last units first) lives in host "
                 "memory; without a value: all of it")
      ->expected(0, 1)
      ->default_str("1")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--offload-update", where,
                 "where offloaded units update: host (the CPU's cores; PCIe carries gradients and bf16 weights) or "
                 "device (default: the GPU reading the host-resident state across PCIe; 2.8x faster on an H200 at 1B)")
      ->check(CLI::IsMember({"host", "device"}));
}

//! Registers every run option on `app`; a model changes a flag's words with
//! app.get_option("--accum")->description(...) where its meaning is the model's.
inline void add_run_options(CLI::App& app, run_options& o) {
  // A later flag overrides an earlier one, so scripts can append to a default command line.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--backend", o.backend, "host (CPU buffers, CBLAS) or cuda (a GPU per rank; NCCL, or MPI staged "
                                         "through host memory where ranks share a GPU)")
      ->check(CLI::IsMember({"host", "cuda"}));
  add_parallel_options(app, o.wrapper, o.strategy, o.precision);
  app.add_option("--fp8-recipe", o.fp8_recipe,
                 "--precision fp8's scales: current (each cast from the amax of what it casts) or delayed (from the "
                 "largest amax of the last 16 steps, over every rank; kept in checkpoints)")
      ->check(CLI::IsMember({"current", "delayed"}));
  add_mesh_options(app, o.shard_group, o.outer);
  app.add_flag("--deterministic", o.deterministic,
               "the same bits at any world size, strategy, wrapper and mesh: exact (fixed-point) gradient and norm "
               "sums, and fixed micro-batches, rank r running global micro-batches r, r + N, ...");
  app.add_option("--steps", o.steps, "optimizer steps (the total, counting steps a --load resumes past)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--accum", o.accum, "micro-batches per step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", o.lr, "AdamW peak learning rate")->check(CLI::PositiveNumber);
  app.add_option("--min-lr", o.min_lr,
                 "after --warmup steps of linear warm-up, a cosine from --lr down to this at the last step "
                 "(negative: --lr held)");
  app.add_option("--warmup", o.warmup, "linear learning-rate warm-up steps")->check(CLI::NonNegativeNumber);
  app.add_option("--clip", o.clip, "global gradient-norm clip, 0 for none")->check(CLI::NonNegativeNumber);
  app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (2-D weights only)")
      ->check(CLI::NonNegativeNumber);
  // CLI11 would wrap "-1" and clamp 2^64 into 2^64 - 1: both a seed the user did not write.
  app.add_option("--seed", o.seed, "seed of initialisation and batch sampling (0 to 2^64 - 1)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            const bool digits = !v.empty() && v.size() <= 20 && v.find_first_not_of("0123456789") == std::string::npos;
            if (!digits || (v.size() == 20 && v > "18446744073709551615"))
              return "--seed " + v + " is not a whole number from 0 to 18446744073709551615";
            return {};
          },
          "UINT64"));
  app.add_option("--overlap-updates", o.overlap_updates,
                 "on: each unit's optimizer update runs in the next forward's shadow, just before the unit is needed "
                 "(a side stream on the cuda backend); off: every update at the end of the step")
      ->check(CLI::IsMember({"on", "off"}));
  add_offload_options(app, o.offload, o.offload_update);
  app.add_option("--data", o.data, "training data");
  app.add_option("--save", o.save, "write a checkpoint under this directory at the end (and every --save-every steps)");
  app.add_option("--save-every", o.save_every, "also checkpoint every N steps")->check(CLI::NonNegativeNumber);
  app.add_option("--keep", o.keep, "keep only the newest K checkpoints under --save (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--load", o.load,
                 "resume from this checkpoint, or the newest complete one under this directory (any strategy, "
                 "wrapper, mesh and world size); --steps stays the total");
  app.add_option("--dump-weights", o.dump_weights, "write the final weights as one safetensors file (rank 0)");
  app.add_option("--init-from", o.init_from,
                 "start from these weights: a Hugging Face directory (config.json and model.safetensors, or shards under "
                 "model.safetensors.index.json; F32, BF16 or F16; its config.json sets the model's shape), or a Tessera "
                 "checkpoint (its weights, not its optimizer state or step); each rank reads only its shard's bytes");
  app.add_option("--log-every", o.log_every, "log every N steps")->check(CLI::Range(1, 1 << 30));
  app.add_flag("--json", o.json, "one JSON object per logged step on rank 0, and a summary line");
  app.add_option("--cuda-graphs", o.cuda_graphs,
                 "--backend cuda: each steady-state step as one CUDA graph launch (tessera::step_graph). auto: where "
                 "it can (one rank; not --deterministic with several micro-batches per rank; no offloaded optimizer); "
                 "on: the same, an error where it cannot; off: every kernel issued one by one")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--timeout", o.timeout,
                 "seconds a rank may wait in one collective before the job ends with the collective named and a trace "
                 "file per rank (0: never; default 600 or TESSERA_TIMEOUT_S)")
      ->check(CLI::Range(0.0, 1e7));
  app.add_option("--order-check", o.order_check, "check before each collective that every rank issues the same one (auto: on over MPI, off over NCCL)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
}

//! What is wrong with the run options once parsed ("" when nothing), in the
//! flags' terms; `app` tells which flags were given.
inline std::string run_options_error(const CLI::App& app, const run_options& o) {
  // NaN passes every range check (each comparison is false) and would turn the watchdog off.
  if (std::isnan(o.timeout)) return "--timeout nan is not a number of seconds (0 turns the watchdog off)";
  if (!std::isfinite(o.lr) || o.lr > 10) return "--lr " + std::to_string(o.lr) + " is not a learning rate (0 < lr <= 10)";
  if (!std::isfinite(o.min_lr) || o.min_lr > o.lr) return "--min-lr must be finite and at most --lr";
  if (!std::isfinite(o.clip) || !std::isfinite(o.weight_decay) || o.weight_decay > 10)
    return "--clip and --weight-decay must be finite (and --weight-decay at most 10)";
  if (o.steps == 0 && o.save.empty() && o.dump_weights.empty())
    return "--steps 0 trains nothing; give --save DIR (the initial checkpoint) or --dump-weights FILE";
  // An empty path would quietly mean "none": the default text, no file written.
  for (const char* f : {"--load", "--save", "--init-from", "--data", "--dump-weights"})
    if (app.count(f) && app.get_option(f)->as<std::string>().empty()) return std::string(f) + " needs a path";
  if (o.keep > 0 && o.save.empty()) return "--keep needs --save DIR (it retires this run's older checkpoints there)";
  if (!o.init_from.empty() && !o.load.empty())
    return "--init-from starts a new run from weights and --load resumes one: give one of them";
  if (o.save_every > 0 && o.save.empty()) return "--save-every needs --save DIR";
  if (o.cuda_graphs == "on" && o.backend != "cuda") return "--cuda-graphs on needs --backend cuda";
  if (const std::string e = mesh_options_error(o.shard_group, o.outer, o.wrapper, o.strategy); !e.empty()) return e;
  if (app.count("--fp8-recipe") && o.precision != "fp8") return "--fp8-recipe sets --precision fp8's scales; give --precision fp8";
  if (o.precision == "fp8" && o.backend != "host")
    return "--precision fp8 runs on the host backend so far (its fp8 products emulated bit for bit); the CUDA nets' "
           "fp8 GEMMs are not wired in yet (docs/fp8.md)";
  if (!tessera::wrapper_supports(o.wrapper, o.strategy))
    return o.wrapper == "ddp" ? "--wrapper ddp cannot shard parameters; use --wrapper fsdp or fsdp2 for optim_grads_params"
                              : "--wrapper fsdp2 runs optim_grads_params only; use --wrapper fsdp or ddp for " + o.strategy;
  return {};
}

//! --precision fp8's settings for a net (off under fp32 and bf16).
inline fp8_options fp8_of(const run_options& o) {
  return {.on = o.precision == "fp8", .scaling = {.kind = tessera::fp8::parse_recipe(o.fp8_recipe)}};
}

//! Every run option as "name=value" lines into `put`, for the agreement across ranks.
inline void describe_run_options(option_lines& put, const run_options& o) {
  put("backend", o.backend), put("wrapper", o.wrapper), put("strategy", o.strategy), put("precision", o.precision);
  put("fp8-recipe", o.fp8_recipe);
  put("shard-group", o.shard_group), put("outer", o.outer), put("deterministic", o.deterministic);
  put("steps", o.steps), put("accum", o.accum), put("warmup", o.warmup), put("lr", o.lr), put("min-lr", o.min_lr);
  put("clip", o.clip), put("weight-decay", o.weight_decay), put("seed", o.seed);
  put("overlap-updates", o.overlap_updates), put("offload-optimizer", o.offload), put("offload-update", o.offload_update);
  put("data", o.data), put("save", o.save), put("load", o.load), put("dump-weights", o.dump_weights);
  put("init-from", o.init_from);
  put("save-every", o.save_every), put("keep", o.keep), put("log-every", o.log_every), put("json", o.json);
  put("cuda-graphs", o.cuda_graphs), put("timeout", o.timeout), put("order-check", o.order_check);
}

}  // namespace trainer_kit
