#pragma once
//! \file dp_engine: the unit state machine both wrappers share. It walks the
//! micro-batch protocol (begin, gather and release, gradient views,
//! reductions, finish, zero) over parts that own their state: unit_registry
//! (units, parameters, layouts), unit_store (each unit's buffers),
//! gather_pool (gathered units) and reduction_pool (reductions in flight).
//! Users reach all of it through the wrapper and its shard_view only.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/core/checksum.hpp"
#include "tessera/wrapper/detail/engine_collectives.hpp"

namespace tessera::detail {

template <config_type Cfg>
class dp_engine : public engine_collectives<Cfg> {
  using base = engine_collectives<Cfg>;
  // The state lives in the base (engine_collectives.hpp); name it here.
  using base::comm_, base::outer_, base::opt_, base::reg_, base::store_, base::units_, base::deferred_,
      base::slots_, base::late_, base::gathers_, base::exact_, base::plan_, base::rows_;
  using base::grads_ready_, base::mb_open_, base::solo_, base::touched_, base::set_digest_, base::mb_index_, base::mb_count_,
      base::last_gathered_;
  using base::exact, base::acquire_slot, base::slot_grads, base::issue_reduction, base::reduce_exact,
      base::issue_outer, base::complete_all, base::start_gather, base::invalidate_gathered, base::zero_padding,
      base::exact_alone, base::exact_post, base::allocate_pools, base::config_text, base::note_final,
      base::written_late;
  using typename base::rules, typename base::ops, typename base::C, typename base::M, typename base::G;

public:
  using typename base::strategy, typename base::backend_type;
  using base::rank, base::world, base::replicas, base::replica_rank, base::layout, base::settle, base::settle_all;

  template <class Comm>
  dp_engine(Comm& comm, wrapper_options opt) : base(comm, opt) {}
  //! On a mesh: the strategy over `shard` (S ranks), the config's outer
  //! policy over `replica` (R ranks); see policy/outer.hpp and comm/mesh.hpp.
  template <class Comm>
  dp_engine(Comm& shard, Comm& replica, wrapper_options opt) : base(shard, replica, opt) {}
  ~dp_engine() { drain_noexcept(); }

  // ---- registration and what it fixed ----------------------------------------------
  [[nodiscard]] unit_registry& registry() noexcept { return reg_; }
  [[nodiscard]] const unit_registry& registry() const noexcept { return reg_; }
  //! Fixes the layout, checks that every rank registered the same model
  //! (collective), and allocates. Parameters start at zero.
  void finalize() {
    const std::size_t splits = outer_.splits ? std::size_t(replicas()) : 1;
    reg_.finalize(comm_, opt_.alignment, config_text(),
                  Cfg::wrapper::row_shards ? layout_kind::rows : layout_kind::flat, splits, outer_.communicator());
    solo_ = rules::solo(comm_.size());
    rows_.prepare(reg_.layouts());
    plan_ = rules::plan(reg_.layouts(), comm_.size(), opt_);
    check_host_room(plan_.host_main_weights, "offloading the main weights (wrapper_options::offload_optimizer)");
    store_.allocate(reg_, comm_, solo_, opt_.lend_grad_shards, opt_.offload_optimizer, outer_.communicator());
    if constexpr (exact)
      exact_ = exact_sums<G, backend_type>(rules::exact_sizes(reg_.layouts(), comm_.size()),
                                           rules::exact_part_sizes(reg_.layouts()));
    units_.resize(store_.size());
    late_.resize(store_.size());
    deferred_.resize(store_.size());
    outer_.resize(store_.size());
    allocate_pools();
  }
  [[nodiscard]] const memory_plan& planned() const { return reg_.require_final("planned()"), plan_; }
  [[nodiscard]] const wrapper_options& options() const noexcept { return opt_; }
  [[nodiscard]] comm::handle<backend_type>& communicator() noexcept { return comm_; }
  //! The replica group's communicator; empty (false) on a flat world.
  [[nodiscard]] comm::handle<backend_type>& outer_communicator() noexcept { return outer_.communicator(); }
  //! Sums n partial values (backend memory) over every rank that holds a
  //! distinct part of the optimizer's gradients: the shard group, and the
  //! replicas too under outer<optim> (under outer<no_shard> every replica
  //! holds the same gradients, so each would count them again).
  //! combine_partials does the same with any dtype and operation (a max, an integer sum).
  void sum_partials(double* x, std::size_t n) { combine_partials(x, n, comm::reduce_op::sum); }
  template <class T> void combine_partials(T* x, std::size_t n, comm::reduce_op op) {
    comm_.all_reduce(x, x, n, dtype_of_v<T>, op);
    outer_.combine_partials(x, n, op);
  }
  //! agree_or_throw over the whole mesh: every rank throws if any failed.
  void agree_or_throw(std::exception_ptr err, std::string_view what) {
    std::exception_ptr group;
    try {
      comm::agree_or_throw(comm_, err, what);
    } catch (...) {
      group = std::current_exception();
    }
    outer_.agree_or_throw(group, what);
  }
  //! exact_reduction: each unit's fixed-point scale (what a checkpoint keeps
  //! so that a resumed run continues with the same bits); empty otherwise.
  [[nodiscard]] std::vector<int> exact_scales() const {
    if constexpr (exact) return reg_.require_final("exact_scales()"), exact_.scales();
    else return {};
  }
  void set_exact_scales(std::span<const int> s) {
    reg_.require_final("set_exact_scales()");
    if constexpr (exact) exact_.set_scales(s);
  }

