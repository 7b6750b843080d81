#pragma once
//! \file outer_link: a wrapper's side of a mesh (comm/mesh.hpp) — its replica
//! group's communicator and the once-per-step reductions across replicas that
//! the config's outer policy asks for (policy/outer.hpp). Inactive on a flat
//! world and on a mesh of one replica group: then every call is a no-op.
#include <cstddef>
#include <exception>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "tessera/backend/convert.hpp"
#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/comm/staged.hpp"
#include "tessera/comm/trace.hpp"
#include "tessera/policy/config.hpp"

namespace tessera::detail {

template <config_type Cfg>
class outer_link {
  using B = typename Cfg::backend_type;
  using G = typename Cfg::grad_type;
  using ops = backend_ops<B>;

public:
  //! Splits the optimizer range across replicas (outer<optim>).
  static constexpr bool splits = Cfg::outer_type::splits_optimizer;

  outer_link() = default;
  template <class Comm>
  explicit outer_link(Comm& replica) {
    if (replica.size() > 1) comm_ = comm::handle<B>(replica);
  }
  [[nodiscard]] bool active() const noexcept { return bool(comm_); }
  [[nodiscard]] int size() const { return active() ? comm_.size() : 1; }
  [[nodiscard]] int rank() const { return active() ? comm_.rank() : 0; }
  //! The replica group's communicator; empty (false) when inactive.
  [[nodiscard]] comm::handle<B>& communicator() noexcept { return comm_; }
  void resize(std::size_t units) { reqs_.resize(units); }

  //! Starts unit u's reduction across replicas once its gradients `group`
  //! are reduced within the shard group for the step: an all-reduce in place
  //! (outer<no_shard>), or a reduce-scatter into this replica's `part`
  //! (outer<optim>). One collective per unit and step, in the same unit order
  //! on every rank, on the replica communicator (its own stream under NCCL),
  //! so it overlaps the rest of backward. Averaging divides by the whole
  //! world: the group's reduction divided by S (or pre_divide by R x S before
  //! it), this one by R. `undivided`: no group reduction ran (one rank per
  //! group), so pre_divide's 1/R is applied here.
  void issue(std::size_t u, std::span<G> group, std::span<G> part, bool undivided, std::string_view name) {
    if (!active()) return;
    constexpr bool averages = std::is_same_v<typename Cfg::averaging, average_in_collective> ||
                              std::is_same_v<typename Cfg::averaging, post_divide>;
    const auto op = averages ? comm::reduce_op::avg : comm::reduce_op::sum;
    if (undivided && std::is_same_v<typename Cfg::averaging, pre_divide>)
      ops::for_each(group.size(), scale_convert<G, G>{group.data(), group.data(), 1.0f / float(size())});
    comm::label lbl("outer_reduce", std::string(name).c_str());
    if constexpr (splits) reqs_.at(u) = comm_.ireduce_scatter(group.data(), part.data(), part.size(), dtype_of_v<G>, op);
    else reqs_.at(u) = comm_.iall_reduce(group.data(), group.data(), group.size(), dtype_of_v<G>, op);
  }
  //! exact_reduction: the same for unit u's limbs, once they hold the
  //! group's sum: an integer all-reduce of the n `group` limbs in place, or
  //! a reduce-scatter into this replica's n / R `part` limbs (outer<optim>).
  //! Integer sums, so no division here (exact_sums divides once at the end).
  void issue_limbs(std::size_t u, std::int64_t* group, std::size_t n, std::int64_t* part, std::string_view name) {
    if (!active()) return;
    comm::label lbl("outer_reduce", std::string(name).c_str());
    if constexpr (splits) reqs_.at(u) = comm_.ireduce_scatter(group, part, n / std::size_t(size()), dtype::i64, comm::reduce_op::sum);
    else reqs_.at(u) = comm_.iall_reduce(group, group, n, dtype::i64, comm::reduce_op::sum);
  }
  //! Completes every reduction across replicas.
  void wait_all() {
    for (auto& q : reqs_) q.wait();
  }
  //! Adds the replicas' partial sums where their gradients differ (outer<optim>;
  //! under outer<no_shard> every replica holds the same, which would count twice).
  template <class T> void combine_partials(T* x, std::size_t n, comm::reduce_op op) {
    if (active() && splits) comm_.all_reduce(x, x, n, dtype_of_v<T>, op);
  }
  //! The largest of n values over every replica (each replica adds different micro-batches).
  void max_over_replicas(double* x, std::size_t n) {
    if (active()) comm_.all_reduce(x, x, n, dtype::f64, comm::reduce_op::max);
  }
  //! The second half of a mesh-wide agree_or_throw: `group` is what the shard
  //! group agreed on (null: no rank of it failed).
  void agree_or_throw(std::exception_ptr group, std::string_view what) {
    if (active()) comm::agree_or_throw(comm_, group, what);
    else if (group) std::rethrow_exception(group);
  }

private:
  comm::handle<B> comm_;
  std::vector<comm::request> reqs_;  // per unit: its reduction across replicas this step
};

}  // namespace tessera::detail
