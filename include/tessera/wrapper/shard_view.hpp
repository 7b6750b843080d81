#pragma once
//! \file shard_view: the one public door to what a wrapper holds on this rank,
//! for code that works on shards rather than on units in a step: the
//! optimizer (ShardedOptimizer, or one of your own), checkpoints, tools and
//! tests. It reads the layout (units, parameters, each rank's range) and the
//! buffers over this rank's optimizer range (main weights, reduced gradients),
//! and drives the end of a step (finish the gradient sync, publish new
//! weights, zero gradients). It is a reference: the wrapper must outlive it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string_view>
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

//! A rank's rows of one parameter (shard_view::rows).
struct row_shard {
  std::size_t first_row = 0, rows = 0;
  shape local_shape;
};

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
  //! The wrapper's communicator (collectives over the ranks the strategy
  //! shards over: the shard group on a mesh).
  [[nodiscard]] comm::handle<backend_type>& communicator() const noexcept { return e_->communicator(); }
  //! Replica groups of the mesh (1 on a flat world), this rank's group, and
  //! their communicator (empty on a flat world).
  [[nodiscard]] int replicas() const { return e_->replicas(); }
  [[nodiscard]] int replica_rank() const { return e_->replica_rank(); }
  [[nodiscard]] comm::handle<backend_type>& outer_communicator() const noexcept { return e_->outer_communicator(); }
  //! Sums n partial values in backend memory (sums of squares, counts) over
  //! the ranks whose optimizer gradients are distinct: what an optimizer's
  //! global norm needs, counting each element once on any mesh.
  void sum_partials(double* x, std::size_t n) const { e_->sum_partials(x, n); }
  //! The same with operation `op` over any communicated dtype (a max; an integer sum).
  template <class T> void combine_partials(T* x, std::size_t n, comm::reduce_op op) const {
    e_->combine_partials(x, n, op);
  }
  //! exact_reduction: each unit's fixed-point scale, which checkpoints keep
  //! (empty under float_reduction), and setting them (ignored there).
  [[nodiscard]] std::vector<int> exact_scales() const { return e_->exact_scales(); }
  [[nodiscard]] std::uint64_t set_param_digest() const noexcept { return e_->set_param_digest(); }
  void set_exact_scales(std::span<const int> s) const { e_->set_exact_scales(s); }
  //! Every rank of the mesh learns whether any failed: the failing ones
  //! rethrow their error, the others throw one naming it (comm::agree_or_throw).
  void agree_or_throw(std::exception_ptr err, std::string_view what) const { e_->agree_or_throw(err, what); }
  [[nodiscard]] std::size_t num_units() const noexcept { return e_->registry().num_units(); }
  //! Every unit's layout: its tensors' offsets, padding and each rank's shard.
  [[nodiscard]] const std::vector<unit_layout>& layouts() const { return e_->registry().layouts(); }
  [[nodiscard]] const unit_layout& layout(std::size_t u) const { return e_->layout(u); }
  //! A parameter's name, shape, offset and size in its unit's (gathered) buffer.
  [[nodiscard]] const tensor_slot& slot(param_id p) const { return e_->registry().slot(p); }
  //! [first element, count) of this rank's optimizer range in unit u's flat
  //! buffer: its shard where the optimizer is sharded (under outer<optim>, its
  //! replica group's part of the shard), the whole padded unit under no_shard.
  [[nodiscard]] std::pair<std::size_t, std::size_t> opt_range(std::size_t u) const {
    return e_->store().opt_range(checked(u));
  }

  //! Tensor t of unit u within this rank's optimizer range: tensor elements
  //! [tensor_begin, +count) at range elements [shard_begin, +count) (relative
  //! to the range; empty where this rank holds none of it).
  [[nodiscard]] piece range_piece(std::size_t u, std::size_t t) const {
    return detail::storage<Cfg>::range_piece(layout(u), t, rank(), e_->store().part());
  }

  //! This rank's rows of parameter p under fsdp2: rows [first_row, first_row
  //! + rows) on dim 0 (a 0-d or 1-d tensor counts elements as rows), and the
  //! local tensor's shape (those rows and the trailing extents). local_main(p)
  //! and local_grads(p) hold them, row-major. Empty where the tensor has fewer
  //! rows than there are ranks and this rank's block lies past its end.
  [[nodiscard]] row_shard rows(param_id p) const {
    static_assert(Cfg::wrapper::row_shards,
                  "tessera: shard_view::rows needs whole-row shards, which the fsdp2 wrapper makes; fsdp and ddp "
                  "cut flat shards that may start mid-row (use range_piece for those)");
    const auto& s = slot(p);
    row_shard out;
    out.first_row = std::min(std::size_t(rank()) * s.rows_per_rank, s.rows);
    out.rows = std::min(s.rows_per_rank, s.rows - out.first_row);
    auto e = s.spec.shape.extents();
    if (e.empty()) e = {std::int64_t(out.rows)};  // 0-d: one row of one element, or none
    else e[0] = std::int64_t(out.rows);
    if (s.spec.shape.rank() == 0 && out.rows == 1) e.clear();
    out.local_shape = shape(std::move(e));
    return out;
  }
  //! Main weights of this rank's part of parameter p (its rows under fsdp2;
  //! a flat piece under fsdp; the whole tensor under no_shard): tensor
  //! elements from range_piece(p).tensor_begin on.
  [[nodiscard]] std::span<main_type> local_main(param_id p) const {
    const piece q = range_piece(std::size_t(p.unit), std::size_t(p.index));
    return main_weights(std::size_t(p.unit)).subspan(q.shard_begin, q.count);
  }
  //! Reduced gradients of the same elements (final after finish_grad_sync).
  [[nodiscard]] std::span<grad_type> local_grads(param_id p) const {
    const piece q = range_piece(std::size_t(p.unit), std::size_t(p.index));
    return opt_grads(std::size_t(p.unit)).subspan(q.shard_begin, q.count);
  }

  //! Whether unit u's main weights live in host memory and its optimizer
  //! state belongs there too (wrapper_options::offload_optimizer).
  [[nodiscard]] bool offloaded(std::size_t u) const { return e_->store().offloaded(checked(u)); }
  //! The wrapper's options (offload_optimizer, lend_grad_shards, ...).
  [[nodiscard]] const wrapper_options& options() const noexcept { return e_->options(); }

  // ---- buffers over this rank's optimizer range ---------------------------------
  //! Each accessor below first settles the unit's deferred work (see defer),
  //! so what it returns is current on the current stream.
  //! Main weights (backend memory). Where compute and main dtypes agree they
  //! are the compute weights themselves.
  [[nodiscard]] std::span<main_type> main_weights(std::size_t u) const {
    return flush(checked(u)), e_->store().main_weights(u);
  }
  //! Reduced gradients (final after finish_grad_sync).
  [[nodiscard]] std::span<grad_type> opt_grads(std::size_t u) const {
    return flush(checked(u)), e_->store().opt_grads(u);
  }
  //! The gradients this rank counts in the global norm: opt_grads where the
  //! optimizer is sharded, this rank's shard of them under no_shard, so that
  //! summing every rank's part counts each element once.
  [[nodiscard]] std::span<grad_type> norm_grads(std::size_t u) const { return e_->norm_grads(u); }
  //! Tensor t's part of norm_grads(u), in its coordinates (a norm that counts tensors apart).
  [[nodiscard]] piece norm_piece(std::size_t u, std::size_t t) const { return e_->norm_piece(u, t); }
  //! Where an optimizer may write the new compute weights of the optimizer
  //! range in the same pass as its update (then publish_weights(true)); null
  //! where they alias the main weights.
  [[nodiscard]] compute_type* compute_out(std::size_t u) const {
    return flush(checked(u)), e_->store().compute_out(u);
  }
  //! The whole padded unit of main weights on every rank's host, in shard
  //! order (rank 0's shard, then rank 1's, ...: the flat layout itself under
  //! fsdp and ddp, blocks of rows under fsdp2; the wrapper's get_param
  //! extracts one tensor). Collective.
  [[nodiscard]] std::vector<main_type> gather_main(std::size_t u) const { return e_->gather_main(u); }

  // ---- deferred work (the optimizer in the next forward's shadow) ---------------
  //! Unit u has work queued that writes its weights or optimizer state and
  //! reads its gradients, e.g. an update on a side stream
  //! (backend_ops<B>::after<1>); `wait` makes the current stream wait for it
  //! (on the host backend it runs the work then). The wrapper settles it
  //! before anything uses u again: its gather or prefetch in the next
  //! forward, a gradient view or reduction, set_param, get_param, a
  //! checkpoint, every accessor of this view. Settling a unit twice is free.
  void defer(std::size_t u, std::function<void()> wait) const { e_->defer(checked(u), std::move(wait)); }
  //! Settles unit u's deferred work (the current stream waits; no host wait on CUDA).
  void flush(std::size_t u) const { e_->settle(checked(u)); }
  //! Settles every unit's deferred work.
  void flush() const { e_->settle_all(); }
  //! Whether the wrapper's weight publication after a step is local (no
  //! collective: the optimizer writes the compute weights where the next
  //! gather or forward reads them), so that updates may be deferred.
  [[nodiscard]] bool local_publication() const noexcept {
    return e_->local_publication();
  }

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