  // ---- parameter values -----------------------------------------------------------
  //! Sets a parameter from its full value in host memory. Every rank passes the
  //! same values and keeps its own piece; no communication.
  void set_param(param_id p, std::span<const M> full) {
    reg_.require_final("set_param()");
    const auto& s = reg_.slot(p);
    TESSERA_CHECK(full.size() == s.numel, "set_param('", s.spec.name, "'): ", full.size(),
                  " values for shape ", s.spec.shape.str(), " (", s.numel, " elements)");
    settle(std::size_t(p.unit));
    store_[std::size_t(p.unit)].weights_ready.wait();
    invalidate_gathered();
    store_.set_param(std::size_t(p.unit), std::size_t(p.index), full);
    checksum64 c;  // what was set where, summed in any order (set_param_digest)
    c.update(&p, sizeof p);
    c.update(full.data(), full.size_bytes());
    set_digest_ += c.digest();
  }
  //! The sum of a digest of every set_param and init_param call's parameter
  //! and values (init_param: its initializer's settings): the optimizer's
  //! step and get_param compare it across ranks, so values set on some ranks
  //! only, or differing between ranks, fail there instead of training apart.
  [[nodiscard]] std::uint64_t set_param_digest() const noexcept { return set_digest_; }
  //! Throws on every rank where the ranks' set_param_digest differ. Collective
  //! (one all-reduce over the shard group, and the replica group on a mesh).
  void check_values_agree(const char* where) {
    comm::label l(where);
    bool same = comm::all_same(comm_, set_digest_);
    // On a mesh the replica groups compare too: a shard group that agrees within itself can differ from its replicas.
    if (outer_.active()) same = comm::all_same(outer_.communicator(), set_digest_ ^ (same ? 0 : 1)) && same;
    TESSERA_CHECK(same, where, ": the ranks hold different parameter values: set_param or init_param was called on "
                  "some ranks only, or with other values or initializers; every rank must make the same calls");
  }
  //! Sets a parameter from value(i) of its element index, on each rank only
  //! for the elements it keeps (unit_store::init_param); `settings` is the
  //! initializer's digest (init::initializer_digest), for set_param_digest.
  template <class F>
  void init_param(param_id p, const F& value, std::uint64_t settings = 0) {
    reg_.require_final("init_param()");
    (void)reg_.slot(p);
    checksum64 c;  // which parameter, how (summed in any order, as set_param's)
    c.update(&p, sizeof p);
    c.update(&settings, sizeof settings);
    set_digest_ += splitmix64(c.digest());
    settle(std::size_t(p.unit));
    store_[std::size_t(p.unit)].weights_ready.wait();
    invalidate_gathered();
    store_.init_param(std::size_t(p.unit), std::size_t(p.index), value);
  }
  //! The whole padded unit of main weights on every rank's host. Collective.
  [[nodiscard]] std::vector<M> gather_main(std::size_t u) {
    (void)layout(u);  // checks u
    settle(u);
    return store_.gather_main(u);
  }
  [[nodiscard]] unit_store<Cfg>& store() noexcept { return store_; }

  //! defer, settle and settle_all: deferred work on a unit (engine_collectives.hpp).
  //! Whether publish_weights communicates nothing (unit_store::publish).
  [[nodiscard]] bool local_publication() const noexcept { return store_.publication_is_local(); }

