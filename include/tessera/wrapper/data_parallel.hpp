#pragma once
//! \file DistributedDataParallel, FullyShardedDataParallel, FullyShardedDataParallel2 and data_parallel_t.
//!
//! A trainer registers units and their parameters, calls finalize(), sets the
//! initial values, then per step and micro-batch:
//!   model.begin_micro_batch(i, n);
//!   forward:  { auto s = model.gather(u); ... s.weight(p) ... }            // unit by unit
//!   backward: { auto s = model.gather(u); ... write s.grad(p) ...; s.reduce_grads(); }
//! and finally optimizer.step() (which calls finish_grad_sync()).
#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/mesh.hpp"
#include "tessera/core/random.hpp"
#include "tessera/policy/config.hpp"
#include "tessera/shard/layout.hpp"
#include "tessera/wrapper/detail/engine.hpp"
#include "tessera/wrapper/options.hpp"
#include "tessera/wrapper/shard_view.hpp"

namespace tessera {

namespace detail {

template <config_type Cfg>
class data_parallel_base {
public:
  using config = Cfg;
  using strategy = typename Cfg::strategy;
  using backend_type = typename Cfg::backend_type;
  using compute_type = typename Cfg::compute_type;
  using main_type = typename Cfg::main_type;
  using grad_type = typename Cfg::grad_type;

private:
  using engine_type = dp_engine<Cfg>;

public:
  //! An RAII hold on one unit's compute weights: gathered (optim_grads_params)
  //! or waited for (after an optimizer step's all-gather). Released on destruction.
  class unit_scope {
  public:
    unit_scope(unit_scope&& o) noexcept : e_(std::exchange(o.e_, nullptr)), u_(o.u_) {}
    unit_scope& operator=(unit_scope&&) = delete;
    unit_scope(const unit_scope&) = delete;
    ~unit_scope() { release(); }

    [[nodiscard]] unit_id unit() const noexcept { return {int(u_)}; }
    //! The whole unit's weights (padded flat buffer).
    [[nodiscard]] std::span<const compute_type> weights() const { return live().unit_weights(u_); }
    //! One parameter's weights, row-major over its shape.
    [[nodiscard]] std::span<const compute_type> weight(param_id p) const {
      const auto& s = slot_of(p);
      return live().unit_weights(u_).subspan(s.offset, s.numel);
    }
    //! One parameter's gradient for this micro-batch (accumulates over micro-batches).
    [[nodiscard]] std::span<grad_type> grad(param_id p) {
      slot_of(p);
      return live().grad(p);
    }
    [[nodiscard]] std::span<grad_type> grads() { return live().unit_grads(u_); }
    //! The whole unit's gradients for a writer that assigns every element of
    //! every parameter when `fresh` is true (nothing accumulated yet this step;
    //! saves zeroing them) and accumulates when it is false.
    [[nodiscard]] grad_target<grad_type> grads_for_write() { return live().unit_grads_for_write(u_); }
    //! Starts this unit's gradient reduction (non-blocking).
    void reduce_grads() { live().reduce_grads(u_); }
    //! Gives the weights back early; the scope is unusable afterwards.
    void release() noexcept {
      if (e_) std::exchange(e_, nullptr)->release(u_);
    }

  private:
    friend class data_parallel_base;
    unit_scope(engine_type& e, std::size_t u) : e_(&e), u_(u) {}
    engine_type& live() const {
      TESSERA_CHECK(e_ != nullptr, "use of a released unit scope");
      return *e_;
    }
    const tensor_slot& slot_of(param_id p) const {
      auto& e = live();
      TESSERA_CHECK(std::size_t(p.unit) == u_, "parameter '", e.registry().slot(p).spec.name, "' of unit '",
                    e.registry().layout(std::size_t(p.unit)).name(), "' used through the scope of unit '",
                    e.registry().layout(u_).name(),
                    "'; take it through gather() of its own unit");
      return e.registry().slot(p);
    }
    engine_type* e_;
    std::size_t u_;
  };

  template <class Comm>
  explicit data_parallel_base(Comm& comm, wrapper_options opt = {}) : e_(comm, opt) {
    comm::check_communicator<Comm, backend_type>();
  }
  //! On a mesh (comm::make_mesh): the config's strategy inside each shard
  //! group, its outer policy (outer<no_shard> = HSDP, outer<optim> = HFSDP)
  //! across the replica groups. The mesh must outlive the wrapper.
  template <class Comm>
  explicit data_parallel_base(comm::mesh<Comm>& m, wrapper_options opt = {})
      : mesh_claim_(std::in_place, m.users), e_(m.shard, m.replica, opt) {
    comm::check_communicator<Comm, backend_type>();
  }

