#pragma once
//! \file A 2-D mesh over a world of N = R x S ranks for hybrid sharding: R
//! replica groups of S shard-group ranks. Shard group g holds world ranks
//! [g S, (g + 1) S) (launchers number a node's ranks contiguously, so the
//! default S, the ranks of one node, puts a shard group on a node's fast
//! links); replica group j holds the ranks at position j of every shard
//! group. A wrapper built on a mesh runs its strategy inside the shard group
//! and its outer policy (policy/outer.hpp) across the replica group.
//!
//!   comm::mpi world;
//!   auto m = comm::make_mesh(world, 4);   // or comm::node_size(world)
//!   FullyShardedDataParallel<config<optim_grads_params, fsdp, outer<optim>>> model(m);
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/staged.hpp"
#include "tessera/comm/trace.hpp"
#include "tessera/core/error.hpp"

namespace tessera::comm {

//! The two communicators of a mesh (split from one world; both owned here).
template <class Comm>
struct mesh {
  Comm shard;    //!< this rank's shard group: S ranks, ordered by world rank
  Comm replica;  //!< this rank's replica group: R ranks, one per shard group
  [[nodiscard]] int shard_size() const { return shard.size(); }
  [[nodiscard]] int replicas() const { return replica.size(); }
  //! This rank's world rank (replica rank x S + shard rank).
  [[nodiscard]] int world_rank() const { return replica.rank() * shard.size() + shard.rank(); }
  [[nodiscard]] int world_size() const { return replica.size() * shard.size(); }
};

//! Splits `world` into a mesh of world.size() / S replica groups of S ranks.
//! Collective; every rank must pass the same S. A bad S (< 1, not dividing
//! the world, or not the same on every rank) throws the same tessera: error
//! on every rank, before any split, so nobody is left waiting.
template <class Comm>
[[nodiscard]] mesh<Comm> make_mesh(Comm& world, int S) {
  const int N = world.size(), r = world.rank();
  {
    label lbl("make_mesh");
    TESSERA_CHECK(all_same(world, std::uint64_t(std::int64_t(S))), "make_mesh: ranks disagree on the shard group "
                  "size (rank ", r, " asked for ", S, "); every rank must pass the same S");
  }
  TESSERA_CHECK(S >= 1 && N % S == 0, "make_mesh: shard group size ", S, " does not divide the world of ", N,
                " ranks; pick S in 1..", N, " with ", N, " = R x S (S = the ranks of one node by default)");
  mesh<Comm> m{world.split(r / S, r % S), world.split(r % S, r / S)};
  return m;
}

}  // namespace tessera::comm
