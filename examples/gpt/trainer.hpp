#pragma once
// The training loop of tessera-gpt: GPT-2 under any compiled strategy and
// wrapper, AdamW with warm-up and a cosine schedule, evaluation, checkpoints
// that resume and reshard, the final weights as one file, and sampling.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpt/data.hpp"
#include "gpt/host_compute.hpp"
#include "gpt/model.hpp"
#include "options.hpp"
#include "tessera/checkpoint/checkpoint.hpp"
#include "tessera/tessera.hpp"
#include "trainer_kit/configs.hpp"
#include "trainer_kit/mesh.hpp"
#include "trainer_kit/host_math.hpp"
#include "trainer_kit/run.hpp"

namespace gpt {

//! The learning rate of step t (1-based): linear warm-up over `warmup` steps,
//! then a cosine from lr down to min_lr at the last step.
inline double scheduled_lr(long t, double lr, double min_lr, int warmup, int steps) {
  if (warmup > 0 && t <= warmup) return lr * double(t) / double(warmup);
  const double span = std::max(1, steps - warmup);
  const double progress = std::min(1.0, double(t - warmup) / span);
  return min_lr + 0.5 * (1.0 + std::cos(3.141592653589793 * progress)) * (lr - min_lr);
}

//! The checkpoint fields that say where the data stream is and what made it.
inline void check_resume_fields(const nlohmann::json& x, const std::string& path, const options& o, long long mine) {
  auto integer = [&](const char* k, long long lo, long long hi) {
    if (!x.contains(k) || !x[k].is_number_integer() || x[k].get<long long>() < lo || x[k].get<long long>() > hi)
      throw tessera::error("checkpoint '" + path + "': field '" + k + "' is missing or not an integer in [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "] (not written by tessera-gpt?)");
    return x[k].get<long long>();
  };
  integer("next_step", 0, 1LL << 40);
  const long long global = integer("global_sequences", 1, 1LL << 40), seq = integer("seq", 1, 1 << 16);
  if (!x.contains("seed") || !x["seed"].is_number_unsigned())
    throw tessera::error("checkpoint '" + path + "': field 'seed' is missing or not a non-negative integer");
  if (global != mine || seq != o.shape.seq)
    throw tessera::error("checkpoint '" + path + "' was trained on global batches of " + std::to_string(global) +
                         " sequences of " + std::to_string(seq) + " tokens; this run has " + std::to_string(mine) +
                         " of " + std::to_string(o.shape.seq) + " (--batch x ranks x --accum, --seq): resume with the "
                         "same to continue its data stream");
  // A deterministic run's bits depend on its micro-batch; it continues only
  // deterministically, from a deterministic checkpoint of the same micro-batch.
  const long long micro = x.contains("deterministic_batch") && x["deterministic_batch"].is_number_integer()
                              ? x["deterministic_batch"].get<long long>() : 0;
  if (micro != (o.deterministic ? o.batch : 0))
    throw tessera::error("checkpoint '" + path + "' was written " +
                         (micro ? "with --deterministic --batch " + std::to_string(micro) : std::string("without --deterministic")) +
                         "; resume it the same way (a run is deterministic from its first step or not at all)");
}

//! The run's training data and its validation data (nullptr: none), read
//! before MPI starts so that a bad file is one message and exit 2 on every rank.
struct datasets {
  corpus train;
  std::optional<corpus> val;
};

//! Trains over `comm` (the wrapper's communicator), or over the mesh m when
//! given (comm is then its shard group); `world` (MPI) carries the logged
//! losses and the agreement checks.
template <class Cfg, template <class> class Net, class Comm>
int train(const options& o_in, tessera::comm::mpi& world, Comm& comm, tessera::comm::mesh<Comm>* m, const datasets& sets) {
  using namespace tessera;
  using Wrapper = data_parallel_t<Cfg>;
  using B = typename Cfg::backend_type;
  options o = o_in;
  const int N = world.size(), r = world.rank();
  const model_shape& shape = o.shape;
  // --save's directory is this job's for its whole life: a second job saving
  // there fails now, not after the two have mixed their checkpoints.
  const auto claim = o.save.empty() ? checkpoint::root_claim{} : checkpoint::claim_root(world, o.save);
  // --dump-weights's file is written after the run: a bad path is found now.
  if (!o.dump_weights.empty()) trainer_kit::check_output_file(world, "--dump-weights", o.dump_weights);
  const bool talk = r == 0;
  // --deterministic: --accum global micro-batches, rank r running r, r + N, ...
  TESSERA_CHECK(!o.deterministic || o.accum % N == 0, "--deterministic: ", o.accum, " micro-batches (--accum) do not "
                "split evenly over ", N, " ranks; choose a world size that divides ", o.accum);
  const int count = o.deterministic ? o.accum / N : o.accum;  // micro-batches this rank runs per step

  memory_of<B>().reset_peak();
  // Three gather buffers: the embed unit, held for the whole micro-batch,
  // and two for the blocks (one in use, one prefetching).
  std::optional<Wrapper> holder;
  Wrapper& model = trainer_kit::emplace_wrapper(holder, comm, m, wrapper_options{.gather_buffers = 3});
  const model_ids ids = register_model(model, shape);
  model.finalize();
  const auto t_init = std::chrono::steady_clock::now();
  init_model(model, ids, shape, o.seed);
  const double init_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_init).count();
  ShardedOptimizer opt(model, adamw{.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = o.weight_decay},
                       optimizer_options{.clip_norm = o.clip});
  opt.set_schedule([lr = o.lr, min_lr = o.min_lr, w = o.warmup, n = o.steps](long t, double) {
    return scheduled_lr(t, lr, min_lr, w, n);
  });