  //! Registers a unit: parameters gathered, computed and released together.
  unit_id add_unit(std::string name) { return e_.registry().add_unit(std::move(name)); }
  //! Registers a parameter of unit u; weight_decay false exempts it from decay.
  param_id add_param(unit_id u, std::string name, shape s, bool weight_decay = true) {
    return e_.registry().add_param(u, std::move(name), std::move(s), weight_decay);
  }
  //! Fixes the layout, checks all ranks agree (collective), allocates.
  void finalize() { e_.finalize(); }

  //! Sets a parameter from its full value in host memory: every rank passes
  //! the same values and keeps its own piece (no communication).
  void set_param(param_id p, std::span<const main_type> full) { e_.set_param(p, full); }
  //! Sets a parameter from an initializer (init::normal, init::constant, ...
  //! or any type with value(key, index) -> float): element i gets
  //! init.value(key_of("<unit>.<tensor>"), i), each rank computing only the
  //! elements it keeps. The values are the same at every world size, under
  //! every strategy and wrapper, on every backend, and no rank builds the
  //! full tensor. No communication. On the CUDA backend a device_initializer
  //! (the library's) draws on the device, straight into the rank's buffers;
  //! others on the host, copied over.
  template <initializer I>
  void init_param(param_id p, const I& init) {
    e_.registry().require_final("init_param()");  // its key names the slot, which exists from finalize()
    const std::uint64_t key = key_of(e_.layout(std::size_t(p.unit)).name() + "." + e_.registry().slot(p).spec.name);
    e_.init_param(p, detail::drawn<I>{init, key}, init::initializer_digest(init));
  }
  //! The full main-weight value of a parameter on every rank's host.
  //! Collective: every rank calls it (on one rank alone it waits for the others).
  [[nodiscard]] std::vector<main_type> get_param(param_id p) {
    const auto& s = e_.registry().slot(p);
    e_.check_values_agree("get_param");  // ranks that set other values would each return their own
    const std::vector<main_type> unit = e_.gather_main(std::size_t(p.unit));
    if constexpr (!strategy::shards_optimizer) {
      return {unit.begin() + std::ptrdiff_t(s.offset), unit.begin() + std::ptrdiff_t(s.offset + s.numel)};
    } else {  // shard order: each rank's piece from its shard
      const auto& L = e_.layout(std::size_t(p.unit));
      std::vector<main_type> v(s.numel);
      for (int r = 0; r < L.world(); ++r)
        if (const piece q = L.piece_of(std::size_t(p.index), r); !q.empty())
          std::copy_n(unit.begin() + std::ptrdiff_t(L.shard_begin(r) + q.shard_begin), q.count,
                      v.begin() + std::ptrdiff_t(q.tensor_begin));
      return v;
    }
  }
  [[nodiscard]] param_id find(unit_id u, std::string_view name) const { return e_.registry().find(u, name); }
  //! Unit u's layout: its tensors' offsets, its padding and each rank's shard.
  [[nodiscard]] const unit_layout& layout(unit_id u) const { return check_unit(u), e_.layout(std::size_t(u.index)); }
  //! A parameter's name, shape, offset and size in its unit's (gathered) buffer.
  [[nodiscard]] const tensor_slot& slot(param_id p) const { return e_.registry().slot(p); }

  [[nodiscard]] unit_scope gather(unit_id u) {
    check_unit(u);
    e_.acquire(std::size_t(u.index));
    return unit_scope(e_, std::size_t(u.index));
  }
  //! Gradient view outside a scope (not under optim_grads_params, whose units must be gathered).
  [[nodiscard]] std::span<grad_type> grad(param_id p) { return e_.grad(p); }
  //! Starts micro-batch index of count (optional with one micro-batch per step).
  void begin_micro_batch(int index, int count) { e_.begin_micro_batch(index, count); }
  void reduce_grads(unit_id u) {
    check_unit(u);
    e_.reduce_grads(std::size_t(u.index));
  }
  void finish_grad_sync() { e_.finish_grad_sync(); }
  void zero_grad() { e_.zero_grad(); }
  void synchronize() { e_.synchronize(); }
  //! Drops cached gathered units (optim_grads_params); the next gather() all-gathers again.
  void release_gathered() { e_.release_gathered(); }
  //! Under wrapper_options::lend_grad_shards: unit u's reduced gradient shard
  //! lives in `memory` (at least layout(u).shard_numel() elements, 16-byte
  //! aligned) from now on. The wrapper writes it from u's reduce_grads until
  //! the optimizer step has read it; the caller may use it between a step and
  //! u's next reduce_grads (the unit's own activations, say). Between steps
  //! only; a no-op where nothing is sharded or one rank holds everything.
  void lend_grad_shard(unit_id u, std::span<grad_type> memory) {
    check_unit(u);
    e_.lend_grad_shard(std::size_t(u.index), memory);
  }

