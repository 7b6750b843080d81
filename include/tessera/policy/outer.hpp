#pragma once
//! \file The outer policy: what a mesh of R replica groups x S shard-group
//! ranks does across its replica groups (hybrid sharding). The config's
//! strategy runs inside each shard group; the outer policy says how the
//! groups combine. It changes nothing on a flat world (R = 1).
//!   outer<no_shard>: HSDP. Each group holds a full copy of the model state;
//!     the reduced gradients (the shard, or the whole unit under no_shard) are
//!     all-reduced across replicas once per step, at the last micro-batch.
//!   outer<optim>:    HFSDP. The optimizer range (a rank's shard) is split
//!     again across the replicas: the gradient shard is reduce-scattered
//!     across replicas and the updated weights all-gathered back, once per
//!     optimizer step; main weights and optimizer state are 1/R as large.
#include <string_view>
#include <type_traits>

#include "tessera/policy/strategy.hpp"

namespace tessera {

template <class S>
struct outer {
  static_assert(std::is_same_v<S, no_shard> || std::is_same_v<S, optim>,
                "tessera: the outer policy (across replica groups) is outer<no_shard> (HSDP: replicate) or "
                "outer<optim> (HFSDP: split the optimizer again); sharding gradients or parameters across "
                "replicas is flat sharding over the whole world: use a mesh of one replica group instead");
  using tessera_outer = void;
  using strategy = S;
  //! The optimizer range is split across replicas.
  static constexpr bool splits_optimizer = std::is_same_v<S, optim>;
  static constexpr std::string_view name = S::name;
};

//! A tessera outer policy (outer<no_shard> or outer<optim>).
template <class P>
concept outer_policy = requires { typename P::tessera_outer; };

}  // namespace tessera
