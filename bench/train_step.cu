// tessera-bench-train: one training step of the reference model
// (tessera-mlp-lm's byte-level MLP, bf16 compute, fp32 main weights and
// AdamW) per strategy, beside the floor of a step measured in the same run.
//
//   floor = every GEMM of forward and backward timed alone (cuBLASLt, bf16
//           operands, the trainer's output types, no epilogue)
//         + the optimizer's 28 bytes per parameter at the measured copy bandwidth
//
// Per strategy: ms/step (median), tokens/s, model TFLOP/s (6 x matmul
// parameters x tokens) beside a large bf16 GEMM's rate, the share of the
// floor, a breakdown (compute = forward + backward; exposed communication =
// waiting for gradient reductions after backward; optimizer), and peak
// device memory (library-counted, and the device's own count) beside the
// library's estimate. Run under mpirun for several ranks (NCCL when each
// rank has its own GPU, else MPI staged through host memory).
#include <cuda_runtime.h>
#include "tessera/comm/mpi_session.hpp"  // <mpi.h> without the C++ bindings (their casts warn)
#include <nvtx3/nvToolsExt.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "trainer_kit/configs.hpp"
#include "mlp_lm/cuda_compute.cuh"
#include "mlp_lm/data.hpp"
#include "trainer_kit/gpu_placement.hpp"
#include "mlp_lm/model.hpp"
#include "common.cuh"
#include "tessera/tessera.hpp"
#include "train_step/floor.cuh"
#include "train_step/options.hpp"

using namespace tessera;
using namespace tessera_bench;
using namespace tessera_bench::train_step;
using mlp_lm::model_shape;

