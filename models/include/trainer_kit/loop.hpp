#pragma once
// The training loop every reference trainer runs, once: the wrapper and the
// optimizer for a configuration, the resume, the steps (micro-batches sampled
// on the host while the device runs the last one, eager or as one CUDA graph,
// --deterministic's per-micro-batch losses summed in their global order),
// logging, validation, checkpoints, the final weights, and the summary. A
// model brings only its hooks (`Model`), as torchtitan's models bring their
// layers to one train.py:
//
//   static constexpr const char* program;             "tessera-gpt": messages, checkpoints, dumps
//   const run_options& run() const;                    the run's options
//   template <class W> using net = ...;                its net for wrapper W (host or CUDA)
//   void on_world(int rank, int N);                    this rank's place; what N must divide (throws)
//   tessera::wrapper_options wrapper_options() const;  gather buffers, ... (the loop sets the offload)
//   void build(W&);  void init(W&, seed);              registration (before finalize) and initial values
//   Net make_net(W&, int input_slots);                 the net
//   [std::size_t prepare(Net&, W&)]                    its set-up once built (bytes it adds to the estimate)
//   std::size_t activation_bytes(const Net&, const W&); what the net holds, for the estimate
//   json identity() const;                             the model's configuration (resume.hpp)
//   json position(int N, int count) const;             the data stream's fields (resume.hpp)
//   void check_resume(const json&, path, int N, int count) const;
//   double tokens_per_step(int N, int count) const;  double flops_per_token() const;  std::size_t params() const;
//   batch make_batch() const;  void sample(batch&, seed, step, mb) const;   mb: this rank's micro-batch
//   void forward_backward(Net&, batch&, double global_tokens);
//   void stage(Net&, int slot, batch&);  void forward_backward_slots(Net&, int count, double global_tokens);
//   void banner(const Net&, const W&, const run_facts&) const;
//   void summary(json&, const Net&) const;  std::map<string, string> dump_metadata() const;
// and, where the model has them: bool validation_due(long step, bool last) const, double
// evaluate(Net&, comm::mpi&), void after(Net&, comm::mpi&, seed) (sampling).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/checkpoint/checkpoint.hpp"
#include "tessera/tessera.hpp"
#include "trainer_kit/configs.hpp"
#include "trainer_kit/mesh.hpp"
#include "trainer_kit/report.hpp"
#include "trainer_kit/resume.hpp"
#include "trainer_kit/run.hpp"
#include "trainer_kit/run_options.hpp"

