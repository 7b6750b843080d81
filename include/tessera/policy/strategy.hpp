#pragma once
//! \file The four sharding strategies (ZeRO stages) and their concept.
#include <string_view>
#include <type_traits>

namespace tessera {

//! Nothing sharded: replicated weights, gradients all-reduced.
struct no_shard {
  using tessera_strategy = void;
  static constexpr bool shards_optimizer = false, shards_grads = false, shards_params = false;
  static constexpr std::string_view name = "no_shard";
};
//! ZeRO-1: main weights and optimizer state sharded.
struct optim {
  using tessera_strategy = void;
  static constexpr bool shards_optimizer = true, shards_grads = false, shards_params = false;
  static constexpr std::string_view name = "optim";
};
//! ZeRO-2: plus gradients reduce-scattered every micro-batch into the shard.
struct optim_grads {
  using tessera_strategy = void;
  static constexpr bool shards_optimizer = true, shards_grads = true, shards_params = false;
  static constexpr std::string_view name = "optim_grads";
};
//! ZeRO-3 / FSDP: plus compute weights sharded and gathered per unit.
struct optim_grads_params {
  using tessera_strategy = void;
  static constexpr bool shards_optimizer = true, shards_grads = true, shards_params = true;
  static constexpr std::string_view name = "optim_grads_params";
};

//! A tessera sharding strategy: a type that says so with `using tessera_strategy = void;`.
template <class S>
concept sharding_strategy = requires { typename S::tessera_strategy; } && requires {
  { S::shards_optimizer } -> std::convertible_to<bool>;
  { S::shards_grads } -> std::convertible_to<bool>;
  { S::shards_params } -> std::convertible_to<bool>;
};

}  // namespace tessera