namespace {

struct strategy_result {
  std::string name;
  double ms = 0, compute_ms = 0, comm_ms = 0, optimizer_ms = 0, host_issue_ms = 0, tokens_per_s = 0, tflops = 0,
         final_loss = 0;
  double comm_only_ms = 0;  // the step's collectives alone, no compute (0 at one rank)
  double steady_ms = 0;     // wall time per step over steps issued back to back
  std::size_t peak = 0, device_used = 0, estimate = 0;
  std::size_t model_state = 0, formula = 0;  // the wrapper's model-state bytes; DESIGN.md's formula
  std::size_t offloaded = 0;                 // host bytes of offloaded optimizer state and staging
  bool fused = false, cuda_graphs = false;
  std::size_t graph_nodes = 0;  // nodes of the step graph (0: eager)
  std::string choices;
};

template <class Cfg, class Comm>
strategy_result run_strategy(const bench_options& o, const model_shape& s, Comm& comm, MPI_Comm world,
                             comm::mesh<Comm>* m) {
  using Wrapper = data_parallel_t<Cfg>;
  int r = 0, N = 1;
  MPI_Comm_rank(world, &r);
  MPI_Comm_size(world, &N);
  TESSERA_CUDA(cudaDeviceSynchronize());
  const std::size_t base = device_in_use();
  memory_of<backend::cuda>().reset_peak();
  const std::size_t counted_before = memory_of<backend::cuda>().current();
  strategy_result res;
  res.name = std::string(Cfg::strategy::name);
  {
    const wrapper_options wo{.gather_buffers = o.gather_buffers, .lend_grad_shards = o.lend_grad_shards,
                             .offload_optimizer = o.offload};
    std::optional<Wrapper> holder;  // over the world's communicator, or a mesh of it
    if (m) holder.emplace(*m, wo);
    else holder.emplace(comm, wo);
    Wrapper& model = *holder;
    const mlp_lm::model_ids ids = mlp_lm::register_model(model, s);
    model.finalize();
    mlp_lm::init_model(model, ids, s, 1);
    ShardedOptimizer opt(model, adamw{.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1},
                         optimizer_options{.clip_norm = o.clip, .overlap_updates = o.overlap_updates == "on",
                                           .offload_update = trainer_kit::update_site_of(o.offload_update)});
    res.offloaded = model.planned().host_main_weights + opt.offloaded_bytes();
    const long per_mb = o.tokens / o.accum;
    const long lo = per_mb * r / N, hi = per_mb * (r + 1) / N;
    const std::size_t n = std::size_t(hi - lo), n_alloc = std::max<std::size_t>(n, 1);
    // --cuda-graphs: one graph launch per step from the warm-up's second step on (tessera::step_graph).
    const bool graphs = o.cuda_graphs == "on" || (o.cuda_graphs == "auto" && N == 1 && o.offload == 0);
    tessera::step_graph runner(opt, graphs);
    const mlp_lm::net_options nopt{.recompute_gelu = o.recompute_gelu, .input_slots = graphs ? o.accum : 1};
    mlp_lm::cuda_mlp<Wrapper> net(model, ids, s, n_alloc, nopt);
    if (o.gemm_sms > 0 && N > 1) net.set_gemm_sms(o.gemm_sms);  // resolved in main
    res.fused = net.fused();
    {
      // DESIGN.md's model state per rank (mixed bf16/fp32 Adam): 2 bytes of
      // compute weights, 4 of gradients, 12 of main weights and moments per
      // parameter, each divided by N where the strategy shards it, plus the
      // gathered unit buffers under optim_grads_params.
      using St = typename Cfg::strategy;
      const double P = double(s.params()), n = double(model.world());  // the shard group's ranks
      const auto& pl = model.planned();
      res.formula = std::size_t(P * ((St::shards_params ? 2 / n : 2) + (St::shards_grads ? 4 / n : 4) +
                                     (St::shards_optimizer ? 12 / n : 12))) +
                    pl.gathered_buffers;
      res.model_state = pl.total() + opt.state_bytes();
    }
    const std::size_t own_shards = o.lend_grad_shards ? net.lend_grad_shards() : 0;
    res.model_state += own_shards;  // shards too large for their unit's activations
    res.estimate = res.model_state + decltype(net)::workspace_bytes(s, n_alloc, nopt) +
                   tessera::cuda::matmul_workspace_bytes();
    const mlp_lm::corpus data("", 1, s.ctx);
    std::vector<std::pair<std::vector<std::uint8_t>, std::vector<std::uint8_t>>> batches(
        std::size_t(o.accum), {std::vector<std::uint8_t>(n_alloc * std::size_t(s.ctx)), std::vector<std::uint8_t>(n_alloc)});
    tessera::cuda::event e0(true), e1(true), e2(true), e3(true);
    std::vector<double> total, compute, exposed, optimizer, issue;
    const cudaStream_t st = tessera::cuda::current_stream();
    const auto sample_step = [&](int step) {
      for (int mb = 0; mb < o.accum; ++mb)
        for (std::size_t j = 0; j < n; ++j)
          batches[std::size_t(mb)].second[j] =
              data.sample(1, step, mb, lo + long(j), &batches[std::size_t(mb)].first[j * std::size_t(s.ctx)]);
    };
    // Eager forward and backward of every micro-batch (each stages its inputs first).
    const auto eager_forward_backward = [&] {
      for (int mb = 0; mb < o.accum; ++mb) {
        model.begin_micro_batch(mb, o.accum);
        net.forward_backward(batches[std::size_t(mb)].first.data(), batches[std::size_t(mb)].second.data(), n,
                             double(o.tokens));
      }
    };
    // With a step graph: the inputs staged (as forward_backward does eagerly),
    // then one step: [the last step's updates, forward and backward, the
    // decision], one graph launch after the warm-up.
    const auto graph_step = [&] {
      for (int mb = 0; mb < o.accum; ++mb)
        net.stage(mb, batches[std::size_t(mb)].first.data(), batches[std::size_t(mb)].second.data(), n);
      (void)runner.step([&] { net.forward_backward_slots(o.accum, n, double(o.tokens)); });
    };
    for (int step = 0; step < o.warmup + o.steps; ++step) {
      // Batches are sampled before the clock starts (the trainer samples the
      // next one while the GPU runs the current one).
      sample_step(step);
      MPI_Barrier(world);
      // The last timed step is an NVTX range "tessera-step", so a profiler can
      // take exactly one steady-state step: ncu --nvtx --nvtx-include "tessera-step/".
      const bool marked = step == o.warmup + o.steps - 1;
      if (marked) nvtxRangePushA("tessera-step");
      const double t0 = MPI_Wtime();
      e0.record(st);
      if (graphs) {
        graph_step();  // no phases to time inside one graph
        e1.record(st);
        e2.record(st);
        net.finish_loss();
      } else {
        eager_forward_backward();
        e1.record(st);
        model.finish_grad_sync();
        e2.record(st);
        net.finish_loss();
        (void)opt.step();  // returns without waiting for the device
      }
      e3.record(st);
      const double issued = (MPI_Wtime() - t0) * 1e3;  // host time to issue the whole step
      e3.synchronize();
      if (marked) nvtxRangePop();
      res.final_loss = net.take_loss() / double(o.tokens);
      const double wall = (MPI_Wtime() - t0) * 1e3;
      if (step < o.warmup) continue;
      float a = 0, b = 0, c = 0;
      TESSERA_CUDA(cudaEventElapsedTime(&a, e0.get(), e1.get()));
      TESSERA_CUDA(cudaEventElapsedTime(&b, e1.get(), e2.get()));
      TESSERA_CUDA(cudaEventElapsedTime(&c, e2.get(), e3.get()));
      total.push_back(wall);
      issue.push_back(issued);
      compute.push_back(a);
      exposed.push_back(b);
      optimizer.push_back(c);
    }
    // Steady state: o.steps more steps back to back, the host never waiting
    // for the device (it samples and stages the next step while the device
    // runs this one). The per-step figures above wait for each step before
    // the next, and leave out the host's sampling between them, so updates
    // queued for the next forward's shadow may run in that untimed gap; here
    // every step's work is inside the clock, eager or graph alike.
    if (o.steps > 0) {
      TESSERA_CUDA(cudaDeviceSynchronize());
      MPI_Barrier(world);
      const double t0 = MPI_Wtime();
      for (int k = 0; k < o.steps; ++k) {
        sample_step(o.warmup + o.steps + k);
        if (graphs) {
          graph_step();
        } else {
          eager_forward_backward();
          (void)opt.step();
        }
        net.finish_loss();
      }
      runner.finish();  // a step graph leaves the last step's updates for a next step: done here, as eager steps do theirs
      TESSERA_CUDA(cudaDeviceSynchronize());  // every stream: the last updates included
      res.steady_ms = (MPI_Wtime() - t0) * 1e3 / o.steps;
      res.final_loss = net.take_loss() / double(o.tokens);
    }
    runner.finish();  // the last step's updates (a step graph leaves them for a next step)
    res.graph_nodes = runner.nodes();
    res.cuda_graphs = runner.captured();
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v[v.size() / 2];
    };
    // Communication only: the same gathers, reductions and weight publication
    // as a step, in the same order, with no compute between them.
    if (comm.size() > 1 && o.overlap) {
      std::vector<double> only;
      auto e = model.shards();
      for (int it = 0; it < 2 + o.steps; ++it) {
        MPI_Barrier(world);
        e0.record(st);
        e.publish_weights(/*converted=*/true);  // after a step: gathered copies dropped, replicas re-gathered
        model.begin_micro_batch(0, 1);
        // Forward: gather each unit; backward: gather, take its gradients, reduce.
        const auto forward = [&](tessera::unit_id u) { auto sc = model.gather(u); };
        const auto backward = [&](tessera::unit_id u) {
          auto sc = model.gather(u);
          (void)sc.grads_for_write();
          sc.reduce_grads();
        };
        forward(ids.embed);
        for (const auto& b : ids.blocks) forward(b.unit);
        backward(ids.head);
        for (auto b = ids.blocks.rbegin(); b != ids.blocks.rend(); ++b) backward(b->unit);
        backward(ids.embed);
        model.finish_grad_sync();
        model.synchronize();
        e1.record(st);
        e1.synchronize();
        model.zero_grad();
        float a = 0;
        TESSERA_CUDA(cudaEventElapsedTime(&a, e0.get(), e1.get()));
        if (it >= 2) only.push_back(a);
      }
      res.comm_only_ms = median(only);
    }
    res.choices = net.choices();
    res.ms = median(total);
    res.compute_ms = median(compute);
    res.comm_ms = median(exposed);
    res.optimizer_ms = median(optimizer);
    res.host_issue_ms = median(issue);
    res.tokens_per_s = double(o.tokens) / (res.ms * 1e-3);
    res.tflops = s.flops_per_token() * res.tokens_per_s / 1e12;
    TESSERA_CUDA(cudaDeviceSynchronize());
    res.device_used = device_in_use() - base;
    res.peak = memory_of<backend::cuda>().peak() - counted_before;
    // The busiest rank.
    std::uint64_t v[5] = {res.peak, res.device_used, res.estimate, res.model_state, res.formula};
    MPI_Allreduce(MPI_IN_PLACE, v, 5, MPI_UINT64_T, MPI_MAX, world);
    res.peak = v[0];
    res.device_used = v[1];
    res.estimate = v[2];
    res.model_state = v[3];
    res.formula = v[4];
    double c = res.comm_only_ms;  // the slowest rank's
    MPI_Allreduce(MPI_IN_PLACE, &c, 1, MPI_DOUBLE, MPI_MAX, world);
    res.comm_only_ms = c;
  }
  return res;
}