namespace trainer_kit {

//! --init-from: the weights of a Hugging Face directory, through the model's
//! bridge (mdl.init_from_hf), or of a Tessera checkpoint of this model (its
//! identity checked; its optimizer state and step left behind: zeroed state,
//! step 0). Collective.
template <class Model, class Wrapper, class Opt>
void init_weights(Model& mdl, Wrapper& model, Opt& opt, const std::string& from, const char* program, bool talk) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string what;
  if (is_hf_directory(from)) {
    if constexpr (requires { mdl.init_from_hf(model.shards(), std::filesystem::path(from)); })
      mdl.init_from_hf(model.shards(), std::filesystem::path(from));
    else
      throw tessera::error(std::string("--init-from ") + from + ": " + program + " has no Hugging Face bridge");
    what = "the Hugging Face directory " + from;
  } else {
    const auto got = tessera::checkpoint::load(opt, from);
    check_resume_common(got.extra, got.path.string(), program, mdl.identity());
    using B = typename Wrapper::backend_type;
    for (std::size_t u = 0; u < model.num_units(); ++u)
      for (int k = 0; k < Opt::algorithm_type::state_count; ++k)
        tessera::backend_ops<B>::fill(opt.state(u, k), typename Wrapper::main_type(0));
    opt.restore_counters(0, 0);
    what = "the weights of " + got.path.string();
  }
  if (talk)
    std::printf("%s: initialised from %s in %.2f s\n", program, what.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

//! What the loop knows when the model prints its banner.
struct run_facts {
  int world = 1;
  std::string mesh;  // " (mesh R x S, outer O)" or ""
  memory_estimate estimate;
  double init_s = 0, tokens_per_step = 0;
};

//! Trains `mdl` under Cfg over `comm`, or over the mesh m when given (comm is
//! then its shard group); `world` (MPI) carries the logged losses and the
//! agreement checks; `usage` is the device's own count of bytes in use.
//! Every file and directory the run reads: --data (each file a glob
//! matches), --load, --init-from, and the model's own (input_paths(), e.g.
//! --val-data), which no output of the run may overwrite.
template <class Model>
std::vector<input_path> input_paths(const Model& mdl) {
  const run_options& o = mdl.run();
  std::vector<input_path> in{{"--load", o.load}, {"--init-from", o.init_from}};
  for (const auto& p : matching_paths(o.data)) in.push_back({"--data", p});
  if constexpr (requires { mdl.input_paths(); })
    for (auto& p : mdl.input_paths()) in.push_back(std::move(p));
  return in;
}

template <class Cfg, class Model, class Comm>
int train(Model& mdl, tessera::comm::mpi& world, Comm& comm, tessera::comm::mesh<Comm>* m, const device_usage& usage) {
  using namespace tessera;
  using Wrapper = data_parallel_t<Cfg>;
  using B = typename Cfg::backend_type;
  using Net = typename Model::template net<Wrapper>;
  using clock = std::chrono::steady_clock;
  const run_options& o = mdl.run();
  const char* program = Model::program;
  const int N = world.size(), rank = world.rank();
  const bool talk = rank == 0;
  mdl.on_world(rank, N);
  // --save's directory is this job's for its whole life: a second job saving
  // there fails now, not after the two have mixed their checkpoints.
  const auto claim = o.save.empty() ? checkpoint::root_claim{} : checkpoint::claim_root(world, o.save);
  // --dump-weights's file is written after the run: a bad path is found now.
  if (!o.dump_weights.empty()) check_output_file(world, "--dump-weights", o.dump_weights, input_paths(mdl));
  const int count = o.deterministic ? o.accum / N : o.accum;  // micro-batches this rank runs per step

  memory_of<B>().reset_peak();
  memory_of<host_resident>().reset_peak();
  wrapper_options wo = mdl.wrapper_options();
  wo.offload_optimizer = o.offload;
  std::optional<Wrapper> holder;
  Wrapper& model = emplace_wrapper(holder, comm, m, wo);
  mdl.build(model);
  model.finalize();
  const auto t_init = clock::now();
  mdl.init(model, o.seed);
  const double init_s = std::chrono::duration<double>(clock::now() - t_init).count();
  ShardedOptimizer opt(model, adamw{.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = o.weight_decay},
                       optimizer_options{.clip_norm = o.clip, .overlap_updates = o.overlap_updates == "on",
                                         .offload_update = update_site_of(o.offload_update)});
  if (o.warmup > 0 || o.min_lr >= 0)
    opt.set_schedule([lr = o.lr, min_lr = o.min_lr, w = o.warmup, n = o.steps](long t, double) {
      return scheduled_lr(t, lr, min_lr, w, n);
    });

  // Resume: weights and optimizer state from any strategy, wrapper, mesh and
  // world size; the data stream continues where it stopped (batches are a
  // function of seed and step).
  long first_step = 0;
  std::uint64_t seed = o.seed;
  // The run's lineage (checkpoint::save_options): its checkpoint's where it
  // resumes, else a new one; --keep retires only this lineage's checkpoints.
  std::string lineage = talk ? new_lineage() : std::string();
  nlohmann::json fp8_resumed;  // the net's fp8 state the checkpoint kept (restored once the net exists)
  if (!o.load.empty()) {
    const auto t0 = clock::now();
    const auto got = checkpoint::load(opt, o.load);
    const double load_s = std::chrono::duration<double>(clock::now() - t0).count();
    first_step = check_resume_common(got.extra, got.path.string(), program, mdl.identity());
    mdl.check_resume(got.extra, got.path.string(), N, count);
    seed = got.extra["seed"].template get<std::uint64_t>();
    lineage = got.lineage;
    if (got.extra.contains("fp8")) fp8_resumed = got.extra["fp8"];
    if (talk && !o.json)
      std::printf("%s: resumed from %s (step %ld, written by %d rank%s with %s) in %.2f s (read and checked %.2f GB in "
                  "%.2f s, copied in %.2f s)\n", program, got.path.c_str(), first_step, got.world,
                  got.world == 1 ? "" : "s", got.strategy.c_str(), load_s, double(got.bytes_read) / 1e9,
                  got.read_seconds, got.apply_seconds);
    if (first_step >= o.steps && talk)  // every rank knows; one says it
      std::printf("%s: the checkpoint is at step %ld and --steps is %d: nothing to train (--steps is the total, "
                  "counting the steps it resumes past)\n", program, first_step, o.steps);
  }
  if (!o.init_from.empty()) init_weights(mdl, model, opt, o.init_from, program, talk && !o.json);
  if (!o.save.empty()) check_save_root(world, o.save, lineage);
  const auto crash_hook = crash_hook_from_env();

  // --cuda-graphs: each steady-state step one graph launch (tessera::step_graph,
  // which a CUDA net names); a step's micro-batches are staged before it.
  constexpr bool graphable = has_step_graph<Net, decltype(opt)>;
  const auto graph_choice = choose_step_graphs(o.cuda_graphs, graphable, N, o.deterministic, count,
                                               o.offload > 0 ? "an offloaded optimizer" : nullptr);
  const bool graphs = graph_choice.graphs;
  Net net = mdl.make_net(model, graphs ? count : 1);
  if constexpr (requires { net.restore_fp8(fp8_resumed, o.load); }) net.restore_fp8(fp8_resumed, o.load);
  auto save = [&](long next_step) {
    checkpoint::save_options so;
    so.keep = o.keep;
    so.lineage = lineage;
    so.at_point = crash_hook;
    so.extra = checkpoint_extra(program, next_step, seed, o.data, mdl.identity(), mdl.position(N, count));
    if constexpr (requires { net.fp8_state(); })  // fp8's delayed amax history, where the net keeps one
      if (auto s = net.fp8_state(); !s.is_null()) so.extra["fp8"] = std::move(s);
    const auto t0 = clock::now();
    const auto dir = checkpoint::save(opt, o.save, next_step, so);
    if (talk && !o.json)
      std::printf("%s: saved %s in %.2f s\n", program, dir.c_str(),
                  std::chrono::duration<double>(clock::now() - t0).count());
  };
  std::size_t prepared = 0;  // what the net's set-up added (gradient shards it could not lend)
  if constexpr (requires { mdl.prepare(net, model); }) prepared = mdl.prepare(net, model);
  auto runner = make_step_runner<Net>(opt, graphs);
  const double global_tokens = mdl.tokens_per_step(N, count);

  // The busiest rank's bytes, part by part (shards of sizes that do not
  // divide differ by rank): what tessera-plan memory reports.
  memory_estimate est{model.planned().total(), opt.state_bytes(), mdl.activation_bytes(net, model) + prepared,
                      Net::blas_workspace_bytes(), model.planned().host_main_weights + opt.offloaded_bytes()};
  {
    std::int64_t v[5] = {std::int64_t(est.model_state), std::int64_t(est.optimizer_state), std::int64_t(est.activations),
                         std::int64_t(est.blas_workspace), std::int64_t(est.offloaded)};
    comm::all_reduce(world, std::span<std::int64_t>(v, 5), comm::reduce_op::max);
    est = {std::size_t(v[0]), std::size_t(v[1]), std::size_t(v[2]), std::size_t(v[3]), std::size_t(v[4])};
  }
  const std::string mesh = m ? " (mesh " + std::to_string(model.replicas()) + " x " + std::to_string(model.world()) +
                                   ", outer " + std::string(Cfg::outer_type::name) + ")"
                             : "";
  if (talk && !o.json) mdl.banner(net, model, run_facts{N, mesh, est, init_s, global_tokens});

  // --deterministic: each global micro-batch's loss, summed in their order
  // (a sum over ranks would group by N). One rank holds each entry and the
  // others 0, so the sum over ranks is exact.
  std::vector<double> mb_loss(o.deterministic ? std::size_t(o.accum) : 0);
  auto batch = mdl.make_batch(), next = batch;
  auto sample = [&](auto& b, long step, int mb) { mdl.sample(b, seed, step, mb); };
  if (first_step < o.steps && !graphs) sample(batch, first_step, 0);

  // The host waits for the device only at a step whose loss it reads: one
  // printed (every --log-every, and the last), one before a checkpoint or a
  // validation, and the first (its time, set-up included, is not counted). A
  // printed line's time is the mean over the steps since the last wait;
  // saves and validations are left out of it.
  double final_loss = 0, val_loss = -1, total_s = 0, paused_s = 0;
  long timed = 0, steps_since = 0, last_saved = -1;
  auto since = clock::now();
  auto pause = [&](auto&& f) {
    const auto t0 = clock::now();
    f();
    paused_s += std::chrono::duration<double>(clock::now() - t0).count();
  };
  for (long step = first_step; step < o.steps; ++step) {
    fault_hook(rank, step);
    const bool last = step + 1 == o.steps;
    const bool shown = step % o.log_every == 0 || last;  // the same on every rank
    const bool saving = !o.save.empty() && o.save_every > 0 && (step + 1) % o.save_every == 0;
    bool validate = false;
    if constexpr (requires { mdl.validation_due(step, last); }) validate = mdl.validation_due(step, last);
    const bool synced = shown || saving || validate || step == first_step;
    // The last step is a profiler range where the net has one (CUDA: NVTX "tessera-step").
    if constexpr (requires { net.begin_range(); }) if (last) net.begin_range();
    step_handle<B> handle;
    if constexpr (graphable) {
      if (graphs) {
        // Every micro-batch staged into its own slot (the first step's here,
        // the next step's while this one runs), then the step issued (one
        // graph launch after the warm-up); its loss read after it.
        auto stage_step = [&](long k) {
          for (int mb = 0; mb < count; ++mb) {
            sample(batch, k, mb);
            mdl.stage(net, mb, batch);  // copies queued after the work before: slots reused safely
          }
        };
        if (step == first_step) stage_step(step);
        handle = runner.step([&] { mdl.forward_backward_slots(net, count, global_tokens); });
        net.finish_loss();
        if (!last) stage_step(step + 1);
        if (o.deterministic && synced) mb_loss[std::size_t(rank)] = net.take_loss();  // one micro-batch a rank
      }
    }
    if (!graphs) {
      for (int mb = 0; mb < count; ++mb) {
        model.begin_micro_batch(mb, count);
        mdl.forward_backward(net, batch, global_tokens);
        const bool last_mb = mb + 1 == count;
        if (!last_mb || !last) sample(next, last_mb ? step + 1 : step, last_mb ? 0 : mb + 1);
        std::swap(batch, next);
        if (o.deterministic) {  // each micro-batch's loss on its own
          net.finish_loss();
          if (synced) mb_loss[std::size_t(rank + mb * N)] = net.take_loss();
        }
      }
      if (!o.deterministic) net.finish_loss();
      if constexpr (requires { net.end_step(world); }) net.end_step(world);  // fp8's delayed amaxes
      handle = opt.step();  // read below only when a line is printed
    }
    if constexpr (requires { net.end_range(); }) if (last) net.end_range();
    ++steps_since;
    double loss = 0, s = 0;
    if (synced) {
      if (o.deterministic) {
        comm::all_reduce(world, std::span<double>(mb_loss), comm::reduce_op::sum);
        for (double v : mb_loss) loss += v;
        std::fill(mb_loss.begin(), mb_loss.end(), 0.0);
      } else {
        loss = net.take_loss();  // waits for this step's loss
        comm::all_reduce(world, std::span<double>(&loss, 1), comm::reduce_op::sum);
      }
      loss /= global_tokens;
      const auto now = clock::now();
      const double span = std::chrono::duration<double>(now - since).count() - paused_s;
      s = span / double(steps_since);  // seconds per step since the last wait
      // The first step pays for set-up (cuBLASLt's search, first touches): not counted, unless it is the only one.
      if (step > first_step || o.steps == first_step + 1) total_s += span, timed += steps_since;
      since = now, paused_s = 0, steps_since = 0;
      final_loss = loss;
    }
    if constexpr (requires { mdl.evaluate(net, world); })
      if (validate) pause([&] {
          runner.finish();  // a step graph leaves the step's updates for the next: this step's weights first
          val_loss = mdl.evaluate(net, world);
        });
    if constexpr (requires { net.choices(); })  // the products' forms, chosen by timing in the first step
      if (talk && step == 0 && !o.json && !net.choices().empty()) std::printf("products: %s\n", net.choices().c_str());
    if (talk && shown) {
      print_step({.step = step, .loss = loss, .seconds = s, .tokens = global_tokens,
                  .flops_per_token = mdl.flops_per_token(), .bytes_in_use = memory_of<B>().current(),
                  .val_loss = validate ? val_loss : -1},
                 handle.get(), o.json);
    } else if (talk && validate) {  // a validation between logged steps still gets its line
      print_validation(step, val_loss, o.json);
    }
    if (saving) pause([&] {  // after the wait above, so the save's time is all its own
        runner.finish();       // the weights of this step (the next step runs eagerly, then replays resume)
        save(last_saved = step + 1);
      });
  }
  runner.finish();  // a step graph leaves the last step's updates for a next step
  if constexpr (requires { mdl.evaluate(net, world); })
    if (first_step >= o.steps && mdl.validation_due(first_step, true)) {  // nothing trained: the weights as they are
      val_loss = mdl.evaluate(net, world);
      if (talk && !o.json) std::printf("step %5ld  val loss %.6f\n", first_step, val_loss);
    }
  // --steps 0 --save: the initial checkpoint (nothing resumed, nothing run).
  if (!o.save.empty() && last_saved != o.steps && (o.steps > first_step || (o.steps == 0 && o.load.empty())))
    save(o.steps);
  if (!o.dump_weights.empty()) {  // no strategy or world size: dumps of any compare with cmp
    auto meta = mdl.dump_metadata();
    meta["format"] = "pt", meta["model"] = program, meta["step"] = std::to_string(std::max<long>(o.steps, first_step));
    meta["seed"] = std::to_string(seed), meta["precision"] = o.precision;
    dump_weights(model, o.dump_weights, meta);
  }
  if constexpr (requires { mdl.after(net, world, seed); }) mdl.after(net, world, seed);
  // Peaks over all ranks: the busiest rank is what a machine must hold.
  std::int64_t peak[3] = {std::int64_t(memory_of<B>().peak()), std::int64_t(usage.used()),
                          std::int64_t(memory_of<host_resident>().peak())};
  comm::all_reduce(world, std::span<std::int64_t>(peak, 3), comm::reduce_op::max);
  if (talk) {
    const double tps = total_s > 0 ? global_tokens * double(timed) / total_s : 0.0;
    nlohmann::json j{{"summary", true}, {"final_loss", final_loss}, {"params", mdl.params()}, {"world", N},
                     {"shard_group", model.world()}, {"replicas", model.replicas()}, {"outer", Cfg::outer_type::name},
                     {"strategy", Cfg::strategy::name}, {"wrapper", Cfg::wrapper::name}, {"precision", o.precision},
                     {"backend", Net::backend_name}, {"deterministic", o.deterministic}, {"steps", o.steps},
                     {"skipped_steps", opt.skipped_steps()}, {"tokens_per_s", tps}, {"tokens_per_s_per_rank", tps / N},
                     {"tflops", mdl.flops_per_token() * tps / 1e12}, {"init_s", init_s},
                     {"cuda_graphs", runner.captured()}, {"graph_nodes", runner.nodes()},
                     {"peak_bytes", peak[0]}, {"device_used_bytes", peak[1]}, {"estimated_bytes", est.total()},
                     {"planned_model_state_bytes", est.model_state + est.optimizer_state},
                     {"offload_optimizer", o.offload}, {"offload_update", o.offload_update},
                     {"offloaded_bytes", peak[2]}, {"estimated_offloaded_bytes", est.offloaded}};
    if (val_loss >= 0) j["val_loss"] = val_loss;
    mdl.summary(j, net);
    print_summary(j, o.json, graph_choice.note(runner));
  }
  return 0;
}

//! train<Cfg>(model, ...) for the precision, wrapper, strategy and mesh the
//! run options name, with reduction policy R (exact_reduction under
//! --deterministic), over `comm` or a mesh split from it.
template <class B, class R, class Comm, class Model>
int run_configured(const run_options& o, tessera::comm::mpi& world, Comm& comm, Model& model, const device_usage& usage) {
  using namespace tessera;
  auto run = [&]<class Cfg>() {
    return on_world_or_mesh(o.shard_group, world, comm,
                            [&](Comm& c, comm::mesh<Comm>* m) { return train<Cfg>(model, world, c, m, usage); });
  };
  // fp8: bf16's configuration (bf16 compute weights, fp32 main weights and
  // gradients); the net casts the linear layers' operands to fp8 itself.
  const auto rc = o.precision != "fp32" ? with_config<mixed_precision<bf16, float>, B, R>(o.wrapper, o.strategy, o.outer, run)
                                        : with_config<full_precision<float>, B, R>(o.wrapper, o.strategy, o.outer, run);
  if (rc) return *rc;
  std::fprintf(stderr, "tessera: no compiled instantiation for --wrapper %s --strategy %s\n", o.wrapper.c_str(),
               o.strategy.c_str());
  return 2;
}

}  // namespace trainer_kit