  // ---- the step: gather, gradients, reduction ------------------------------------
  //! Starts micro-batch `index` of `count`. no_shard and optim communicate only
  //! in the last one; sharded gradients are reduced every micro-batch.
  void begin_micro_batch(int index, int count) {
    reg_.require_final("begin_micro_batch()");
    TESSERA_CHECK(count >= 1 && index >= 0 && index < count, "begin_micro_batch(", index, ", ", count, ")");
    TESSERA_CHECK(index == 0 ? !mb_open_ : (mb_open_ && mb_count_ == count && index == mb_index_ + 1),
                  "begin_micro_batch(", index, ", ", count, ") does not follow micro-batch ", mb_index_, " of ",
                  mb_count_, mb_open_ ? "" : " (none open)",
                  "; micro-batches run 0..count-1, and a step() or zero_grad() ends them");
    // Lent shards are overwritten by the next forward, so a reduction every
    // micro-batch (sharded gradients) cannot accumulate in them.
    TESSERA_CHECK(count == 1 || !lends_shards() || !strategy::shards_grads, "begin_micro_batch(", index, ", ", count,
                  "): gradient shards live in lent memory (wrapper_options.lend_grad_shards), which holds one "
                  "micro-batch's reduction only; take one micro-batch per step or leave lend_grad_shards off");
    TESSERA_CHECK(!exact || std::size_t(world()) * std::size_t(replicas()) * std::size_t(count) <=
                                 (std::size_t(1) << fixed::headroom_bits),
                  "begin_micro_batch(", index, ", ", count, "): exact_reduction sums at most 2^", fixed::headroom_bits,
                  " addends (ranks x micro-batches), this step has ", world() * replicas(), " x ", count);
    if (index > 0) sync_micro_batch();
    touched_ = true;
    mb_index_ = index;
    mb_count_ = count;
    mb_open_ = true;
    for (auto& st : units_) st.reduced = false;
  }

  //! Gradient view of one parameter: its piece of unit_grads.
  [[nodiscard]] std::span<G> grad(param_id p) {
    const auto& s = reg_.slot(p);
    return unit_grads(std::size_t(p.unit)).subspan(s.offset, s.numel);
  }
  //! Gradient view of a whole padded unit (accumulates over micro-batches).
  [[nodiscard]] std::span<G> unit_grads(std::size_t u) {
    check_grad_access(u);
    settle(u);
    if (store_.has_full_grads()) return store_.full_grads(u);
    if (units_[u].grad_slot < 0) units_[u].grad_slot = acquire_slot(u, /*zero grads=*/true);
    return slot_grads(u);
  }
  //! Gradient view of unit u for a writer that, when `fresh`, assigns every
  //! element of every parameter (a GEMM with beta = 0, say) and otherwise
  //! accumulates. A fresh buffer's contents are undefined except the padding,
  //! which is zero; this saves zeroing all gradients every step.
  [[nodiscard]] grad_target<G> unit_grads_for_write(std::size_t u) {
    check_grad_access(u);
    settle(u);
    auto& st = units_[u];
    if (store_.has_full_grads()) return {store_[u].grad_full.span(), std::exchange(store_[u].zero_pending, false)};
    if (st.grad_slot >= 0) return {slot_grads(u), false};
    st.grad_slot = acquire_slot(u, /*zero grads=*/false);
    zero_padding(slot_grads(u), layout(u));  // the slot last held another unit
    return {slot_grads(u), true};
  }

  //! Starts the reduction of unit u's gradients (non-blocking). Each rank must
  //! call it for the same units in the same order.
  void reduce_grads(std::size_t u) {
    reg_.require_final("reduce_grads()");
    auto& st = units_.at(u);
    TESSERA_CHECK(!grads_ready_, "reduce_grads('", layout(u).name(), "') after finish_grad_sync");
    TESSERA_CHECK(!st.reduced, "reduce_grads('", layout(u).name(), "') called twice in one micro-batch: ",
                  reduce_once_hint);
    st.reduced = true;
    touched_ = true;
    settle(u);  // the reduction overwrites the gradients the last update read
    if (store_.has_full_grads()) (void)store_.full_grads(u);  // nobody wrote: zeros
    if constexpr (exact) {
      reduce_exact(u);
      note_final(u);
      return;
    }
    if (solo_) {  // one rank, wire = grad type: the sum over the group is the gradient itself
      note_final(u);
      if (mb_index_ == mb_count_ - 1) issue_outer(u);
      return;
    }
    if (!strategy::shards_grads && mb_index_ != mb_count_ - 1) return;  // accumulate locally, communicate once
    if constexpr (rules::persistent_full_grads) {
      issue_reduction(u, acquire_slot(u, false), store_[u].grad_full.span());
      note_final(u);  // after issue_reduction, which may pre-divide them in place
    } else {
      if (st.grad_slot < 0) st.grad_slot = acquire_slot(u, true);  // no gradient written: zeros
      issue_reduction(u, st.grad_slot, slot_grads(u));
      if (opt_.poison_released && strategy::shards_grads) slots_.note_sent(st.grad_slot, slot_grads(u));
    }
  }