template <class Comm>
strategy_result dispatch(const bench_options& o, const std::string& name, const model_shape& s, Comm& comm, MPI_Comm world,
                         comm::mesh<Comm>* m = nullptr);

// Gradients reduce in fp32 (the default) or, with --wire bf16, are rounded to
// bf16 for the collective and accumulated in fp32 again.
template <class P, class Comm>
strategy_result dispatch_precision(const bench_options& o, const std::string& name, const model_shape& s, Comm& comm,
                                   MPI_Comm world, comm::mesh<Comm>* m) {
  const auto run = [&]<class Cfg>() { return run_strategy<Cfg>(o, s, comm, world, m); };
  if (auto r = trainer_kit::with_config<P, backend::cuda>(o.wrapper, name, o.outer, run)) return *r;  // HFSDP: fsdp / ogp
  throw tessera::error("no instantiation for --wrapper " + o.wrapper + " --strategies " + name);
}

template <class Comm>
strategy_result dispatch(const bench_options& o, const std::string& name, const model_shape& s, Comm& comm, MPI_Comm world,
                         comm::mesh<Comm>* m) {
  if (o.wire == "bf16") return dispatch_precision<mixed_precision<bf16, float, float, bf16>>(o, name, s, comm, world, m);
  return dispatch_precision<mixed_precision<bf16, float>>(o, name, s, comm, world, m);
}

}  // namespace

