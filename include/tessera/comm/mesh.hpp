#pragma once
//! \file A 2-D mesh over a world of N = R x S ranks for hybrid sharding: R
//! replica groups of S shard-group ranks. Shard group g holds world ranks
//! [g S, (g + 1) S) (launchers number a node's ranks contiguously, so the
//! default S, the ranks of one node, puts a shard group on a node's fast
//! links); replica group j holds the ranks at position j of every shard
//! group. A wrapper built on a mesh runs its strategy inside the shard group
//! and its outer policy (policy/outer.hpp) across the replica group.
//! make_tp_groups splits a tensor-parallel axis off first (tp innermost); the
//! mesh is then made over its data-parallel world.
//!
//!   comm::mpi world;
//!   auto m = comm::make_mesh(world, 4);   // or comm::node_size(world)
//!   FullyShardedDataParallel<config<optim_grads_params, fsdp, outer<optim>>> model(m);
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/staged.hpp"
#include "tessera/comm/trace.hpp"
#include "tessera/core/error.hpp"

namespace tessera::comm {

namespace detail {
//! How many wrappers use a mesh. A wrapper keeps references to the mesh's
//! communicators, so a mesh destroyed first would leave it calling through
//! freed objects (seen: std::out_of_range with an index near 2^64). Its
//! destructor cannot throw; it says what happened and aborts instead.
class mesh_users {
public:
  mesh_users() = default;
  mesh_users(mesh_users&& o) noexcept : n_(std::exchange(o.n_, nullptr)) {}
  mesh_users& operator=(mesh_users&& o) noexcept {
    if (this != &o) {
      check_unused();  // the groups being replaced are the ones the wrappers hold
      n_ = std::exchange(o.n_, nullptr);
    }
    return *this;
  }
  ~mesh_users() { check_unused(); }
  [[nodiscard]] int count() const noexcept { return n_ ? *n_ : 0; }
  //! A wrapper's claim, released when the wrapper goes.
  class claim {
  public:
    explicit claim(const mesh_users& m) : n_(m.n_) { ++*n_; }
    claim(const claim&) = delete;
    claim& operator=(const claim&) = delete;
    ~claim() { --*n_; }

  private:
    std::shared_ptr<int> n_;
  };

private:
  void check_unused() const noexcept {
    if (n_ && *n_ > 0) {
      std::fprintf(stderr, "tessera: a comm::mesh was destroyed or replaced while %d wrapper(s) built on it still "
                   "live; the mesh must outlive every wrapper made from it (declare it before them)\n", *n_);
      std::abort();
    }
  }
  std::shared_ptr<int> n_ = std::make_shared<int>(0);
};
}  // namespace detail

//! The two communicators of a mesh (split from one world; both owned here).
//! It must outlive every wrapper built on it (destroying it first aborts with
//! a tessera: line).
template <class Comm>
struct mesh {
  Comm shard;    //!< this rank's shard group: S ranks, ordered by world rank
  Comm replica;  //!< this rank's replica group: R ranks, one per shard group
  detail::mesh_users users{};  //!< the wrappers built on it (destroyed first: checked before the groups go)
  [[nodiscard]] int shard_size() const { return shard.size(); }
  [[nodiscard]] int replicas() const { return replica.size(); }
  //! This rank's world rank (replica rank x S + shard rank).
  [[nodiscard]] int world_rank() const { return replica.rank() * shard.size() + shard.rank(); }
  [[nodiscard]] int world_size() const { return replica.size() * shard.size(); }
};

namespace detail {
//! The split both make_mesh and make_tp_groups make: `world` as groups of k
//! consecutive ranks, and across them the groups of the ranks at one place in
//! every group: {consecutive, across}. k is agreed over the world first, so a
//! bad k (< 1, not dividing the world, not the same on every rank) is the same
//! tessera: error on every rank before any split. `call` names the caller,
//! `what` and `sym` its k, `grid` the world as a product ("R x S").
template <class Comm>
[[nodiscard]] std::pair<Comm, Comm> split_grid(Comm& world, int k, const char* call, const char* what, const char* sym,
                                               const char* grid) {
  const int N = world.size(), r = world.rank();
  {
    label lbl(call);
    TESSERA_CHECK(all_same(world, std::uint64_t(std::int64_t(k))), call, ": ranks disagree on the ", what, " (rank ", r,
                  " asked for ", k, "); every rank must pass the same ", sym);
  }
  TESSERA_CHECK(k >= 1 && N % k == 0, call, ": ", what, " ", k, " does not divide the world of ", N, " ranks; pick ",
                sym, " in 1..", N, " with ", N, " = ", grid);
  Comm consecutive = world.split(r / k, r % k);
  return {std::move(consecutive), world.split(r % k, r / k)};
}
}  // namespace detail

//! Splits `world` into a mesh of world.size() / S replica groups of S ranks.
//! Collective; every rank must pass the same S. A bad S (< 1, not dividing
//! the world, or not the same on every rank) throws the same tessera: error
//! on every rank, before any split, so nobody is left waiting.
template <class Comm>
[[nodiscard]] mesh<Comm> make_mesh(Comm& world, int S) {
  auto [shard, replica] = detail::split_grid(world, S, "make_mesh", "shard group size", "S",
                                             "R x S (S = the ranks of one node by default)");
  return mesh<Comm>{std::move(shard), std::move(replica)};
}

//! A world split for tensor parallelism: `tp` groups of consecutive ranks
//! (tp innermost, so a group stays on one node's fast links, as Megatron and
//! torchtitan place it) and the data-parallel world of the ranks at the same
//! place in every tp group. A data-parallel wrapper runs on `dp` (or on a mesh
//! make_mesh splits from it), each rank holding its tp slice of the model.
template <class Comm>
struct tp_groups {
  Comm tp;  //!< this rank's tensor-parallel group: world ranks [g tp, (g + 1) tp)
  Comm dp;  //!< this rank's data-parallel world: the ranks of its tp rank, one per tp group
  [[nodiscard]] int tp_size() const { return tp.size(); }
  [[nodiscard]] int dp_size() const { return dp.size(); }
};

//! Splits `world` into tensor-parallel groups of `tp` ranks and the
//! data-parallel world across them. Collective; every rank must pass the same
//! tp. A bad tp (< 1, not dividing the world, or not the same on every rank)
//! throws the same tessera: error on every rank before any split.
template <class Comm>
[[nodiscard]] tp_groups<Comm> make_tp_groups(Comm& world, int tp) {
  auto [group, across] = detail::split_grid(world, tp, "make_tp_groups", "tensor-parallel size", "tp", "dp x tp");
  return {std::move(group), std::move(across)};
}

}  // namespace tessera::comm
