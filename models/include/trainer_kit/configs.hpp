#pragma once
// The configurations the reference programs compile (tessera-mlp-lm,
// tessera-gpt, tessera-bench-train, tessera-plan), chosen by name: every valid strategy x
// wrapper over a flat world or an HSDP mesh (outer<no_shard>), and HFSDP
// (outer<optim>) for fsdp / optim_grads_params only (each instantiation of
// the trainer costs compile time). One table, so the three agree.
#include <optional>
#include <string_view>

#include "tessera/policy/config.hpp"

namespace trainer_kit {

//! f.template operator()<config<S, W, P, sum, B, O, R>>() for the wrapper,
//! strategy and outer policy named; nothing where the names are not among
//! the compiled ones (the caller says why). R: the reduction policy
//! (exact_reduction for --deterministic).
template <class P, class B, class R = tessera::float_reduction, class F>
auto with_config(std::string_view wrapper, std::string_view strategy, std::string_view outer_name, F&& f)
    -> std::optional<decltype(f.template operator()<tessera::config<tessera::no_shard, tessera::ddp, P, tessera::sum, B, R>>())> {
  using namespace tessera;
  if (outer_name == "optim") {
    if (wrapper == "fsdp" && strategy == "optim_grads_params")
      return f.template operator()<config<optim_grads_params, fsdp, P, sum, B, outer<optim>, R>>();
  } else if (wrapper == "ddp") {
    if (strategy == "no_shard") return f.template operator()<config<no_shard, ddp, P, sum, B, R>>();
    if (strategy == "optim") return f.template operator()<config<optim, ddp, P, sum, B, R>>();
    if (strategy == "optim_grads") return f.template operator()<config<optim_grads, ddp, P, sum, B, R>>();
  } else if (wrapper == "fsdp2") {
    if (strategy == "optim_grads_params") return f.template operator()<config<optim_grads_params, fsdp2, P, sum, B, R>>();
  } else if (wrapper == "fsdp") {
    if (strategy == "no_shard") return f.template operator()<config<no_shard, fsdp, P, sum, B, R>>();
    if (strategy == "optim") return f.template operator()<config<optim, fsdp, P, sum, B, R>>();
    if (strategy == "optim_grads") return f.template operator()<config<optim_grads, fsdp, P, sum, B, R>>();
    if (strategy == "optim_grads_params") return f.template operator()<config<optim_grads_params, fsdp, P, sum, B, R>>();
  }
  return std::nullopt;
}

}  // namespace trainer_kit