  long first_step = 0;
  if (!o.load.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto got = checkpoint::load(opt, o.load);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    check_resume_fields(got.extra, got.path.string(), o, (long long)o.batch * N * count);
    first_step = got.extra["next_step"].template get<long>();
    o.seed = got.extra["seed"].template get<std::uint64_t>();
    if (talk && !o.json)
      std::printf("tessera-gpt: resumed from %s (step %ld, written by %d rank%s with %s) in %.2f s (read and checked "
                  "%.2f GB in %.2f s, copied in %.2f s)\n", got.path.c_str(), first_step, got.world,
                  got.world == 1 ? "" : "s", got.strategy.c_str(), load_s, double(got.bytes_read) / 1e9, got.read_seconds,
                  got.apply_seconds);
    if (first_step >= o.steps && talk)
      std::printf("tessera-gpt: the checkpoint is at step %ld and --steps is %d: nothing to train (--steps is the "
                  "total, counting the steps it resumes past)\n", first_step, o.steps);
  }
  const corpus& data = sets.train;
  const std::optional<corpus>& val = sets.val;
  const auto crash_hook = trainer_kit::crash_hook_from_env();
  auto save = [&](long next_step) {
    checkpoint::save_options so;
    so.keep = o.keep;
    so.at_point = crash_hook;
    so.extra = {{"next_step", next_step}, {"seed", o.seed}, {"global_sequences", (long long)o.batch * N * count},
                {"seq", shape.seq}, {"data", o.data}, {"model", "tessera-gpt"}, {"layers", shape.layers},
                {"heads", shape.heads}, {"d", shape.d}, {"vocab", shape.vocab}, {"max_seq", shape.positions()}};
    if (o.deterministic) so.extra["deterministic_batch"] = o.batch;
    const auto t0 = std::chrono::steady_clock::now();
    const auto dir = checkpoint::save(opt, o.save, next_step, so);
    if (talk && !o.json)
      std::printf("tessera-gpt: saved %s in %.2f s\n", dir.c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };

  // --cuda-graphs: each steady-state step one graph launch (tessera::step_graph,
  // which the CUDA net names); a step's micro-batches are staged before it.
  using Net_t = Net<Wrapper>;
  constexpr bool graphable = trainer_kit::has_step_graph<Net_t, decltype(opt)>;
  const auto graph_choice = trainer_kit::choose_step_graphs(o.cuda_graphs, graphable, N, o.deterministic, count);
  const bool graphs = graph_choice.graphs;
  const net_options nopt{.recompute = o.recompute, .attention = o.attention, .deterministic = o.deterministic,
                         .input_slots = graphs ? count : 1, .keep_gelu = o.keep_gelu};
  Net_t net(model, ids, shape, o.batch, nopt);
  auto runner = trainer_kit::make_step_runner<Net_t>(opt, graphs);
  const std::size_t row = std::size_t(shape.seq) + 1;
  std::vector<std::uint16_t> seqs(std::size_t(o.batch) * row);
  const double global_tokens = double(o.batch) * N * count * shape.seq;
  // Rank r's sequences of micro-batch k: global indices (k N + r) batch + j
  // (so under --deterministic global micro-batch k N + r holds the same
  // sequences at any N).
  auto sample = [&](long step, int k) {
    for (int j = 0; j < o.batch; ++j)
      data.sequence(o.seed, step, std::uint64_t((long(k) * N + r) * o.batch + j), seqs.data() + std::size_t(j) * row);
  };
  // --deterministic: each global micro-batch's loss, summed in their order
  // (a sum over ranks would group by N). One rank holds each entry and the
  // others 0, so the sum over ranks is exact.
  auto in_order = [&](std::vector<double>& per_micro) {
    comm::all_reduce(world, std::span<double>(per_micro), comm::reduce_op::sum);
    double sum = 0;
    for (double v : per_micro) sum += v;
    std::fill(per_micro.begin(), per_micro.end(), 0.0);
    return sum;
  };
  std::vector<double> micro_loss(o.deterministic ? std::size_t(o.accum) : 0);
  // The fixed validation set: val_batches global batches (--deterministic:
  // of this run's global batch; else of N x --batch sequences), each rank
  // its micro-batches k N + r.
  const int val_count = o.deterministic ? o.val_batches * count : o.val_batches;
  std::vector<double> val_micro(o.deterministic ? std::size_t(val_count) * N : 0);
  auto evaluate = [&] {
    double loss = 0;
    for (int k = 0; k < val_count; ++k) {
      for (int j = 0; j < o.batch; ++j)
        val->eval_sequence(std::uint64_t((long(k) * N + r) * o.batch + j), seqs.data() + std::size_t(j) * row);
      const double l = net.forward_loss(seqs.data(), o.batch);
      if (o.deterministic) val_micro[std::size_t(k) * N + r] = l;
      else loss += l;
    }
    if (o.deterministic) loss = in_order(val_micro);
    else comm::all_reduce(world, std::span<double>(&loss, 1), comm::reduce_op::sum);
    return loss / (double(val_count) * N * o.batch * shape.seq);
  };

  // The busiest rank's (shards of sizes that do not divide differ by rank): what tessera-plan memory reports.
  const std::size_t widened =  // the host net's fp32 copies of bf16 units
      trainer_kit::widened_bytes<Net<Wrapper>>(ids, [&](tessera::unit_id u) { return model.layout(u).padded_numel(); });
  std::size_t est = model.planned().total() + opt.state_bytes() + Net<Wrapper>::workspace_bytes(shape, o.batch, nopt) +
                    widened + Net<Wrapper>::blas_workspace_bytes() + net.runtime_workspace_bytes();
  {
    auto busiest = std::int64_t(est);
    comm::all_reduce(world, std::span<std::int64_t>(&busiest, 1), comm::reduce_op::max);
    est = std::size_t(busiest);
  }
  if (talk && !o.json)
    std::printf("tessera-gpt: backend %s, %s / %s / %s%s, %d rank%s%s, %zu parameters (%d layers, %d heads, d %d, seq %d, "
                "vocab %d padded to %d), %.0f tokens per step, data %zu file%s of %zu tokens, weights initialised in "
                "%.2f s, attention %s%s, estimated memory %s MiB on the busiest rank\n",
                Net<Wrapper>::backend_name, std::string(Cfg::wrapper::name).c_str(), std::string(Cfg::strategy::name).c_str(),
                o.precision.c_str(), o.deterministic ? " (deterministic)" : "", N, N == 1 ? "" : "s",
                m ? (" (mesh " + std::to_string(model.replicas()) + " x " + std::to_string(model.world()) + ", outer " +
                     std::string(Cfg::outer_type::name) + ")").c_str()
                  : "",
                shape.params(), shape.layers, shape.heads, shape.d, shape.seq,
                shape.vocab, shape.padded_vocab(), global_tokens, data.files(), data.files() == 1 ? "" : "s",
                data.tokens(), init_s, std::string(net.attention_name()).c_str(),
                o.keep_gelu && !o.recompute ? ", GELU outputs kept for backward" : "", trainer_kit::mib(est).c_str());

  using clock = std::chrono::steady_clock;
  double final_loss = 0, val_loss = -1, total_s = 0;
  long timed = 0, last_saved = -1;
  for (long step = first_step; step < o.steps; ++step) {
    trainer_kit::fault_hook(r, step);
    const auto t0 = clock::now();
    // The last step is a profiler range where the net has one (CUDA: NVTX "tessera-step").
    const bool marked = step + 1 == o.steps;
    if constexpr (requires { net.begin_range(); }) if (marked) net.begin_range();
    step_result res;
    if constexpr (graphable) {
      if (graphs) {  // every micro-batch in its own slot, then the step (one graph launch after the warm-up)
        for (int k = 0; k < count; ++k) {
          sample(step, k);
          net.stage(k, seqs.data(), o.batch);
        }
        const auto handle = runner.step([&] { net.forward_backward_slots(count, o.batch, global_tokens); });
        net.finish_loss();
        if (o.deterministic) micro_loss[std::size_t(r)] = net.take_loss();  // one micro-batch (checked above)
        res = handle.get();
      }
    }
    if (!graphs) {
      for (int k = 0; k < count; ++k) {
        model.begin_micro_batch(k, count);
        sample(step, k);
        net.forward_backward(seqs.data(), o.batch, global_tokens);
        if (o.deterministic) {  // each micro-batch's loss on its own
          net.finish_loss();
          micro_loss[std::size_t(k) * N + r] = net.take_loss();
        }
      }
      if (!o.deterministic) net.finish_loss();
      res = opt.step().get();
    }
    if constexpr (requires { net.end_range(); }) if (marked) net.end_range();
    double loss = 0;
    if (o.deterministic) {
      loss = in_order(micro_loss);
    } else {
      loss = net.take_loss();
      comm::all_reduce(world, std::span<double>(&loss, 1), comm::reduce_op::sum);
    }
    loss /= global_tokens;
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    if (step > first_step || o.steps == first_step + 1) total_s += s, ++timed;
    final_loss = loss;
    const bool last = step + 1 == o.steps;
    const bool shown = step % o.log_every == 0 || last;
    const bool validate = val && ((o.val_every > 0 && (step + 1) % o.val_every == 0) || last);
    if (validate) {
      runner.finish();  // a step graph leaves the step's updates for the next: this step's weights first
      val_loss = evaluate();
    }
    if (talk && shown) {
      const double tps = global_tokens / s;
      if (o.json) {
        nlohmann::json j{{"step", step}, {"loss", loss}, {"grad_norm", res.grad_norm}, {"lr", res.lr},
                         {"ms", s * 1e3}, {"tokens_per_s", tps}, {"skipped", res.skipped}};
        if (validate) j["val_loss"] = val_loss;
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("step %5ld  loss %.4f  grad_norm %.3f  lr %.2e  %8.2f ms  %10.0f tokens/s%s%s\n", step, loss,
                    res.grad_norm, res.lr, s * 1e3, tps, validate ? ("  val " + std::to_string(val_loss)).c_str() : "",
                    res.skipped ? "  (skipped)" : "");
      }
      std::fflush(stdout);
    } else if (talk && validate) {  // a validation between logged steps still gets its line
      if (o.json) std::printf("%s\n", nlohmann::json{{"step", step}, {"val_loss", val_loss}}.dump().c_str());
      else std::printf("step %5ld  val loss %.4f\n", step, val_loss);
      std::fflush(stdout);
    }
    if (!o.save.empty() && o.save_every > 0 && (step + 1) % o.save_every == 0) {
      runner.finish();  // (the next step then runs eagerly, and replays resume after it)
      save(last_saved = step + 1);
    }
  }
  runner.finish();  // the last step's updates, before the weights are read, saved or sampled
  if (val && first_step >= o.steps) {  // nothing trained (--steps 0, or resumed at the end): the weights as they are
    val_loss = evaluate();
    if (talk && !o.json) std::printf("step %5ld  val loss %.6f\n", first_step, val_loss);
  }
  if (!o.save.empty() && last_saved != o.steps && (o.steps > first_step || (o.steps == 0 && o.load.empty())))
    save(o.steps);
  if (!o.dump_weights.empty())
    trainer_kit::dump_weights(model, o.dump_weights,
                              {{"format", "pt"}, {"model", "tessera-gpt"}, {"step", std::to_string(std::max<long>(o.steps, first_step))},
                               {"layers", std::to_string(shape.layers)}, {"heads", std::to_string(shape.heads)},
                               {"d", std::to_string(shape.d)}, {"seq", std::to_string(shape.seq)},
                               {"max_seq", std::to_string(shape.positions())}, {"vocab", std::to_string(shape.vocab)},
                               {"padded_vocab", std::to_string(shape.padded_vocab())}, {"seed", std::to_string(o.seed)},
                               {"precision", o.precision}});
  if (o.sample > 0) {
    // Every rank runs the same forwards (gathers are collective) and draws
    // the same tokens: a counter-based draw from the softmax, keyed by the seed.
    std::vector<std::uint16_t> ctx(row);
    (val ? *val : data).eval_sequence(0, ctx.data());
    std::vector<std::uint16_t> text(ctx.begin(), ctx.begin() + std::min<std::ptrdiff_t>(16, shape.seq));
    const std::size_t prompt = text.size();
    for (int i = 0; i < o.sample; ++i) {
      const std::size_t len = std::min<std::size_t>(text.size(), std::size_t(shape.seq));
      const std::vector<float> z = net.next_logits(text.data() + text.size() - len, int(len));
      const float mx = *std::max_element(z.begin(), z.end());
      double sum = 0;
      for (float v : z) sum += std::exp(double(v - mx));
      double u = tessera::unit_interval(tessera::counter_random(o.seed, tessera::key_of("sample"), std::uint64_t(i)).a) * sum;
      std::size_t t = 0;
      for (; t + 1 < z.size(); ++t)
        if ((u -= std::exp(double(z[t] - mx))) <= 0) break;
      text.push_back(std::uint16_t(t));
    }
    if (talk) {
      std::string out;
      for (std::size_t i = 0; i < text.size(); ++i) {
        if (i == prompt) out += "|>";
        if (shape.vocab <= 256 && ((text[i] >= 32 && text[i] < 127) || text[i] == '\n')) {
          out += char(text[i]);
        } else if (shape.vocab <= 256) {  // bytes that are not printable ASCII, escaped: the line stays text
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\x%02x", unsigned(text[i]));
          out += esc;
        }
        else out += (i ? " " : "") + std::to_string(text[i]);
      }
      std::printf("sample (prompt|>generated): %s\n", out.c_str());
    }
  }
  std::int64_t peak = std::int64_t(memory_of<B>().peak());
  comm::all_reduce(world, std::span<std::int64_t>(&peak, 1), comm::reduce_op::max);
  if (talk) {
    const double tps = total_s > 0 ? global_tokens * double(timed) / total_s : 0.0;
    nlohmann::json j{{"summary", true}, {"final_loss", final_loss}, {"params", shape.params()}, {"world", N},
                     {"strategy", Cfg::strategy::name}, {"wrapper", Cfg::wrapper::name}, {"precision", o.precision},
                     {"backend", Net<Wrapper>::backend_name}, {"steps", o.steps}, {"tokens_per_s", tps},
                     {"tflops", shape.flops_per_token() * tps / 1e12}, {"peak_bytes", peak}, {"estimated_bytes", est},
                     {"attention_workspace_bytes", net.runtime_workspace_bytes()},
                     {"init_s", init_s}, {"attention", net.attention_name()}, {"deterministic", o.deterministic},
                     {"recompute", o.recompute}, {"keep_gelu", o.keep_gelu},
                     {"shard_group", model.world()}, {"replicas", model.replicas()}, {"outer", Cfg::outer_type::name},
                     {"products", net.products_used()}, {"cuda_graphs", runner.captured()},
                     {"graph_nodes", runner.nodes()}};
    if (val_loss >= 0) j["val_loss"] = val_loss;
    if (o.json) std::printf("%s\n", j.dump().c_str());
    else
      std::printf("done: final loss %.4f%s, %.0f tokens/s over %d rank%s%s, peak %.2f MiB per rank (library buffers; "
                  "estimate %.2f MiB)\n",
                  final_loss, val_loss >= 0 ? (", validation loss " + std::to_string(val_loss)).c_str() : "", tps, N,
                  N == 1 ? "" : "s",
                  graph_choice.note(runner).c_str(),
                  double(peak) / (1 << 20), double(est) / (1 << 20));
  }
  return 0;
}

//! train<Cfg> for the precision, wrapper, strategy and mesh named in o, with
//! reduction policy R (exact_reduction under --deterministic).
template <class B, template <class> class Net, class R = tessera::float_reduction, class Comm>
int dispatch(const options& o, tessera::comm::mpi& world, Comm& comm, const datasets& sets) {
  using namespace tessera;
  auto run = [&]<class Cfg>() {
    return trainer_kit::on_world_or_mesh(o.shard_group, world, comm, [&](Comm& c, comm::mesh<Comm>* m) {
      return train<Cfg, Net>(o, world, c, m, sets);
    });
  };
  const auto rc = o.precision == "bf16"
                      ? trainer_kit::with_config<mixed_precision<bf16, float>, B, R>(o.wrapper, o.strategy, o.outer, run)
                      : trainer_kit::with_config<full_precision<float>, B, R>(o.wrapper, o.strategy, o.outer, run);
  if (rc) return *rc;
  std::fprintf(stderr, "tessera: no compiled instantiation for --wrapper %s --strategy %s\n", o.wrapper.c_str(),
               o.strategy.c_str());
  return 2;
}

//! dispatch<backend::host, host_gpt, exact_reduction> (exact.cpp: its own
//! translation unit, compiled in parallel with main's).
int run_exact_host(const options& o, tessera::comm::mpi& world, const datasets& sets);
//! The CUDA backend's exact_reduction instantiations (exact_cuda.cu, in CUDA builds).
int run_exact_cuda(const options& o, tessera::comm::mpi& world, const datasets& sets);

}  // namespace gpt
