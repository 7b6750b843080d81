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
inline void check_resume_fields(const nlohmann::json& x, const std::string& path, const options& o, int world) {
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
  const long long mine = (long long)o.batch * world * o.accum;
  if (global != mine || seq != o.shape.seq)
    throw tessera::error("checkpoint '" + path + "' was trained on global batches of " + std::to_string(global) +
                         " sequences of " + std::to_string(seq) + " tokens; this run has " + std::to_string(mine) +
                         " of " + std::to_string(o.shape.seq) + " (--batch x ranks x --accum, --seq): resume with the "
                         "same to continue its data stream");
}

//! The run's training data and its validation data (nullptr: none), read
//! before MPI starts so that a bad file is one message and exit 2 on every rank.
struct datasets {
  corpus train;
  std::optional<corpus> val;
};

//! Trains over `comm` (the wrapper's communicator); `world` (MPI) carries the
//! logged losses and the agreement checks.
template <class Cfg, template <class> class Net, class Comm>
int train(const options& o_in, tessera::comm::mpi& world, Comm& comm, const datasets& sets) {
  using namespace tessera;
  using Wrapper = data_parallel_t<Cfg>;
  using B = typename Cfg::backend_type;
  options o = o_in;
  const int N = world.size(), r = world.rank();
  const model_shape& shape = o.shape;
  // --save's directory is this job's for its whole life: a second job saving
  // there fails now, not after the two have mixed their checkpoints.
  const auto claim = o.save.empty() ? checkpoint::root_claim{} : checkpoint::claim_root(world, o.save);
  const bool talk = r == 0;

  memory_of<B>().reset_peak();
  // Three gather buffers: the embed unit, held for the whole micro-batch,
  // and two for the blocks (one in use, one prefetching).
  Wrapper model(comm, wrapper_options{.gather_buffers = 3});
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
    check_resume_fields(got.extra, got.path.string(), o, N);
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
    so.extra = {{"next_step", next_step}, {"seed", o.seed}, {"global_sequences", (long long)o.batch * N * o.accum},
                {"seq", shape.seq}, {"data", o.data}, {"model", "tessera-gpt"}, {"layers", shape.layers},
                {"heads", shape.heads}, {"d", shape.d}, {"vocab", shape.vocab}, {"max_seq", shape.positions()}};
    const auto t0 = std::chrono::steady_clock::now();
    const auto dir = checkpoint::save(opt, o.save, next_step, so);
    if (talk && !o.json)
      std::printf("tessera-gpt: saved %s in %.2f s\n", dir.c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };

  Net<Wrapper> net(model, ids, shape, o.batch, net_options{.recompute = o.recompute});
  const std::size_t row = std::size_t(shape.seq) + 1;
  std::vector<std::uint16_t> seqs(std::size_t(o.batch) * row);
  const double global_tokens = double(o.batch) * N * o.accum * shape.seq;
  // Rank r's sequences of micro-batch k: global indices (k N + r) batch + j.
  auto sample = [&](long step, int k) {
    for (int j = 0; j < o.batch; ++j)
      data.sequence(o.seed, step, std::uint64_t((long(k) * N + r) * o.batch + j), seqs.data() + std::size_t(j) * row);
  };
  // The fixed validation set: val_batches global batches, each rank its part.
  auto evaluate = [&] {
    double loss = 0;
    for (int b = 0; b < o.val_batches; ++b) {
      for (int j = 0; j < o.batch; ++j)
        val->eval_sequence(std::uint64_t((long(b) * N + r) * o.batch + j), seqs.data() + std::size_t(j) * row);
      loss += net.forward_loss(seqs.data(), o.batch);
    }
    comm::all_reduce(world, std::span<double>(&loss, 1), comm::reduce_op::sum);
    return loss / (double(o.val_batches) * N * o.batch * shape.seq);
  };

  const std::size_t est = model.planned().total() + opt.state_bytes() +
                          Net<Wrapper>::workspace_bytes(shape, o.batch, net_options{.recompute = o.recompute});
  if (talk && !o.json)
    std::printf("tessera-gpt: backend %s, %s / %s / %s, %d rank%s, %zu parameters (%d layers, %d heads, d %d, seq %d, "
                "vocab %d padded to %d), %.0f tokens per step, data %zu file%s of %zu tokens, weights initialised in "
                "%.2f s, attention %s, estimated memory %s MiB per rank\n",
                Net<Wrapper>::backend_name, std::string(Cfg::wrapper::name).c_str(), std::string(Cfg::strategy::name).c_str(),
                o.precision.c_str(), N, N == 1 ? "" : "s", shape.params(), shape.layers, shape.heads, shape.d, shape.seq,
                shape.vocab, shape.padded_vocab(), global_tokens, data.files(), data.files() == 1 ? "" : "s",
                data.tokens(), init_s, net.attention_name(), trainer_kit::mib(est).c_str());

  using clock = std::chrono::steady_clock;
  double final_loss = 0, val_loss = -1, total_s = 0;
  long timed = 0, last_saved = -1;
  for (long step = first_step; step < o.steps; ++step) {
    trainer_kit::fault_hook(r, step);
    const auto t0 = clock::now();
    // The last step is a profiler range where the net has one (CUDA: NVTX "tessera-step").
    const bool marked = step + 1 == o.steps;
    if constexpr (requires { net.begin_range(); }) if (marked) net.begin_range();
    for (int k = 0; k < o.accum; ++k) {
      model.begin_micro_batch(k, o.accum);
      sample(step, k);
      net.forward_backward(seqs.data(), o.batch, global_tokens);
    }
    net.finish_loss();
    const step_result res = opt.step().get();
    if constexpr (requires { net.end_range(); }) if (marked) net.end_range();
    double loss = net.take_loss();
    comm::all_reduce(world, std::span<double>(&loss, 1), comm::reduce_op::sum);
    loss /= global_tokens;
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    if (step > first_step || o.steps == first_step + 1) total_s += s, ++timed;
    final_loss = loss;
    const bool last = step + 1 == o.steps;
    const bool shown = step % o.log_every == 0 || last;
    const bool validate = val && ((o.val_every > 0 && (step + 1) % o.val_every == 0) || last);
    if (validate) val_loss = evaluate();
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
    } else if (talk && validate && !o.json) {
      std::printf("step %5ld  val loss %.4f\n", step, val_loss);
    }
    if (!o.save.empty() && o.save_every > 0 && (step + 1) % o.save_every == 0) save(last_saved = step + 1);
  }
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
                     {"init_s", init_s}, {"attention", net.attention_name()},
                     {"products", net.products_used()}};
    if (val_loss >= 0) j["val_loss"] = val_loss;
    if (o.json) std::printf("%s\n", j.dump().c_str());
    else
      std::printf("done: final loss %.4f%s, %.0f tokens/s over %d rank%s, peak %.2f MiB per rank (library buffers; "
                  "estimate %.2f MiB)\n",
                  final_loss, val_loss >= 0 ? (", validation loss " + std::to_string(val_loss)).c_str() : "", tps, N,
                  N == 1 ? "" : "s", double(peak) / (1 << 20), double(est) / (1 << 20));
  }
  return 0;
}

//! train<Cfg> for the precision, wrapper and strategy named in o.
template <class B, template <class> class Net, class Comm>
int dispatch(const options& o, tessera::comm::mpi& world, Comm& comm, const datasets& sets) {
  using namespace tessera;
  auto run = [&]<class Cfg>() { return train<Cfg, Net>(o, world, comm, sets); };
  const auto rc = o.precision == "bf16"
                      ? trainer_kit::with_config<mixed_precision<bf16, float>, B>(o.wrapper, o.strategy, "no_shard", run)
                      : trainer_kit::with_config<full_precision<float>, B>(o.wrapper, o.strategy, "no_shard", run);
  if (rc) return *rc;
  std::fprintf(stderr, "tessera: no compiled instantiation for --wrapper %s --strategy %s\n", o.wrapper.c_str(),
               o.strategy.c_str());
  return 2;
}

}  // namespace gpt
