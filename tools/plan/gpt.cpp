// tessera-plan memory --model gpt2|...|gpt: tessera-gpt's bytes per rank,
// the library's plan of its units (embed, blocks) plus what its net holds
// (gpt/workspace.hpp for the CUDA net, host_gpt's own count for the host
// one): the estimate tessera-gpt prints for the same flags, byte for byte.
#include "commands.hpp"

#include "gpt/host_compute.hpp"
#include "gpt/workspace.hpp"
#include "trainer_kit/configs.hpp"
#include "trainer_kit/host_math.hpp"

namespace plan_cli {

estimate gpt_estimate(const options& o, const gpt_model& g) {
  using namespace tessera;
  const int S = o.shard_group > 0 ? o.shard_group : o.gpus, R = o.gpus / S;
  const bool cuda = o.backend == "cuda";
  if (o.wire != "fp32" || o.lend_grad_shards || o.copy_engine_gathers || o.recompute_gelu || o.offload > 0)
    throw error("--wire, --lend-grad-shards, --copy-engine-gathers, --recompute-gelu and --offload-optimizer are "
                "tessera-mlp-lm's; tessera-gpt (--model) takes none of them");
  if (g.keep_gelu && !cuda) throw error("--keep-gelu keeps the CUDA net's GELU outputs; give --backend cuda");
  const auto f = [&]<class Cfg>() {
    estimate e;
    plan::model_recorder rec;
    const gpt::model_ids ids = gpt::register_model(rec, g.shape);
    // tessera-gpt's wrapper: three gather buffers (the embed unit, held for a
    // whole micro-batch, and two for the blocks).
    const wrapper_options wo{.gather_buffers = 3};
    e.m = plan::memory<Cfg, adamw>(rec.units(), S, wo, R, optimizer_options{});
    e.params = g.shape.params();
    e.tokens_per_rank = std::size_t(g.batch) * std::size_t(g.shape.seq);
    using C = typename Cfg::compute_type;
    // The CUDA net runs flash attention in bf16 at head dimension 64 (on sm_80
    // or newer, which this count assumes).
    const bool flash = !std::is_same_v<C, float> && g.shape.head_dim() == 64;
    // A step graph (tessera-gpt's --cuda-graphs auto or on; off by default)
    // stages each micro-batch of a step in its own input slot, on one GPU.
    const int count = o.deterministic ? o.accum / o.gpus : o.accum;
    const bool graphs = (o.cuda_graphs == "auto" || o.cuda_graphs == "on") && o.gpus == 1 && !(o.deterministic && count > 1);
    const int slots = graphs ? count : 1;
    using host_net = gpt::host_gpt<data_parallel_t<Cfg>>;
    const auto ls = plan::layouts<Cfg>(rec.units(), S, wo, R);
    const auto padded_numel = [&](unit_id u) { return ls[std::size_t(u.index)].padded_numel(); };
    e.act = cuda ? gpt::workspace::cuda_bytes<C>(g.shape, g.batch, g.recompute, flash, o.deterministic, slots, g.keep_gelu)
                 : host_net::workspace_bytes(g.shape, g.batch, {.recompute = g.recompute}) +
                       trainer_kit::widened_bytes<host_net>(ids, padded_numel);
    e.blas = cuda ? gpt::workspace::cublaslt_bytes : 0;
    e.units = int(rec.units().size());
    return e;
  };
  const auto go = [&]<class P>() -> std::optional<estimate> {
    if (o.deterministic) return trainer_kit::with_config<P, backend::host, exact_reduction>(o.wrapper, o.strategy, o.outer, f);
    return trainer_kit::with_config<P, backend::host>(o.wrapper, o.strategy, o.outer, f);
  };
  const auto e = o.precision == "bf16" ? go.template operator()<mixed_precision<bf16, float>>()
                                       : go.template operator()<full_precision<float>>();
  if (!e)
    throw error("--wrapper " + o.wrapper + " --strategy " + o.strategy + " --outer " + o.outer +
                " is not a combination tessera-gpt compiles");
  return *e;
}

}  // namespace plan_cli
