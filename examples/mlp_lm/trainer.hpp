#pragma once
// The training loop of tessera-mlp-lm, the same on both backends: Net is
// host_mlp (CBLAS) or cuda_mlp (cuBLASLt), Comm is whatever the wrapper
// communicates over; `world` (MPI on the host) carries the logged loss.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <exception>
#include <sstream>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "mlp_lm/configs.hpp"
#include "mlp_lm/data.hpp"
#include "mlp_lm/model.hpp"
#include "options.hpp"
#include "trainer_kit/mesh.hpp"
#include "trainer_kit/host_math.hpp"
#include "trainer_kit/run.hpp"
#include "tessera/checkpoint/checkpoint.hpp"
#include "tessera/checkpoint/consolidate.hpp"
#include "tessera/tessera.hpp"

namespace mlp_lm {

//! Every rank runs rank 0's command line: a differing option (given to one
//! rank only, or an environment that expands differently) is one clear error
//! on every rank, naming the first option that differs. Collective.
inline void agree_on_options(tessera::comm::mpi& world, const options& o) {
  trainer_kit::agree_on_text(world, describe(o));
  if (o.deterministic) {
    TESSERA_CHECK(o.accum % world.size() == 0, "--deterministic: ", o.accum, " micro-batches of ", o.micro_tokens,
                  " tokens do not split evenly over ", world.size(), " ranks; choose a world size that divides ", o.accum,
                  " (or another --micro-tokens)");
    return;
  }
  const long per_mb = o.tokens / o.accum;
  TESSERA_CHECK(per_mb >= world.size(), "--tokens ", o.tokens, " / --accum ", o.accum, " gives ", per_mb,
                " tokens per micro-batch over ", world.size(), " ranks; each rank needs at least one");
}

using trainer_kit::crash_hook_from_env;
using trainer_kit::device_usage;
using trainer_kit::dump_weights;
using trainer_kit::fault_hook;
using trainer_kit::make_step_runner;
using trainer_kit::memory_estimate;
using trainer_kit::mib;

//! Trains over `comm`, or over the mesh m when given (comm unused then).
template <class Cfg, class Net, class Comm>
int train(const options& o_in, tessera::comm::mpi& world, Comm& comm, tessera::comm::mesh<Comm>* m,
          const device_usage& usage, std::size_t blas_workspace = 0) {
  using namespace tessera;
  using Wrapper = data_parallel_t<Cfg>;
  using B = typename Cfg::backend_type;
  options o = o_in;
  const int N = world.size(), r = world.rank();
  const model_shape shape{o.layers, o.d, o.ctx};
  // --save's directory is this job's for its whole life: a second job saving
  // there fails now, not after the two have mixed their checkpoints.
  const auto claim = o.save.empty() ? checkpoint::root_claim{} : checkpoint::claim_root(world, o.save);
  // --dump-weights's file is written after the run: a bad path is found now.
  if (!o.dump_weights.empty()) trainer_kit::check_output_file(world, "--dump-weights", o.dump_weights);

  memory_of<B>().reset_peak();
  memory_of<host_resident>().reset_peak();
  const wrapper_options wo{.lend_grad_shards = o.lend_grad_shards, .offload_optimizer = o.offload};
  std::optional<Wrapper> holder;
  Wrapper& model = trainer_kit::emplace_wrapper(holder, comm, m, wo);
  const int replicas = model.replicas(), group = model.world();
  const model_ids ids = register_model(model, shape);
  model.finalize();
  init_model(model, ids, shape, o.seed);
  ShardedOptimizer opt(model, adamw{.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = o.weight_decay},
                       optimizer_options{.clip_norm = o.clip, .overlap_updates = o.overlap_updates == "on",
                                         .offload_update = update_site_of(o.offload_update)});
  if (o.warmup > 0)
    opt.set_schedule([w = o.warmup](long step, double lr) { return lr * std::min(1.0, double(step) / w); });

  // Resume: weights and optimizer state from any strategy and world size; the
  // data stream continues where it stopped (batches are a function of seed and step).
  long first_step = 0;
  if (!o.load.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto got = checkpoint::load(opt, o.load);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto& x = got.extra;
    if (!x.contains("next_step") || !x.contains("seed") || !x.contains("tokens") || !x.contains("accum"))
      throw tessera::error("checkpoint '" + got.path.string() + "' was not written by tessera-mlp-lm (no data position)");
    // The trainer's own fields: integers in range, or one clear error (not a
    // json exception, not a run that resumes at step -5).
    auto field = [&](const char* k, long lo, long hi) {
      const auto& v = x[k];
      if (!v.is_number_integer() || v.template get<long long>() < lo || v.template get<long long>() > hi)
        throw tessera::error("checkpoint '" + got.path.string() + "': field '" + k + "' is " +
                             (v.is_number_integer() ? std::to_string(v.template get<long long>()) : std::string(v.type_name())) +
                             ", expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    };
    field("next_step", 0, 1L << 40);
    field("tokens", 1, 1L << 30);
    field("accum", 1, 1L << 20);
    if (!x["seed"].is_number_unsigned() && !(x["seed"].is_number_integer() && x["seed"].template get<long long>() >= 0))
      throw tessera::error("checkpoint '" + got.path.string() + "': field 'seed' is not a non-negative integer");
    if (x["tokens"].template get<long>() != o.tokens || x["accum"].template get<int>() != o.accum)
      throw tessera::error("checkpoint '" + got.path.string() + "' was trained with --tokens " +
                           std::to_string(x["tokens"].template get<long>()) + " --accum " +
                           std::to_string(x["accum"].template get<int>()) +
                           "; resume with the same to continue its data stream");
    // A deterministic run continues deterministically, and only from one.
    const long micro = x.contains("micro_tokens") && x["micro_tokens"].is_number_integer()
                           ? x["micro_tokens"].template get<long>() : 0;
    if (micro != (o.deterministic ? o.micro_tokens : 0))
      throw tessera::error("checkpoint '" + got.path.string() + "' was trained " +
                           (micro ? "with --deterministic --micro-tokens " + std::to_string(micro)
                                  : std::string("without --deterministic")) +
                           "; resume the same way to continue its data stream");
    first_step = x["next_step"].template get<long>();
    if (first_step >= o.steps && r == 0)  // every rank knows; one says it
      std::printf("tessera-mlp-lm: the checkpoint is at step %ld and --steps is %d: nothing to train (--steps is the "
                  "total, counting the steps it resumes past)\n", first_step, o.steps);
    o.seed = x["seed"].template get<std::uint64_t>();
    if (r == 0 && !o.json)
      std::printf("tessera-mlp-lm: resumed from %s (step %ld, written by %d rank%s with %s) in %.2f s (read and "
                  "checked %.2f GB in %.2f s, copied in %.2f s)\n", got.path.c_str(), first_step, got.world,
                  got.world == 1 ? "" : "s", got.strategy.c_str(), load_s, double(got.bytes_read) / 1e9, got.read_seconds,
                  got.apply_seconds);
  }
  const corpus data(o.data, o.seed, o.ctx);
  const auto crash_hook = crash_hook_from_env();
  auto save = [&](long next_step) {
    checkpoint::save_options so;
    so.keep = o.keep;
    so.at_point = crash_hook;
    so.extra = {{"next_step", next_step}, {"seed", o.seed}, {"tokens", o.tokens}, {"accum", o.accum}, {"data", o.data}};
    if (o.deterministic) so.extra["micro_tokens"] = o.micro_tokens;
    const auto t0 = std::chrono::steady_clock::now();
    const auto dir = checkpoint::save(opt, o.save, next_step, so);
    if (r == 0 && !o.json)
      std::printf("tessera-mlp-lm: saved %s in %.2f s\n", dir.c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };

  // The global micro-batch is split into contiguous, possibly uneven slices;
  // --deterministic: whole micro-batches, rank r taking r, r + N, ... (the
  // tokens of the global batch in the same order either way).
  const long per_mb = o.tokens / o.accum;
  const long lo = o.deterministic ? 0 : per_mb * r / N, hi = o.deterministic ? per_mb : per_mb * (r + 1) / N;
  const int count = o.deterministic ? o.accum / N : o.accum;  // micro-batches this rank runs per step
  const std::size_t n = std::size_t(hi - lo), n_alloc = std::max<std::size_t>(n, 1);
  // --cuda-graphs: the steady-state step as one graph launch (tessera::step_graph,
  // which the CUDA net names); every micro-batch of a step is staged before it.
  constexpr bool graphable = trainer_kit::has_step_graph<Net, decltype(opt)>;
  const auto graph_choice = trainer_kit::choose_step_graphs(o.cuda_graphs, graphable, N, o.deterministic, count,
                                                            o.offload > 0 ? "an offloaded optimizer" : nullptr);
  const bool graphs = graph_choice.graphs;
  const net_options nopt{.recompute_gelu = o.recompute_gelu, .input_slots = graphs ? count : 1};
  Net net(model, ids, shape, n_alloc, nopt);
  // --deterministic: fused where cuBLASLt can, not by timing (two runs could time differently).
  if (o.fusion != "auto" || o.deterministic) net.force_fusion(o.fusion != "off");
  if constexpr (requires { net.set_gemm_sms(0); })
    if (o.gemm_sms > 0 && N > 1) net.set_gemm_sms(o.gemm_sms);
  std::size_t own_shards = 0;  // gradient shards too large for their unit's activations
  if constexpr (requires { net.lend_grad_shards(); })
    if (o.lend_grad_shards) own_shards = net.lend_grad_shards();
  const std::size_t widened =  // the host net's fp32 copies of bf16 units
      trainer_kit::widened_bytes<Net>(ids, [&](tessera::unit_id u) { return model.layout(u).padded_numel(); });
  memory_estimate est{model.planned().total(), opt.state_bytes(),
                      Net::workspace_bytes(shape, n_alloc, nopt) + widened + own_shards, blas_workspace,
                      model.planned().host_main_weights + opt.offloaded_bytes()};
  {  // The busiest rank's, part by part (ranks differ by a decay-mask word or a token), as tessera-plan gives it.
    std::int64_t v[5] = {std::int64_t(est.model_state), std::int64_t(est.optimizer_state),
                         std::int64_t(est.activations), std::int64_t(est.blas_workspace), std::int64_t(est.offloaded)};
    comm::all_reduce(world, std::span<std::int64_t>(v, 5), comm::reduce_op::max);
    est = {std::size_t(v[0]), std::size_t(v[1]), std::size_t(v[2]), std::size_t(v[3]), std::size_t(v[4])};
  }

  // The host samples micro-batch i + 1 while the device runs micro-batch i.
  struct batch {
    std::vector<std::uint8_t> ctx, tgt;
  };
  batch cur{std::vector<std::uint8_t>(n_alloc * std::size_t(o.ctx)), std::vector<std::uint8_t>(n_alloc)}, next = cur;
  auto sample = [&](batch& b, long step, int mb) {
    const long k = long(r) + long(mb) * N;  // --deterministic: the global micro-batch
    for (std::size_t j = 0; j < n; ++j)
      b.tgt[j] = o.deterministic ? data.sample(o.seed, step, 0, k * per_mb + long(j), &b.ctx[j * std::size_t(o.ctx)])
                                 : data.sample(o.seed, step, mb, lo + long(j), &b.ctx[j * std::size_t(o.ctx)]);
  };
  // --deterministic: each global micro-batch's loss, summed in their order
  // (a sum over ranks would depend on N).
  std::vector<double> mb_loss(o.deterministic ? std::size_t(o.accum) : 0);

  const bool talk = r == 0;
  const std::string prec = o.precision;
  if (talk && !o.json)
    std::printf("tessera-mlp-lm: backend %s%s%s%s, %s / %s / %s, %d rank%s%s, %zu parameters, %ld tokens per step, "
                "estimated memory %.2f MiB per rank (model state %.2f, optimizer %.2f, activations %.2f)%s\n",
                Net::backend_name, net.fusion().empty() ? "" : " (", net.fusion().c_str(), net.fusion().empty() ? "" : ")",
                std::string(Cfg::wrapper::name).c_str(), std::string(Cfg::strategy::name).c_str(), prec.c_str(), N,
                N == 1 ? "" : "s",
                m ? (" (mesh " + std::to_string(replicas) + " x " + std::to_string(group) + ", outer " +
                     std::string(Cfg::outer_type::name) + ")").c_str()
                  : "",
                shape.params(), o.tokens, double(est.total()) / (1 << 20),
                double(est.model_state) / (1 << 20), double(est.optimizer_state) / (1 << 20),
                double(est.activations + est.blas_workspace) / (1 << 20),
                est.offloaded ? (", offloaded to host memory " + mib(est.offloaded) + " MiB (" + o.offload_update +
                                 " update)").c_str()
                              : "");
  double final_loss = 0, total_s = 0;
  long timed_steps = 0;
  if (first_step < o.steps && !graphs) sample(cur, first_step, 0);
  long last_saved = -1;
  auto runner = make_step_runner<Net>(opt, graphs);
  // The host waits for the device only at a step whose loss it reads: one
  // printed (every --log-every, and the last), one before a checkpoint save,
  // and the first (its time, set-up included, is not counted). A printed
  // line's time is the mean over the steps since the last wait; saves are
  // left out of it.
  using clock = std::chrono::steady_clock;
  auto since = clock::now();
  double paused_s = 0;  // saves since `since`
  long steps_since = 0;
  for (long step = first_step; step < o.steps; ++step) {
    fault_hook(r, step);
    const bool shown = step % o.log_every == 0 || step == o.steps - 1;  // the same on every rank
    const bool saving = !o.save.empty() && o.save_every > 0 && (step + 1) % o.save_every == 0;
    const bool synced = shown || saving || step == first_step;
    step_handle<B> handle;
    if constexpr (graphable) {
      if (graphs) {
        // Every micro-batch staged into its own slot (the first step's here,
        // the next step's while this one runs), then the step issued (one
        // graph launch after the warm-up); its loss read after it.
        auto stage_step = [&](long k) {
          for (int mb = 0; mb < count; ++mb) {
            sample(cur, k, mb);
            net.stage(mb, cur.ctx.data(), cur.tgt.data(), n);  // copies queued after the work before: slots reused safely
          }
        };
        if (step == first_step) stage_step(step);
        handle = runner.step([&] { net.forward_backward_slots(count, n, double(o.tokens)); });
        net.finish_loss();
        if (step + 1 < o.steps) stage_step(step + 1);
        if (o.deterministic && synced) mb_loss[std::size_t(r)] = net.take_loss();  // one micro-batch per rank (checked above)
      }
    }
    if (!graphs) {
      for (int mb = 0; mb < count; ++mb) {
        model.begin_micro_batch(mb, count);
        net.forward_backward(cur.ctx.data(), cur.tgt.data(), n, double(o.tokens));
        const bool last = mb + 1 == count;
        if (!last || step + 1 < o.steps) sample(next, last ? step + 1 : step, last ? 0 : mb + 1);
        std::swap(cur, next);
        if (o.deterministic) {
          net.finish_loss();  // each micro-batch's loss on its own
          if (synced) mb_loss[std::size_t(r + mb * N)] = net.take_loss();
        }
      }
      if (!o.deterministic) net.finish_loss();
      handle = opt.step();  // read below only when a line is printed
    }
    ++steps_since;
    double loss = 0, s = 0;
    if (synced) {
      if (o.deterministic) {
        // One rank holds each entry and the others 0, so the sum over ranks is exact.
        comm::all_reduce(world, std::span<double>(mb_loss), comm::reduce_op::sum);
        for (double v : mb_loss) loss += v;
        std::fill(mb_loss.begin(), mb_loss.end(), 0.0);
      } else {
        loss = net.take_loss();  // waits for this step's loss
        comm::all_reduce(world, std::span<double>(&loss, 1), comm::reduce_op::sum);
      }
      loss /= double(o.tokens);
      const auto now = clock::now();
      const double span = std::chrono::duration<double>(now - since).count() - paused_s;
      s = span / double(steps_since);  // seconds per step since the last wait
      // The first step pays for set-up (cuBLASLt's search, first touches): not counted, unless it is the only one.
      if (step > first_step || o.steps == first_step + 1) total_s += span, timed_steps += steps_since;
      since = now, paused_s = 0, steps_since = 0;
      final_loss = loss;
    }
    if (saving) {  // after the wait above, so the save's time is all its own
      const auto t_save = clock::now();
      runner.finish();  // the weights of this step (the next step runs eagerly, then replays resume)
      save(last_saved = step + 1);
      paused_s += std::chrono::duration<double>(clock::now() - t_save).count();
    }
    if (talk && step == 0 && !o.json && !net.choices().empty()) std::printf("products: %s\n", net.choices().c_str());
    if (talk && shown) {
      const step_result& res = handle.get();
      const double tps = double(o.tokens) / s;
      if (o.json) {
        nlohmann::json j{{"step", step},         {"loss", loss},        {"grad_norm", res.grad_norm},
                         {"ms", s * 1e3},         {"tokens_per_s", tps}, {"lr", res.lr},
                         {"skipped", res.skipped}, {"tflops", shape.flops_per_token() * tps / 1e12},
                         {"bytes_in_use", memory_of<B>().current()}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("step %5ld  loss %.4f  grad_norm %.3f  %8.2f ms  %10.0f tokens/s  %7.2f TFLOP/s  %8.1f MiB%s\n",
                    step, loss, res.grad_norm, s * 1e3, tps, shape.flops_per_token() * tps / 1e12,
                    double(memory_of<B>().current()) / (1 << 20), res.skipped ? "  (skipped)" : "");
      }
      std::fflush(stdout);
    }
  }
  runner.finish();  // a step graph leaves the last step's updates for a next step
  // --steps 0 --save: the initial checkpoint (nothing resumed, nothing run).
  if (!o.save.empty() && last_saved != o.steps && (o.steps > first_step || (o.steps == 0 && o.load.empty())))
    save(o.steps);
  if (!o.dump_weights.empty())
    dump_weights(model, o.dump_weights,
                 {{"format", "pt"}, {"step", std::to_string(std::max<long>(o.steps, first_step))},
                  {"model", "tessera-mlp-lm"}, {"layers", std::to_string(o.layers)}, {"d", std::to_string(o.d)},
                  {"ctx", std::to_string(o.ctx)}, {"vocab", "256"}, {"seed", std::to_string(o.seed)},
                  {"precision", o.precision}});  // no strategy or world size: dumps of any compare with cmp
  // Peaks over all ranks: the busiest rank is what a machine must hold.
  std::int64_t peak[3] = {std::int64_t(memory_of<B>().peak()), std::int64_t(usage.used()),
                          std::int64_t(memory_of<host_resident>().peak())};
  comm::all_reduce(world, std::span<std::int64_t>(peak, 3), comm::reduce_op::max);
  if (talk) {
    const double tps = total_s > 0 ? double(o.tokens) * double(timed_steps) / total_s : 0.0;
    nlohmann::json j{{"summary", true},
                     {"final_loss", final_loss},
                     {"params", shape.params()},
                     {"world", N},
                     {"shard_group", group},
                     {"replicas", replicas},
                     {"outer", Cfg::outer_type::name},
                     {"strategy", Cfg::strategy::name},
                     {"wrapper", Cfg::wrapper::name},
                     {"precision", o.precision},
                     {"backend", Net::backend_name},
                     {"fused_epilogues", net.fused()},
                     {"fusion_choices", net.choices()},
                     {"cuda_graphs", runner.captured()},
                     {"graph_nodes", runner.nodes()},
                     {"steps", o.steps},
                     {"skipped_steps", opt.skipped_steps()},
                     {"tokens_per_s", tps}, {"tokens_per_s_per_rank", tps / N},
                     {"tflops", shape.flops_per_token() * tps / 1e12},
                     {"peak_bytes", peak[0]},
                     {"device_used_bytes", peak[1]},
                     {"estimated_bytes", est.total()},
                     {"planned_model_state_bytes", est.model_state + est.optimizer_state},
                     {"offload_optimizer", o.offload},
                     {"offload_update", o.offload_update},
                     {"offloaded_bytes", peak[2]},
                     {"estimated_offloaded_bytes", est.offloaded}};
    if (o.json) std::printf("%s\n", j.dump().c_str());
    else
      std::printf("done: final loss %.4f, %.0f tokens/s over %d rank%s (%.0f and %.2f TFLOP/s per rank; steps after "
                  "the first), peak %.2f MiB per rank (library buffers; estimate %.2f MiB%s)%s%s\n",
                  final_loss, tps, N, N == 1 ? "" : "s", tps / N, shape.flops_per_token() * tps / N / 1e12,
                  double(peak[0]) / (1 << 20),
                  double(est.total()) / (1 << 20),
                  std::is_same_v<B, backend::host>
                      ? ""
                      : ("; the device's own count " + std::to_string(peak[1] >> 20) + " MiB").c_str(),
                  peak[2] ? (", offloaded " + mib(std::size_t(peak[2])) + " MiB in host memory (estimate " +
                             mib(est.offloaded) + " MiB)").c_str()
                          : "",
                  graph_choice.note(runner).c_str());
  }
  return 0;
}

//! Runs train<Cfg> for the strategy and wrapper named in o; Net<Wrapper> computes.
template <class P, class B, class R, template <class> class Net, class Comm>
int dispatch_strategy(const options& o, tessera::comm::mpi& world, Comm& comm, const device_usage& usage,
                      std::size_t blas_workspace = 0) {
  using namespace tessera;
  auto run = [&]<class Cfg>() {
    return trainer_kit::on_world_or_mesh(o.shard_group, world, comm, [&](Comm& c, comm::mesh<Comm>* m) {
      return train<Cfg, Net<data_parallel_t<Cfg>>>(o, world, c, m, usage, blas_workspace);
    });
  };
  // HFSDP is compiled for fsdp / optim_grads_params only (options.hpp checks).
  if (const auto rc = with_config<P, B, R>(o.wrapper, o.strategy, o.outer, run)) return *rc;
  std::fprintf(stderr, "tessera: no compiled instantiation for --wrapper %s --strategy %s\n", o.wrapper.c_str(),
               o.strategy.c_str());
  return 2;
}

//! Both precisions, with reduction policy R.
template <class B, template <class> class Net, class R, class Comm>
int dispatch(const options& o, tessera::comm::mpi& world, Comm& comm, const device_usage& usage,
             std::size_t blas_workspace = 0) {
  using namespace tessera;
  return o.precision == "bf16"
             ? dispatch_strategy<mixed_precision<bf16, float>, B, R, Net>(o, world, comm, usage, blas_workspace)
             : dispatch_strategy<full_precision<float>, B, R, Net>(o, world, comm, usage, blas_workspace);
}

}  // namespace mlp_lm