int main(int argc, char** argv) {
  bench_options o;
  CLI::App app{"tessera-bench-train: training-step time per strategy beside the step's floor"};
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  if (o.outer == "optim" && (o.shard_group == 0 || o.wrapper != "fsdp")) {
    std::fprintf(stderr, "tessera: --outer optim (HFSDP) needs --shard-group S and --wrapper fsdp "
                         "(compiled for optim_grads_params)\n");
    return 2;
  }
  if (o.lend_grad_shards && o.accum > 1) {
    std::fprintf(stderr, "tessera: --lend-grad-shards holds one micro-batch's reduction; use --accum 1\n");
    return 2;
  }
  try {
    comm::mpi_session session(&argc, &argv);
    comm::mpi world;
    const trainer_kit::gpu_placement where = trainer_kit::place_on_gpu(world.rank());
    tessera::cuda::stream compute;
    const tessera::cuda::scoped_stream on_compute(compute.get());  // restored before compute goes
    const bool use_nccl = where.communicator(o.comm) == "nccl";
    o.gemm_sms = where.gemm_sms(o.gemm_sms, use_nccl ? o.nccl_ctas : 0, world.size());
    const model_shape s{o.layers, o.d, o.ctx};
    const bool talk = world.rank() == 0;
    cudaDeviceProp prop{};
    TESSERA_CUDA(cudaGetDeviceProperties(&prop, where.device));
    const long per_rank = o.tokens / o.accum / world.size();
    const floor_parts fl = measure_floor(s, per_rank, 10);
    const double floor_step = fl.gemm_ms * o.accum + fl.optimizer_ms;  // GEMMs per micro-batch, the optimizer once
    if (talk) {
      std::printf("# tessera-bench-train on %s: %d rank%s (%s), wrapper %s, layers %d, d %d, ctx %d, %ld tokens per step "
                  "(%d micro-batch%s), %.3fB parameters, clip %g, updates %s\n",
                  prop.name, world.size(), world.size() == 1 ? "" : "s", use_nccl ? "NCCL" : "MPI staged", o.wrapper.c_str(),
                  o.layers, o.d, o.ctx, o.tokens, o.accum, o.accum == 1 ? "" : "es", double(s.params()) / 1e9, o.clip,
                  o.overlap_updates == "on" ? "in the next forward's shadow" : "at the end of the step");
      std::printf("# CUDA graphs: %s\n", o.cuda_graphs == "off" ? "off" : o.cuda_graphs == "on" || (world.size() == 1 && o.offload == 0)
                                                                    ? "each step after the first one launch (phases not timed apart)"
                                                                    : "off (auto: several ranks or offload)");
      std::printf("# bf16 GEMM 8192^3: %.1f TFLOP/s; copy %.0f GB/s\n", fl.gemm_tflops, fl.copy_gbs);
      std::printf("# floor per step and rank: GEMMs alone %.3f ms + optimizer 28 B/param at copy speed %.3f ms = %.3f ms "
                  "(%.0f tokens/s)\n",
                  fl.gemm_ms * o.accum, fl.optimizer_ms, floor_step, double(o.tokens) / world.size() / (floor_step * 1e-3));
      std::printf("# the same GEMMs back to back (sustained clocks): %.3f ms, %.1f%% above the sum of GEMMs timed alone\n",
                  fl.sustained_gemm_ms * o.accum, 100 * (fl.sustained_gemm_ms / fl.gemm_ms - 1));
      if (o.gemm_sms > 0 || o.nccl_ctas > 0)
        std::printf("# GEMMs shaped for %d SMs beside collectives; NCCL limited to %d CTAs (0: its own choice)\n",
                    o.gemm_sms, o.nccl_ctas);
      std::printf("%-20s %9s %12s %8s %8s %9s %9s %9s %10s %10s %10s %6s %10s %10s %9s %9s %7s\n", "strategy", "ms/step",
                  "tokens/s/GPU", "TFLOP/s", "of floor", "compute", "exp.comm", "optim", "peak MiB", "device MiB",
                  "est. MiB", "est/pk", "state MiB", "formula", "comp.only", "comm.only", "overlap");
    }
    offload_ceilings oc;
    if (o.offload > 0) {
      oc = measure_offload_ceilings();
      if (talk) {
        // Per parameter of the offloaded range (fp32 main weights and AdamW
        // moments, fp32 gradients, bf16 compute weights): the host update
        // moves 30 B through host memory and 4 + 2 B across PCIe; the device
        // update 12 B each way across PCIe.
        const double P = double(s.params()) * o.offload / world.size();
        std::printf("# offload ceilings (this run): host memory %.1f GB/s (read + write), PCIe host-to-device %.1f GB/s, "
                    "device-to-host %.1f GB/s\n#   update of %.0fM offloaded parameters at best: host %.1f ms (memory) "
                    "/ %.1f ms (PCIe), device %.1f ms (PCIe)\n",
                    oc.host_gbs, oc.h2d_gbs, oc.d2h_gbs, P / 1e6, 30 * P / (oc.host_gbs * 1e9) * 1e3,
                    (4 * P / (oc.d2h_gbs * 1e9) + 2 * P / (oc.h2d_gbs * 1e9)) * 1e3,
                    12 * P / (std::min(oc.h2d_gbs, oc.d2h_gbs) * 1e9) * 1e3);
      }
    }
    nlohmann::json out{{"device", prop.name},
                       {"host_memory_gbs", oc.host_gbs},
                       {"pcie_h2d_gbs", oc.h2d_gbs},
                       {"pcie_d2h_gbs", oc.d2h_gbs},
                       {"world", world.size()},
                       {"comm", use_nccl ? "nccl" : "mpi"},
                       {"layers", o.layers},
                       {"d", o.d},
                       {"ctx", o.ctx},
                       {"tokens", o.tokens},
                       {"accum", o.accum},
                       {"params", s.params()},
                       {"clip", o.clip},
                       {"wrapper", o.wrapper},
                       {"gemm_tflops", fl.gemm_tflops},
                       {"copy_gbs", fl.copy_gbs},
                       {"floor_gemm_ms", fl.gemm_ms * o.accum},
                       {"floor_optimizer_ms", fl.optimizer_ms},
                       {"floor_ms", floor_step},
                       {"sustained_gemm_ms", fl.sustained_gemm_ms * o.accum},
                       {"results", nlohmann::json::array()}};
    // Compute only (several ranks): forward and backward of each GPU's share of
    // the batch through a world of one (no collective at all), all GPUs busy at
    // once; a strategy's compute-only step adds its own optimizer time.
    double solo_compute_ms = 0;
    if (world.size() > 1 && o.overlap) {
      comm::local<backend::cuda> alone;
      solo_compute_ms = dispatch(o, "no_shard", s, alone, MPI_COMM_WORLD).compute_ms;
      MPI_Allreduce(MPI_IN_PLACE, &solo_compute_ms, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (talk) std::printf("# compute only (each GPU alone, same tokens per GPU): forward + backward %.3f ms\n", solo_compute_ms);
    }
    out["compute_only_forward_backward_ms"] = solo_compute_ms;
    out["shard_group"] = o.shard_group > 0 ? o.shard_group : world.size();
    out["replicas"] = o.shard_group > 0 ? world.size() / o.shard_group : 1;
    out["outer"] = o.outer;
    out["overlap_updates"] = o.overlap_updates;
    out["cuda_graphs"] = o.cuda_graphs;
    if (talk && o.shard_group > 0)
      std::printf("# mesh %d x %d (replica groups x shard-group ranks), outer %s\n", world.size() / o.shard_group,
                  o.shard_group, o.outer.c_str());
    auto run_all = [&](auto& flat) {
      using Comm = std::remove_reference_t<decltype(flat)>;
      std::optional<comm::mesh<Comm>> m;
      if (o.shard_group > 0) m.emplace(comm::make_mesh(flat, o.shard_group));
      auto& c = m ? m->shard : flat;
      for (const auto& name : o.strategies) {
        const strategy_result r = dispatch(o, name, s, c, MPI_COMM_WORLD, m ? &*m : nullptr);
        if (!talk) continue;
        // Per rank: tokens/s of the whole job divided by ranks, against the per-rank floor.
        const double of_floor = floor_step / r.ms;
        const double per_gpu = r.tokens_per_s / world.size();
        const double compute_only = solo_compute_ms > 0 ? solo_compute_ms + r.optimizer_ms : 0;
        const double overlap = compute_only > 0 ? r.ms / std::max(compute_only, r.comm_only_ms) : 0;
        const auto mib = [](std::size_t b) { return double(b) / (1 << 20); };
        std::printf("%-20s %9.3f %12.0f %8.1f %7.1f%% %9.3f %9.3f %9.3f %10.1f %10.1f %10.1f %6.3f %10.1f %10.1f %9.3f %9.3f "
                    "%7.3f%s\n",
                    r.name.c_str(), r.ms, per_gpu, r.tflops / world.size(), 100 * of_floor, r.compute_ms, r.comm_ms,
                    r.optimizer_ms, mib(r.peak), mib(r.device_used), mib(r.estimate), double(r.estimate) / double(r.peak),
                    mib(r.model_state), mib(r.formula), compute_only, r.comm_only_ms, overlap,
                    r.fused ? "" : "  (epilogues not fused)");
        std::printf("#   %s steady state (%d steps back to back, nothing outside the clock): %.3f ms per step, %.0f tokens/s "
                    "per GPU%s\n",
                    r.name.c_str(), o.steps, r.steady_ms, r.steady_ms > 0 ? double(o.tokens) / world.size() / (r.steady_ms * 1e-3) : 0.0,
                    r.cuda_graphs ? (", one CUDA graph of " + std::to_string(r.graph_nodes) + " nodes a step").c_str() : "");
        if (&name == &o.strategies.front()) std::printf("#   products: %s\n", r.choices.c_str());
        std::fflush(stdout);
        out["results"].push_back({{"strategy", r.name},
                                  {"ms", r.ms},
                                  {"tokens_per_s", r.tokens_per_s},
                                  {"tokens_per_s_per_rank", per_gpu},
                                  {"compute_only_ms", compute_only},
                                  {"comm_only_ms", r.comm_only_ms},
                                  {"overlap_efficiency", overlap},
                                  {"model_state_bytes", r.model_state},
                                  {"design_formula_bytes", r.formula},
                                  {"tflops", r.tflops},
                                  {"of_floor", of_floor},
                                  {"compute_ms", r.compute_ms},
                                  {"exposed_comm_ms", r.comm_ms},
                                  {"optimizer_ms", r.optimizer_ms},
                                  {"host_issue_ms", r.host_issue_ms},
                                  {"cuda_graphs", r.cuda_graphs},
                                  {"steady_ms", r.steady_ms},
                                  {"steady_tokens_per_s", r.steady_ms > 0 ? double(o.tokens) / (r.steady_ms * 1e-3) : 0.0},
                                  {"graph_nodes", r.graph_nodes},
                                  {"peak_bytes", r.peak},
                                  {"device_used_bytes", r.device_used},
                                  {"estimated_bytes", r.estimate},
                                  {"offloaded_bytes", r.offloaded},
                                  {"fused_epilogues", r.fused},
                                  {"fusion_choices", r.choices},
                                  {"final_loss", r.final_loss}});
      }
    };
    out["gemm_sms"] = o.gemm_sms;
    out["gather_buffers"] = o.gather_buffers;
    out["wire"] = o.wire;
    out["recompute_gelu"] = o.recompute_gelu;
    out["lend_grad_shards"] = o.lend_grad_shards;
    out["offload_optimizer"] = o.offload;
    out["offload_update"] = o.offload_update;
    if (talk && o.offload > 0)
      std::printf("# optimizer offloaded to host memory: fraction %.2f, updated on the %s\n", o.offload,
                  o.offload_update.c_str());
    if (talk && (o.gather_buffers != 2 || o.wire != "fp32" || o.recompute_gelu || o.lend_grad_shards))
      std::printf("# %d gather buffers, gradients reduced in %s%s%s\n", o.gather_buffers, o.wire.c_str(),
                  o.recompute_gelu ? ", GELU outputs recomputed" : "",
                  o.lend_grad_shards ? ", gradient shards in lent activations" : "");
    out["nccl_ctas"] = o.nccl_ctas;
    out["copy_engine_gathers"] = o.copy_engine_gathers;
    if (talk && o.copy_engine_gathers) std::printf("# all-gathers on copy engines (NCCL zero-CTA policy, symmetric windows)\n");
    if (use_nccl) {
      comm::nccl c(world, comm::nccl_options{.max_ctas = o.nccl_ctas, .copy_engine_gathers = o.copy_engine_gathers});
      run_all(c);
    } else {
      comm::mpi_device c;
      run_all(c);
    }
    if (talk && !o.json.empty()) std::ofstream(o.json) << out.dump(2) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
