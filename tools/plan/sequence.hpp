#pragma once
// tessera-plan memory for the sequence models' trainers (tessera-gpt,
// tessera-llama): the library's plan of the model's units under the named
// configuration, plus what the trainer's net holds (the model's own buffer
// list: host or CUDA), as the trainer's loop (trainer_kit/loop.hpp) counts it.
// One routine for both; gpt.cpp and llama.cpp give it the model.
#include <optional>
#include <string>

#include "commands.hpp"
#include "tessera/plan/memory.hpp"
#include "trainer_kit/configs.hpp"
#include "trainer_kit/run_options.hpp"
#include "trainer_kit/sequence_lm.hpp"

namespace plan_cli {

//! The estimate of a sequence model: `reg(recorder)` registers it (returns
//! its ids), its wrapper is every sequence model's (sequence_lm's, the
//! offload set here), and
//! `act.template operator()<Cfg>(ids, padded_numel, input_slots)` what its
//! net holds under Cfg (host or CUDA, from o.backend). `program` names it in errors.
template <class Register, class Act>
estimate sequence_estimate(const options& o, const char* program, std::size_t params, std::size_t tokens_per_rank,
                           Register&& reg, Act&& act) {
  using namespace tessera;
  const int S = o.shard_group > 0 ? o.shard_group : o.gpus, R = o.gpus / S;
  if (o.wire != "fp32" || o.lend_grad_shards || o.copy_engine_gathers || o.recompute_gelu)
    throw error(std::string("--wire, --lend-grad-shards, --copy-engine-gathers and --recompute-gelu are "
                            "tessera-mlp-lm's; ") + program + " (--model) takes none of them");
  if (o.precision == "fp8" && o.backend != "host")
    throw error(std::string("--precision fp8 runs on the host backend so far; ") + program + "'s CUDA net has no fp8 "
                "products to count yet (docs/fp8.md)");
  tessera::wrapper_options wo = trainer_kit::sequence_lm<std::uint32_t>::wrapper_defaults;
  wo.offload_optimizer = o.offload;
  const optimizer_options oo{.offload_update = trainer_kit::update_site_of(o.offload_update)};
  const auto f = [&]<class Cfg>() {
    estimate e;
    plan::model_recorder rec;
    const auto ids = reg(rec);
    e.m = plan::memory<Cfg, adamw>(rec.units(), S, wo, R, oo);
    e.params = params;
    e.tokens_per_rank = tokens_per_rank;
    // A step graph (--cuda-graphs auto or on) stages each micro-batch of a step
    // in its own input slot, on one GPU, without an offloaded optimizer.
    const int count = o.deterministic ? o.accum / o.gpus : o.accum;
    const bool graphs = (o.cuda_graphs == "auto" || o.cuda_graphs == "on") && o.gpus == 1 && o.offload == 0 &&
                        !(o.deterministic && count > 1);
    const auto ls = plan::layouts<Cfg>(rec.units(), S, wo, R);
    const auto padded_numel = [&](unit_id u) { return ls[std::size_t(u.index)].padded_numel(); };
    e.act = act.template operator()<Cfg>(ids, padded_numel, graphs ? count : 1);
    e.units = int(rec.units().size());
    return e;
  };
  const auto go = [&]<class P>() -> std::optional<estimate> {
    if (o.deterministic) return trainer_kit::with_config<P, backend::host, exact_reduction>(o.wrapper, o.strategy, o.outer, f);
    return trainer_kit::with_config<P, backend::host>(o.wrapper, o.strategy, o.outer, f);
  };
  const auto e = o.precision != "fp32" ? go.template operator()<mixed_precision<bf16, float>>()  // fp8: bf16's
                                       : go.template operator()<full_precision<float>>();
  if (!e)
    throw error("--wrapper " + o.wrapper + " --strategy " + o.strategy + " --outer " + o.outer +
                " is not a combination " + program + " compiles");
  return *e;
}

}  // namespace plan_cli