  //! Completes every reduction of this micro-batch; at the last micro-batch the
  //! gradients over each rank's optimizer range are then final.
  void finish_grad_sync() {
    reg_.require_final("finish_grad_sync()");
    if (grads_ready_) return;
    // PyTorch skips parameters without gradients; an optimizer step on stale
    // (zeroed) gradients would still move weights (momentum, weight decay).
    TESSERA_CHECK(touched_, "step() with no gradients since the last step() or zero_grad(): no micro-batch was "
                            "begun and no gradient was written or reduced; run a backward pass first");
    TESSERA_CHECK(mb_index_ == mb_count_ - 1, "finish_grad_sync in micro-batch ", mb_index_, " of ", mb_count_,
                  "; it ends the last one");
    sync_micro_batch();
    outer_.wait_all();
    if (opt_.poison_released)  // before exact_.finish, which writes the final gradients in place
      if (const int u = late_.changed([this](std::size_t v) { return std::span<const G>(store_[v].grad_full.span()); });
          u >= 0)
        fail(written_late(std::size_t(u), " and before the step: this rank would apply them and the others not"));
    if constexpr (exact) {
      const auto max_over = [this](double* x, std::size_t n) {  // every rank of the mesh added its own micro-batches
        comm_.all_reduce(x, x, n, dtype::f64, comm::reduce_op::max);
        outer_.max_over_replicas(x, n);
      };
      exact_.finish(max_over, [this](std::size_t u) { return exact_alone() ? std::span<G>() : store_.opt_grads(u); },
                    exact_post());
    }
    grads_ready_ = true;
  }
  [[nodiscard]] bool grads_ready() const noexcept { return grads_ready_; }

  //! Zeroes every gradient and starts a new accumulation (micro-batch 0 of 1).
  void zero_grad() {
    reg_.require_final("zero_grad()");
    complete_all();
    outer_.wait_all();
    late_.resize(store_.size());  // an abandoned step's gradients are nobody's now
    store_.start_accumulation();
    if constexpr (exact) exact_.begin();
    for (auto& st : units_) {
      st.reduced = false;
      st.grad_slot = -1;
    }
    slots_.clear();
    grads_ready_ = mb_open_ = touched_ = false;
    mb_index_ = 0;
    mb_count_ = 1;
  }

  // ---- what the optimizer works on (unit_store has the buffers) ------------------
  //! The part of the optimizer's gradients this rank counts in the global norm:
  //! the optimizer range where sharded; the rank's shard of the replicated
  //! gradient for no_shard, so that one all-reduce of the partial sums gives
  //! the norm on every world size.
  [[nodiscard]] std::span<G> norm_grads(std::size_t u) {
    settle(u);
    if (strategy::shards_optimizer || solo_) return store_.opt_grads(u);
    return store_.opt_grads(u).subspan(layout(u).shard_begin(rank()), layout(u).shard_numel());
  }
  //! Tensor t's part of norm_grads(u), in its coordinates (empty where this
  //! rank counts none of it): a norm that counts tensors apart (tensor
  //! parallelism's replicated ones once) reads norm_grads(u) through these.
  [[nodiscard]] piece norm_piece(std::size_t u, std::size_t t) const {
    const piece p = rules::range_piece(layout(u), t, rank(), store_.part());
    if (strategy::shards_optimizer || solo_) return p;
    return clip(p, layout(u).shard_begin(rank()), layout(u).shard_numel());
  }
  //! After the optimizer wrote main weights (and, if `converted`, the compute
  //! weights through compute_out): refresh the compute weights and, where they
  //! are replicated but the optimizer is sharded, start their all-gather.
  void publish_weights(bool converted = false) {
    settle_all();
    invalidate_gathered();
    store_.publish(converted);
  }
  //! Drops every cached gathered copy (optim_grads_params): the next gather all-gathers again.
  void release_gathered() { invalidate_gathered(); }

