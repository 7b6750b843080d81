#pragma once
//! \file shard_view: the one public door to what a wrapper holds on this rank,
//! for code that works on shards rather than on units in a step: the
//! optimizer (ShardedOptimizer, or one of your own), checkpoints, tools and
//! tests. It reads the layout (units, parameters, each rank's range) and the
//! buffers over this rank's optimizer range (main weights, reduced gradients),
//! and drives the end of a step (finish the gradient sync, publish new
//! weights, zero gradients). It is a reference: the wrapper must outlive it.
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/policy/config.hpp"
#include "tessera/shard/layout.hpp"
#include "tessera/wrapper/detail/engine.hpp"
#include "tessera/wrapper/options.hpp"

namespace tessera {

namespace detail {
template <config_type Cfg> class data_parallel_base;
}

template <config_type Cfg>
class shard_view {
  using engine = detail::dp_engine<Cfg>;

public:
  using config = Cfg;
  using strategy = typename Cfg::strategy;
  using backend_type = typename Cfg::backend_type;
  using compute_type = typename Cfg::compute_type;
  using main_type = typename Cfg::main_type;
  using grad_type = typename Cfg::grad_type;

  // ---- structure (valid after the wrapper's finalize) ---------------------------
  [[nodiscard]] int rank() const { return e_->rank(); }
  [[nodiscard]] int world() const { return e_->world(); }
  [[nodiscard]] bool finalized() const noexcept { return e_->registry().finalized(); }
  //! The wrapper's communicator (collectives over the data-parallel ranks).
  [[nodiscard]] comm::handle<backend_type>& communicator() const noexcept { return e_->communicator(); }
  [[nodiscard]] std::size_t num_units() const noexcept { return e_->registry().num_units(); }
  //! Every unit's flat layout: its tensors' offsets, padding and each rank's shard.
  [[nodiscard]] const std::vector<unit_layout>& layouts() const { return e_->registry().layouts(); }
  [[nodiscard]] const unit_layout& layout(std::size_t u) const { return e_->layout(u); }
  //! A parameter's name, shape, offset and size in its unit's flat buffer.
  [[nodiscard]] const tensor_slot& slot(param_id p) const { return e_->registry().slot(p); }
  //! [first element, count) of this rank's optimizer range in unit u's flat
  //! buffer: its shard where the optimizer is sharded, the whole padded unit
  //! under no_shard.
  [[nodiscard]] std::pair<std::size_t, std::size_t> opt_range(std::size_t u) const {
    return e_->store().opt_range(checked(u));
  }

  // ---- buffers over this rank's optimizer range ---------------------------------
  //! Main weights (backend memory). Where compute and main dtypes agree they
  //! are the compute weights themselves.
  [[nodiscard]] std::span<main_type> main_weights(std::size_t u) const {
    return e_->store().main_weights(checked(u));
  }
  //! Reduced gradients (final after finish_grad_sync).
  [[nodiscard]] std::span<grad_type> opt_grads(std::size_t u) const { return e_->store().opt_grads(checked(u)); }
  //! The gradients this rank counts in the global norm: opt_grads where the
  //! optimizer is sharded, this rank's shard of them under no_shard, so that
  //! summing every rank's part counts each element once.
  [[nodiscard]] std::span<grad_type> norm_grads(std::size_t u) const { return e_->norm_grads(u); }
  //! Where an optimizer may write the new compute weights of the optimizer
  //! range in the same pass as its update (then publish_weights(true)); null
  //! where they alias the main weights.
  [[nodiscard]] compute_type* compute_out(std::size_t u) const { return e_->store().compute_out(checked(u)); }
  //! The whole padded unit of main weights on every rank's host. Collective.
  [[nodiscard]] std::vector<main_type> gather_main(std::size_t u) const { return e_->gather_main(u); }

  // ---- the end of a step --------------------------------------------------------
  //! Completes every gradient reduction (the wrapper's finish_grad_sync).
  void finish_grad_sync() const { e_->finish_grad_sync(); }
  //! After main weights changed: refresh the compute weights (converting them
  //! unless `converted`: the optimizer wrote them through compute_out) and
  //! start the all-gather where they are replicated and the optimizer sharded.
  void publish_weights(bool converted = false) const { e_->publish_weights(converted); }
  //! Zeroes every gradient and starts a new accumulation.
  void zero_grad() const { e_->zero_grad(); }

private:
  friend class detail::data_parallel_base<Cfg>;
  explicit shard_view(engine& e) noexcept : e_(&e) {}
  std::size_t checked(std::size_t u) const { return (void)layout(u), u; }  // a clear error for an unknown unit
  engine* e_;
};

}  // namespace tessera
