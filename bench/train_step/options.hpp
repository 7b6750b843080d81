#pragma once
// tessera-bench-train's command line: its options and their flags.
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "trainer_kit/run_options.hpp"

namespace tessera_bench::train_step {

struct bench_options {
  int layers = 8, d = 4096, ctx = 8, steps = 10, warmup = 3, accum = 1;
  long tokens = 8192;
  double clip = 1.0;
  int gemm_sms = -1, nccl_ctas = 0, gather_buffers = 2;  // gemm_sms -1: all SMs but nccl_ctas (see gpu_placement)
  std::string wire = "fp32";
  bool overlap = true, recompute_gelu = false, lend_grad_shards = false, copy_engine_gathers = false;
  std::vector<std::string> strategies{"no_shard", "optim", "optim_grads", "optim_grads_params"};
  std::string wrapper = "fsdp", json, comm = "auto";
  int shard_group = 0;          // > 0: a mesh of world / S replica groups x S ranks
  std::string outer = "no_shard";  // across its replica groups: no_shard (HSDP) or optim (HFSDP)
  std::string overlap_updates = "on";  // optimizer_options::overlap_updates
  double offload = 0;                  // wrapper_options::offload_optimizer
  std::string offload_update = "device";  // optimizer_options::offload_update
  std::string cuda_graphs = "auto";       // tessera::step_graph: auto (one rank, no offload), on, off
};

inline void add_options(CLI::App& app, bench_options& o) {
  app.add_option("--layers", o.layers);
  app.add_option("--d", o.d);
  app.add_option("--ctx", o.ctx);
  app.add_option("--tokens", o.tokens, "global tokens per step");
  app.add_option("--accum", o.accum, "micro-batches per step");
  app.add_option("--steps", o.steps, "timed steps (median reported)");
  app.add_option("--warmup", o.warmup, "untimed steps first");
  app.add_option("--clip", o.clip, "gradient-norm clip (0: none)");
  app.add_option("--strategies", o.strategies, "strategies to run")->delimiter(',');
  app.add_option("--wrapper", o.wrapper)->check(CLI::IsMember({"ddp", "fsdp", "fsdp2"}));
  app.add_option("--comm", o.comm)->check(CLI::IsMember({"auto", "nccl", "mpi"}));
  app.add_option("--shard-group", o.shard_group,
                 "a mesh: ranks per shard group (world = R replica groups x S); 0: the whole world, flat")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--outer", o.outer, "across the mesh's replica groups: no_shard (HSDP) or optim (HFSDP; fsdp, "
                                     "optim_grads_params)")
      ->check(CLI::IsMember({"no_shard", "optim"}));
  app.add_option("--json", o.json, "write results as JSON to this file");
  app.add_option("--overlap-updates", o.overlap_updates,
                 "on: each unit's update runs on a side stream in the next forward's shadow (optimizer_options::"
                 "overlap_updates); off: every update at the end of the step")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--cuda-graphs", o.cuda_graphs,
                 "each step after the first as one CUDA graph launch (tessera::step_graph; its phases are then not "
                 "timed apart). auto: on one rank without offload; on; off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  trainer_kit::add_offload_options(app, o.offload, o.offload_update);
  app.add_option("--gemm-sms", o.gemm_sms,
                 "SMs each GEMM is shaped for when collectives overlap it (0: all; -1: all but --nccl-ctas)");
  app.add_option("--gather-buffers", o.gather_buffers,
                 "gathered-unit buffers (optim_grads_params; 2: double buffering, the number of units: nothing "
                 "re-gathered in backward)");
  app.add_flag("--recompute-gelu", o.recompute_gelu, "keep each block's GELU input only, recompute its output in backward");
  app.add_flag("--lend-grad-shards", o.lend_grad_shards,
               "reduced gradient shards live in their unit's activations (wrapper_options::lend_grad_shards; --accum 1)");
  app.add_option("--wire", o.wire, "dtype gradients are reduced in: fp32, or bf16 (accumulated in fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--nccl-ctas", o.nccl_ctas, "most SMs an NCCL collective may hold (0: NCCL's choice)");
  app.add_flag("--copy-engine-gathers", o.copy_engine_gathers,
               "all-gathers on copy engines (nccl_options::copy_engine_gathers: symmetric windows, zero-CTA policy)");
  app.add_flag("!--no-overlap", o.overlap,
               "skip the compute-only and communication-only runs (several ranks) that give the overlap efficiency");
}

}  // namespace tessera_bench::train_step
