// tessera-mlp-lm: the reference trainer. A byte-level MLP language model
// trained with any Tessera strategy and wrapper chosen at run time among the
// compiled instantiations. Run under mpirun for several ranks.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data.hpp"
#include "host_compute.hpp"
#include "model.hpp"
#include "options.hpp"
#include "tessera/tessera.hpp"

namespace mlp_lm {
using namespace tessera;

template <class Cfg>
int train(const options& o, comm::mpi& world) {
  using Wrapper = data_parallel_t<Cfg>;
  const int N = world.size(), r = world.rank();
  const model_shape shape{o.layers, o.d, o.ctx};
  const corpus data(o.data, o.seed, o.ctx);

  memory_of<backend::host>().reset_peak();
  Wrapper model(world);
  const model_ids ids = register_model(model, shape);
  model.finalize();
  init_model(model, ids, shape, o.seed);
  ShardedOptimizer opt(model, adamw{.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = o.weight_decay},
                       optimizer_options{.clip_norm = o.clip});
  if (o.warmup > 0)
    opt.set_schedule([w = o.warmup](long step, double lr) { return lr * std::min(1.0, double(step) / w); });

  // The global micro-batch is split into contiguous, possibly uneven slices.
  const long per_mb = o.tokens / o.accum;
  const long lo = per_mb * r / N, hi = per_mb * (r + 1) / N;
  const std::size_t n = std::size_t(hi - lo);
  host_mlp<Wrapper> net(model, ids, shape, std::max<std::size_t>(n, 1));
  std::vector<std::uint8_t> ctx(std::max<std::size_t>(n, 1) * std::size_t(o.ctx)), tgt(std::max<std::size_t>(n, 1));

  const bool talk = r == 0;
  if (talk && !o.json)
    std::printf("tessera-mlp-lm: backend host, %s / %s / %s, %d rank%s, %zu parameters, %ld tokens per step, "
                "planned model state %.2f MiB per rank\n",
                std::string(Cfg::wrapper::name).c_str(), std::string(Cfg::strategy::name).c_str(),
                o.precision.c_str(), N, N == 1 ? "" : "s", shape.params(), o.tokens,
                double(model.planned().total() + opt.state_bytes()) / (1 << 20));
  double final_loss = 0, total_s = 0;
  for (long step = 0; step < o.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    double loss = 0;
    for (int mb = 0; mb < o.accum; ++mb) {
      model.begin_micro_batch(mb, o.accum);
      for (std::size_t j = 0; j < n; ++j) tgt[j] = data.sample(o.seed, step, mb, lo + long(j), &ctx[j * std::size_t(o.ctx)]);
      loss += net.forward_backward(ctx.data(), tgt.data(), n, double(o.tokens));
    }
    const step_result res = opt.step();
    comm::all_reduce(world, std::span<double>(&loss, 1), comm::reduce_op::sum);
    loss /= double(o.tokens);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total_s += s;
    final_loss = loss;
    if (talk && (step % o.log_every == 0 || step == o.steps - 1)) {
      const double tps = double(o.tokens) / s;
      if (o.json) {
        nlohmann::json j{{"step", step},         {"loss", loss},        {"grad_norm", res.grad_norm},
                         {"ms", s * 1e3},         {"tokens_per_s", tps}, {"lr", res.lr},
                         {"skipped", res.skipped}, {"tflops", shape.flops_per_token() * tps / 1e12},
                         {"bytes_in_use", memory_of<backend::host>().current()}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("step %5ld  loss %.4f  grad_norm %.3f  %8.2f ms  %10.0f tokens/s  %.4f TFLOP/s%s\n", step, loss,
                    res.grad_norm, s * 1e3, tps, shape.flops_per_token() * tps / 1e12, res.skipped ? "  (skipped)" : "");
      }
      std::fflush(stdout);
    }
  }
  // Peak over all ranks: the busiest rank is what a machine must hold.
  std::int64_t peak = std::int64_t(memory_of<backend::host>().peak());
  comm::all_reduce(world, std::span<std::int64_t>(&peak, 1), comm::reduce_op::max);
  if (talk) {
    nlohmann::json j{{"summary", true},
                     {"final_loss", final_loss},
                     {"params", shape.params()},
                     {"world", N},
                     {"strategy", Cfg::strategy::name},
                     {"wrapper", Cfg::wrapper::name},
                     {"precision", o.precision},
                     {"backend", "host"},
                     {"steps", o.steps},
                     {"skipped_steps", opt.skipped_steps()},
                     {"tokens_per_s", total_s > 0 ? double(o.tokens) * o.steps / total_s : 0.0},
                     {"peak_bytes", peak},
                     {"planned_model_state_bytes", model.planned().total() + opt.state_bytes()}};
    if (o.json) std::printf("%s\n", j.dump().c_str());
    else
      std::printf("done: final loss %.4f, %.0f tokens/s, peak %.2f MiB per rank (library buffers and activations)\n",
                  final_loss, j["tokens_per_s"].get<double>(), double(peak) / (1 << 20));
  }
  return 0;
}

template <class P>
int dispatch_strategy(const options& o, comm::mpi& world) {
  if (o.wrapper == "ddp") {
    if (o.strategy == "no_shard") return train<config<no_shard, ddp, P, sum>>(o, world);
    if (o.strategy == "optim") return train<config<optim, ddp, P, sum>>(o, world);
    if (o.strategy == "optim_grads") return train<config<optim_grads, ddp, P, sum>>(o, world);
  } else {
    if (o.strategy == "no_shard") return train<config<no_shard, fsdp, P, sum>>(o, world);
    if (o.strategy == "optim") return train<config<optim, fsdp, P, sum>>(o, world);
    if (o.strategy == "optim_grads") return train<config<optim_grads, fsdp, P, sum>>(o, world);
    if (o.strategy == "optim_grads_params") return train<config<optim_grads_params, fsdp, P, sum>>(o, world);
  }
  std::fprintf(stderr, "tessera: no compiled instantiation for --wrapper %s --strategy %s\n", o.wrapper.c_str(),
               o.strategy.c_str());
  return 2;
}

}  // namespace mlp_lm

int main(int argc, char** argv) {
  mlp_lm::options o;
  if (const int rc = mlp_lm::parse(argc, argv, o); rc >= 0) return rc;
  try {
    tessera::comm::mpi_session session(&argc, &argv);
    tessera::comm::mpi world;
    if (o.backend == "cuda") {
      if (world.rank() == 0) std::fprintf(stderr, "tessera: this build of tessera-mlp-lm has no CUDA backend\n");
      return 2;
    }
    return o.precision == "bf16" ? mlp_lm::dispatch_strategy<tessera::mixed_precision<tessera::bf16, float>>(o, world)
                                 : mlp_lm::dispatch_strategy<tessera::full_precision<float>>(o, world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);  // the other ranks may be inside a collective
    return 1;
  }
}