  //! Unit u's reduced gradient shard lives in `memory` from now on
  //! (wrapper_options::lend_grad_shards; see the wrapper's lend_grad_shard).
  void lend_grad_shard(std::size_t u, std::span<G> memory) {
    const auto& L = layout(u);
    TESSERA_CHECK(opt_.lend_grad_shards, "lend_grad_shard('", L.name(),
                  "') needs wrapper_options.lend_grad_shards (the wrapper owns its gradient shards otherwise)");
    TESSERA_CHECK(!mb_open_ && !grads_ready_, "lend_grad_shard('", L.name(),
                  "') during a step; lend between steps (after step() or zero_grad())");
    if (!lends_shards()) return;  // no shard: nothing sharded, or one rank holds everything
    settle(u);  // a deferred update reads the shard where it was
    TESSERA_CHECK(memory.size() >= L.shard_numel(), "lend_grad_shard('", L.name(), "'): ", memory.size(),
                  " elements lent, its gradient shard needs ", L.shard_numel());
    TESSERA_CHECK(reinterpret_cast<std::uintptr_t>(memory.data()) % 16 == 0, "lend_grad_shard('", L.name(),
                  "'): memory not 16-byte aligned");
    store_.lend(u, memory.data());
  }
  //! Whether gradient shards live in memory lent by the caller.
  [[nodiscard]] bool lends_shards() const noexcept { return opt_.lend_grad_shards && store_.has_shards(); }
  //! Waits for every collective in flight.
  void synchronize() {
    settle_all();
    complete_all();
    outer_.wait_all();
    store_.wait_weights();
    gathers_.wait_all();
  }

  // ---- gathering --------------------------------------------------------------------
  //! Gathered (or replicated) compute weights of unit u while a scope holds it.
  [[nodiscard]] std::span<const C> unit_weights(std::size_t u) const {
    const auto& L = layout(u);
    TESSERA_CHECK(units_[u].holders > 0, "weights of unit '", L.name(),
                  "' used while released; take them inside gather(unit)");
    if (strategy::shards_params && !solo_) return gathers_.data(u, L.padded_numel());
    return store_[u].weights.span();  // replicated, or the one rank's shard is the whole unit
  }
  //! Takes a hold on unit u: gathers it (optim_grads_params; and prefetches
  //! the next unit in the direction of travel), or waits for its weights.
  void acquire(std::size_t u) {
    reg_.require_final("gather()");
    auto& st = units_.at(u);
    settle(u);
    if (!strategy::shards_params || solo_) {
      store_[u].weights_ready.wait();
      st.holders++;
      return;
    }
    if (!gathers_.holds(u)) start_gather(u, /*for_prefetch=*/false);
    gathers_.wait(u);
    const int dir = (last_gathered_ < 0 || int(u) > last_gathered_) ? 1 : -1;
    last_gathered_ = int(u);
    st.holders++;
    const long next = long(u) + dir;
    if (opt_.prefetch && next >= 0 && std::size_t(next) < units_.size() && !gathers_.holds(std::size_t(next)))
      start_gather(std::size_t(next), /*for_prefetch=*/true);
  }
  void release(std::size_t u) noexcept {
    if (units_[u].holders > 0) units_[u].holders--;
    if constexpr (strategy::shards_params)
      if (opt_.poison_released && !solo_ && units_[u].holders == 0) try {
          gathers_.poison(u, layout(u).padded_numel(), layout(u).name().c_str());
        } catch (...) {
          // The gather failed; its error comes from the next wait.
        }
  }


private:
  // Both misuses of a reduced unit have the same two causes.
  static constexpr const char* reduce_once_hint =
      "a unit is reduced once per micro-batch, after the last gradient of it is written (a unit used in "
      "several places, as a tied embedding and head, after its last use in backward, which is its first in "
      "forward; gathering it again for that is fine); to accumulate several micro-batches, call "
      "begin_micro_batch(index, count) before each one's backward";
  // Units the trainer did not reduce are reduced now, last unit first (the
  // order backward would have used), then everything in flight completes.
  void sync_micro_batch() {
    for (std::size_t u = units_.size(); u-- > 0;)
      if (!units_[u].reduced) reduce_grads(u);
    complete_all();
  }

  void check_grad_access(std::size_t u) {
    reg_.require_final("grad()");
    touched_ = true;
    const auto& L = layout(u);
    TESSERA_CHECK(!grads_ready_, "gradient of unit '", L.name(),
                  "' requested after finish_grad_sync; call step() or zero_grad() first");
    TESSERA_CHECK(!units_[u].reduced, "gradient of unit '", L.name(),
                  "' requested after reduce_grads in the same micro-batch: ", reduce_once_hint);
    if constexpr (strategy::shards_params)
      TESSERA_CHECK(units_[u].holders > 0, "gradient view of unit '", L.name(),
                    "' requested while the unit is released; take it inside gather(unit)");
  }
  void drain_noexcept() noexcept {
    try {
      if (reg_.finalized()) synchronize();
    } catch (...) {
      // A destructor cannot report; requests already terminated on real failures.
    }
  }
};

}  // namespace tessera::detail