  //! This rank and the ranks the strategy shards over: the shard group on a mesh.
  [[nodiscard]] int rank() const { return e_.rank(); }
  [[nodiscard]] int world() const { return e_.world(); }
  //! Replica groups of the mesh (1 on a flat world) and this rank's group.
  [[nodiscard]] int replicas() const { return e_.replicas(); }
  [[nodiscard]] int replica_rank() const { return e_.replica_rank(); }
  [[nodiscard]] bool finalized() const noexcept { return e_.registry().finalized(); }
  [[nodiscard]] std::size_t num_units() const noexcept { return e_.registry().num_units(); }
  [[nodiscard]] std::size_t num_params() const noexcept { return e_.registry().num_params(); }
  //! Bytes of model state this rank holds (valid after finalize).
  [[nodiscard]] const memory_plan& planned() const { return e_.planned(); }
  //! The public view of this rank's shards, for optimizers, checkpoints and tools.
  [[nodiscard]] shard_view<Cfg> shards() noexcept { return shard_view<Cfg>(e_); }

private:
  void check_unit(unit_id u) const {
    TESSERA_CHECK(u.index >= 0 && std::size_t(u.index) < e_.registry().num_units(), "unknown unit ", u.index);
  }
  std::optional<comm::detail::mesh_users::claim> mesh_claim_;  // before e_: released after it, which uses the mesh
  engine_type e_;
};

}  // namespace detail

//! DDP-style wrapper: replicated compute weights; units are the gradient
//! buckets, reduced as soon as reduce_grads(unit) is called.
template <config_type Cfg>
class DistributedDataParallel : public detail::data_parallel_base<Cfg> {
  static_assert(wrapper_supports_v<ddp, typename Cfg::strategy>,
                "tessera: DistributedDataParallel keeps replicated compute weights and cannot shard "
                "parameters; use FullyShardedDataParallel for optim_grads_params");

public:
  using detail::data_parallel_base<Cfg>::data_parallel_base;
};

//! FSDP-style wrapper: units gathered before use and released after; with
//! optim_grads_params only the shard of each unit lives between uses.
template <config_type Cfg>
class FullyShardedDataParallel : public detail::data_parallel_base<Cfg> {
public:
  using detail::data_parallel_base<Cfg>::data_parallel_base;
};

//! FSDP2-style wrapper (PyTorch's fully_shard): every parameter is split on
//! dim 0, so a rank's shard of it is whole rows (shard_view::rows). Units are
//! gathered and reduced in one collective each, like fsdp's, in shard order,
//! and copied out into whole tensors after a gather (off the compute stream)
//! and into shard order before a reduction (fused with the conversion to the
//! wire type). optim_grads_params only.
template <config_type Cfg>
class FullyShardedDataParallel2 : public detail::data_parallel_base<Cfg> {
  static_assert(wrapper_supports_v<fsdp2, typename Cfg::strategy>,
                "tessera: FullyShardedDataParallel2 (fsdp2) runs optim_grads_params only; choose "
                "FullyShardedDataParallel or DistributedDataParallel for no_shard, optim and optim_grads");
  static_assert(std::is_same_v<typename Cfg::wrapper, fsdp2>,
                "tessera: FullyShardedDataParallel2 needs a config whose wrapper is fsdp2 "
                "(config<optim_grads_params, fsdp2, ...>): the config's wrapper policy decides the shard layout");

public:
  using detail::data_parallel_base<Cfg>::data_parallel_base;
};

namespace detail {
template <class Cfg, class W = typename Cfg::wrapper> struct pick_wrapper;
template <class Cfg> struct pick_wrapper<Cfg, ddp> { using type = DistributedDataParallel<Cfg>; };
template <class Cfg> struct pick_wrapper<Cfg, fsdp> { using type = FullyShardedDataParallel<Cfg>; };
template <class Cfg> struct pick_wrapper<Cfg, fsdp2> { using type = FullyShardedDataParallel2<Cfg>; };
}  // namespace detail

//! The wrapper a config selects.
template <config_type Cfg>
using data_parallel_t = typename detail::pick_wrapper<Cfg>::type;

}  // namespace tessera
