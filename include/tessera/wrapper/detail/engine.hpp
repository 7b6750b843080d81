#pragma once
//! \file dp_engine: the unit state machine both wrappers share. It walks the
//! micro-batch protocol (begin, gather and release, gradient views,
//! reductions, finish, zero) over parts that own their state: unit_registry
//! (units, parameters, layouts), unit_store (each unit's buffers),
//! gather_pool (gathered units) and reduction_pool (reductions in flight).
//! Users reach all of it through the wrapper and its shard_view only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string_view>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tessera/backend/memory.hpp"
#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/comm/trace.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/policy/config.hpp"
#include "tessera/shard/layout.hpp"
#include "tessera/wrapper/detail/convert.hpp"
#include "tessera/wrapper/detail/exact_sum.hpp"
#include "tessera/wrapper/detail/gather_pool.hpp"
#include "tessera/wrapper/detail/outer_link.hpp"
#include "tessera/wrapper/detail/reduction_pool.hpp"
#include "tessera/wrapper/detail/registry.hpp"
#include "tessera/wrapper/detail/row_copy.hpp"
#include "tessera/wrapper/detail/storage.hpp"
#include "tessera/wrapper/detail/unit_store.hpp"
#include "tessera/wrapper/options.hpp"

namespace tessera::detail {

template <config_type Cfg>
class dp_engine {
public:
  using strategy = typename Cfg::strategy;
  using backend_type = typename Cfg::backend_type;
  static_assert(backend_available<backend_type>,
                "tessera: this translation unit does not see the config's backend; include "
                "tessera/backend/cuda/ops.cuh (compile with nvcc) for backend::cuda");

private:
  using rules = storage<Cfg>;
  using ops = backend_ops<backend_type>;
  using C = typename rules::C;
  using M = typename rules::M;
  using G = typename rules::G;
  using W = typename rules::W;
  using pool_type = reduction_pool<G, W, backend_type>;
  using landing = typename pool_type::landing;
  static constexpr bool exact = Cfg::reduction::exact;

public:
  template <class Comm>
  dp_engine(Comm& comm, wrapper_options opt) : comm_(comm), opt_(opt) {
    check_options();
  }
  //! On a mesh: the strategy over `shard` (S ranks), the config's outer
  //! policy over `replica` (R ranks); see policy/outer.hpp and comm/mesh.hpp.
  template <class Comm>
  dp_engine(Comm& shard, Comm& replica, wrapper_options opt) : comm_(shard), outer_(replica), opt_(opt) {
    check_options();
  }
  dp_engine(const dp_engine&) = delete;
  dp_engine& operator=(const dp_engine&) = delete;
  ~dp_engine() { drain_noexcept(); }

private:
  void check_options() {
    const wrapper_options& opt = opt_;
    if (const char* e = std::getenv("TESSERA_POISON"); e && std::string_view(e) == "1") opt_.poison_released = true;
    TESSERA_CHECK(opt.alignment >= 1, "wrapper_options.alignment must be at least 1");
    TESSERA_CHECK(opt.gather_buffers >= 1, "wrapper_options.gather_buffers must be at least 1");
    TESSERA_CHECK(opt.grad_buffers >= 1, "wrapper_options.grad_buffers must be at least 1");
    TESSERA_CHECK(opt.offload_optimizer >= 0 && opt.offload_optimizer <= 1,
                  "wrapper_options.offload_optimizer is a fraction from 0 to 1, got ", opt.offload_optimizer);
  }

public:

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
    deferred_.resize(store_.size());
    outer_.resize(store_.size());
    allocate_pools();
  }
  [[nodiscard]] const memory_plan& planned() const { return reg_.require_final("planned()"), plan_; }
  [[nodiscard]] const wrapper_options& options() const noexcept { return opt_; }
  [[nodiscard]] int rank() const { return comm_.rank(); }
  [[nodiscard]] int world() const { return comm_.size(); }
  [[nodiscard]] comm::handle<backend_type>& communicator() noexcept { return comm_; }
  //! Replica groups of the mesh (1 on a flat world) and this rank's among them.
  [[nodiscard]] int replicas() const { return outer_.size(); }
  [[nodiscard]] int replica_rank() const { return outer_.rank(); }
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
  [[nodiscard]] const unit_layout& layout(std::size_t u) const { return reg_.layout(u); }
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
    const auto& s = reg_.slot(p);
    TESSERA_CHECK(full.size() == s.numel, "set_param('", s.spec.name, "'): ", full.size(),
                  " values for shape ", s.spec.shape.str(), " (", s.numel, " elements)");
    settle(std::size_t(p.unit));
    store_[std::size_t(p.unit)].weights_ready.wait();
    invalidate_gathered();
    store_.set_param(std::size_t(p.unit), std::size_t(p.index), full);
  }
  //! Sets a parameter from value(i) of its element index, on each rank only
  //! for the elements it keeps (unit_store::init_param).
  template <class F>
  void init_param(param_id p, const F& value) {
    reg_.require_final("init_param()");
    (void)reg_.slot(p);
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

  // ---- deferred work on a unit -------------------------------------------------------
  //! Unit u has work queued that writes its weights or optimizer state and
  //! reads its gradients (an optimizer update in the next forward's shadow);
  //! `wait` makes the current stream wait for it (the host backend runs it
  //! then). Every later use of u's weights or gradients settles it first.
  void defer(std::size_t u, std::function<void()> wait) {
    settle(u);
    deferred_.at(u) = std::move(wait);
  }
  //! The current stream waits for unit u's deferred work (no host wait on CUDA).
  void settle(std::size_t u) {
    if (auto w = std::exchange(deferred_.at(u), nullptr)) w();
  }
  void settle_all() {
    for (std::size_t u = 0; u < deferred_.size(); ++u) settle(u);
  }
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
    TESSERA_CHECK(!st.reduced, "reduce_grads('", layout(u).name(), "') called twice in one micro-batch");
    st.reduced = true;
    touched_ = true;
    settle(u);  // the reduction overwrites the gradients the last update read
    if (store_.has_full_grads()) (void)store_.full_grads(u);  // nobody wrote: zeros
    if constexpr (exact) return reduce_exact(u);
    if (solo_) {  // one rank, wire = grad type: the sum over the group is the gradient itself
      if (mb_index_ == mb_count_ - 1) issue_outer(u);
      return;
    }
    if (!strategy::shards_grads && mb_index_ != mb_count_ - 1) return;  // accumulate locally, communicate once
    if constexpr (rules::persistent_full_grads) {
      issue_reduction(u, acquire_slot(u, false), store_[u].grad_full.span());
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
          gathers_.poison(u, layout(u).padded_numel());
        } catch (...) {
          // The gather failed; its error comes from the next wait.
        }
  }

private:
  // What decides the collectives besides the model; ranks must agree on it.
  std::string config_text() const {
    return std::string(strategy::name) + " / " + std::string(Cfg::wrapper::name) + " / compute " +
           std::string(name_of(dtype_of_v<C>)) + ", main " + std::string(name_of(dtype_of_v<M>)) + ", grads " +
           std::string(name_of(dtype_of_v<G>)) + ", wire " + std::string(name_of(dtype_of_v<W>)) + " / " +
           std::string(Cfg::averaging::name) + " / alignment " + std::to_string(opt_.alignment) + " / outer " +
           std::string(Cfg::outer_type::name) + " x " + std::to_string(replicas()) + " / reduction " +
           std::string(Cfg::reduction::name);
  }
  // Where each unit is in the micro-batch protocol.
  struct unit_state {
    int holders = 0;     // live scopes
    bool reduced = false;  // reduce_grads called in this micro-batch
    int grad_slot = -1;  // reduction slot holding this micro-batch's full gradients (sharded grads)
  };

  void allocate_pools() {
    if (solo_) return;
    std::size_t max_padded = 0, max_shard = 0;
    for (const auto& L : reg_.layouts()) {
      max_padded = std::max(max_padded, L.padded_numel());
      max_shard = std::max(max_shard, L.shard_numel());
    }
    const bool permuted = reg_.layouts().front().permuted();
    slots_ = pool_type(opt_.grad_buffers, strategy::shards_grads ? max_padded : 0,
                       rules::needs_wire(permuted) ? max_padded : 0,
                       strategy::shards_optimizer && !rules::wire_is_grad ? max_shard : 0,
                       exact && strategy::shards_grads ? fixed::limbs_per_element * max_padded : 0,
                       exact && strategy::shards_optimizer ? fixed::limbs_per_element * max_shard : 0);
    if constexpr (strategy::shards_params)
      gathers_ = gather_pool<C, backend_type>(comm_, opt_.gather_buffers, max_padded, units_.size(), permuted);
  }

  // Converts src into the slot's wire buffer (pre-dividing) and starts the
  // collective: an all-reduce of the whole unit where the optimizer is
  // replicated, a reduce-scatter into the gradient shard where it is sharded.
  void issue_reduction(std::size_t u, int s, std::span<G> src) {
    const auto& L = layout(u);
    const int N = world();
    const float pre = std::is_same_v<typename Cfg::averaging, pre_divide> ? 1.0f / float(N * replicas()) : 1.0f;
    const auto op = std::is_same_v<typename Cfg::averaging, average_in_collective> ? comm::reduce_op::avg
                                                                                    : comm::reduce_op::sum;
    W* send;
    if (L.permuted()) {  // rows layout: into shard order, converted and scaled in the same pass
      send = slots_[s].wire.data();
      rows_.copy_in(u, L, src.data(), send, pre);
    } else if constexpr (rules::wire_is_grad) {
      if (pre != 1.0f) ops::for_each(src.size(), scale_convert<G, G>{src.data(), src.data(), pre});
      send = src.data();
    } else {
      send = slots_[s].wire.data();
      ops::for_each(src.size(), scale_convert<W, G>{src.data(), send, pre});
    }
    const std::size_t n = L.shard_numel();
    const bool fresh = store_[u].shard_fresh;
    comm::label lbl("reduce_grads", L.name().c_str());
    if constexpr (!strategy::shards_optimizer) {
      slots_.issue(s, comm_.iall_reduce(send, send, L.padded_numel(), dtype_of_v<W>, op), landing::all_reduced,
                   store_[u].grad_full.data(), L.padded_numel(), post_scale(), false);
    } else if constexpr (rules::wire_is_grad) {
      // Straight into the gradient shard. A shard that already holds earlier
      // micro-batches is folded into this rank's piece of the send buffer first
      // (times N where the reduction is divided by N afterwards: avg in the
      // collective, or post_divide), so the collective delivers the running
      // sum and no staging shard is needed.
      G* shard = store_.shard(u).data();
      if (!fresh) {
        const bool divided = op == comm::reduce_op::avg || post_scale() != 1.0f;
        ops::for_each(n, accumulate_convert<G, G>{shard, send + L.shard_begin(rank()), divided ? float(N) : 1.0f, false});
      }
      slots_.issue(s, comm_.ireduce_scatter(send, shard, n, dtype_of_v<W>, op), landing::direct, shard, n,
                   post_scale(), false);
    } else {
      G* shard = store_.shard(u).data();  // where it lands after conversion: fail now, before the collective, if missing
      slots_.issue(s, comm_.ireduce_scatter(send, slots_[s].wire_shard.data(), n, dtype_of_v<W>, op),
                   landing::staged, shard, n, post_scale(), fresh);
    }
  }

  // exact_reduction (exact_sum.hpp): this micro-batch's gradients of unit u
  // onto the unit's grid. Where gradients accumulate locally (no_shard,
  // optim, one rank) they join the unit's accumulator, whose limbs the last
  // micro-batch all-reduces (no_shard) or reduce-scatters (optim); sharded
  // gradients are reduce-scattered as limbs every micro-batch and land in
  // the accumulated shard. finish_grad_sync turns the limbs into gradients.
  void reduce_exact(std::size_t u) {
    const auto& L = layout(u);
    comm::label lbl("reduce_grads", L.name().c_str());
    if (exact_alone()) return;
    if (store_.has_full_grads()) {
      exact_.add(u, std::span<const G>(store_.full_grads(u)));
      store_[u].zero_pending = true;  // the next micro-batch writes afresh
      if (mb_index_ != mb_count_ - 1) return;
      if (solo_) return issue_outer(u);  // one rank per group: the group's sum is this rank's
      const int s = acquire_slot(u, false);
      const std::size_t shard_limbs = fixed::limbs_per_element * L.shard_numel();
      if constexpr (!strategy::shards_optimizer)
        slots_.issue_limbs(s, comm_.iall_reduce(exact_.limbs(u), exact_.limbs(u), fixed::limbs_per_element * L.padded_numel(),
                                                dtype::i64, comm::reduce_op::sum),
                           landing::none, nullptr, 0, false);
      else
        slots_.issue_limbs(s, comm_.ireduce_scatter(exact_.limbs(u), slots_[s].limbs_shard.data(), shard_limbs, dtype::i64,
                                                    comm::reduce_op::sum),
                           landing::limbs, exact_.limbs(u), shard_limbs, /*overwrite=*/true);
      return;
    }
    auto& st = units_[u];
    if (st.grad_slot < 0) st.grad_slot = acquire_slot(u, true);  // no gradient written: zeros
    const int s = st.grad_slot;
    std::span<const G> g = slot_grads(u);
    if (L.permuted()) {  // rows layout: into shard order first
      rows_.copy_in(u, L, g.data(), slots_[s].wire.data(), 1.0f);
      g = std::span<const G>(slots_[s].wire.data(), L.padded_numel());
    }
    exact_.round(u, g, slots_[s].limbs.data());
    const std::size_t shard_limbs = fixed::limbs_per_element * L.shard_numel();
    slots_.issue_limbs(s, comm_.ireduce_scatter(slots_[s].limbs.data(), slots_[s].limbs_shard.data(), shard_limbs, dtype::i64,
                                                comm::reduce_op::sum),
                       landing::limbs, exact_.limbs(u), shard_limbs, exact_.take_fresh(u));
    if (opt_.poison_released) slots_.note_sent(s, slot_grads(u));
  }
  // One rank, no replicas, one micro-batch: each sum has one addend, which is
  // its own exact sum (and no other world size runs this step's single
  // micro-batch), so the gradients pass through.
  bool exact_alone() const noexcept { return solo_ && mb_count_ == 1 && !outer_.active(); }
  // exact_reduction's 1/N: the averaging policies divide the exact sum once.
  double exact_post() const {
    return std::is_same_v<typename Cfg::averaging, tessera::sum> ? 1.0 : 1.0 / (double(world()) * replicas());
  }

  // A reduction slot for unit u: a free one, else the oldest reduction in flight is completed.
  int acquire_slot(std::size_t u, bool zero_grads) {
    int s = slots_.free_slot();
    if (s < 0) {
      s = slots_.oldest_pending();
      if (s < 0)
        fail("unit '" + layout(u).name() + "': all " + std::to_string(slots_.size()) +
             " gradient buffers hold gradients not yet reduced; call reduce_grads sooner or raise "
             "wrapper_options.grad_buffers");
      complete(s);
    }
    if constexpr (strategy::shards_grads)
      if (opt_.poison_released)
        if (const int was = slots_.poisoned_unit(s); was >= 0) {
          const auto& L = layout(std::size_t(was));
          if (!slots_.still_poisoned(s, L.padded_numel()))
            fail("a gradient span of unit '" + L.name() + "' was written after its reduction completed (after "
                 "reduce_grads('" + L.name() + "') and the step or micro-batch that finished it); gradient views "
                 "are valid until reduce_grads of their unit (found by wrapper_options::poison_released)");
        }
    slots_[s].unit = int(u);
    if constexpr (strategy::shards_grads)
      if (zero_grads) ops::fill(slots_[s].grad.span().first(layout(u).padded_numel()), G{});
    return s;
  }
  std::span<G> slot_grads(std::size_t u) {
    return slots_[units_[u].grad_slot].grad.span().first(layout(u).padded_numel());
  }
  void complete(int s) {
    std::string misuse;
    if constexpr (strategy::shards_grads)
      if (opt_.poison_released && slots_[s].unit >= 0) {
        const auto& L = layout(std::size_t(slots_[s].unit));
        if (!slots_.poison_on_landing(s, L.padded_numel()))
          misuse = "gradients of unit '" + L.name() + "' were written after reduce_grads('" + L.name() +
                   "'), while its reduction was in flight; gradient views are valid until reduce_grads of their "
                   "unit (found by wrapper_options::poison_released)";
      }
    const std::size_t u = std::size_t(slots_.complete(s));
    store_[u].shard_fresh = false;
    if (units_[u].grad_slot == s) units_[u].grad_slot = -1;
    if (mb_index_ == mb_count_ - 1) issue_outer(u);  // the group's sum is final: on to the replicas
    if (!misuse.empty()) fail(misuse);  // after the bookkeeping: the wrapper stays usable
  }
  void complete_all() {
    for (int s; (s = slots_.oldest_pending()) >= 0;) complete(s);  // in issue order, as on every rank
  }
  // Units the trainer did not reduce are reduced now, last unit first (the
  // order backward would have used), then everything in flight completes.
  void sync_micro_batch() {
    for (std::size_t u = units_.size(); u-- > 0;)
      if (!units_[u].reduced) reduce_grads(u);
    complete_all();
  }

  // On a mesh: unit u's gradients are final within the shard group for the
  // step; on to the replicas (outer_link::issue).
  void issue_outer(std::size_t u) {
    if (!outer_.active()) return;  // (and the spans below are not touched on a flat world)
    if constexpr (exact) {  // the group's limbs (the group_grads' extent), summed across replicas as integers
      const std::size_t n =
          fixed::limbs_per_element * (store_.has_shards() ? layout(u).shard_numel() : layout(u).padded_numel());
      outer_.issue_limbs(u, exact_.limbs(u), n, exact_.has_part(u) ? exact_.part_limbs(u) : nullptr, layout(u).name());
    } else {
      outer_.issue(u, store_.group_grads(u), store_.opt_grads(u), solo_, layout(u).name());
    }
  }

  void start_gather(std::size_t u, bool for_prefetch) {
    settle(u);  // the shard's update (the collective is ordered after the current stream)
    store_[u].weights_ready.wait();  // outer<optim>: the replicas' parts of the new shard
    const auto held = [this](std::size_t v) { return units_[v].holders > 0; };
    comm::label lbl(for_prefetch ? "prefetch" : "gather", layout(u).name().c_str());
    const auto& L = layout(u);
    const auto copy = [this, u, &L](const C* gathered, C* out) { rows_.copy_out(u, L, gathered, out); };
    if (gathers_.start(u, store_[u].weights.data(), L.shard_numel(), held, copy)) return;
    if (for_prefetch) return;  // every buffer in use: skip the prefetch
    fail("gather('" + layout(u).name() + "'): all " + std::to_string(gathers_.size()) +
         " gather buffers are held by live scopes; release one or raise wrapper_options.gather_buffers");
  }
  // Gathered copies stay valid until the weights change; drop them then.
  void invalidate_gathered() {
    last_gathered_ = -1;
    gathers_.drop_all();
  }
  // What a reduced sum is multiplied by after the collective (post_divide: 1/N).
  float post_scale() const {
    return std::is_same_v<typename Cfg::averaging, post_divide> ? 1.0f / float(world()) : 1.0f;
  }
  void check_grad_access(std::size_t u) {
    reg_.require_final("grad()");
    touched_ = true;
    const auto& L = layout(u);
    TESSERA_CHECK(!grads_ready_, "gradient of unit '", L.name(),
                  "' requested after finish_grad_sync; call step() or zero_grad() first");
    TESSERA_CHECK(!units_[u].reduced, "gradient of unit '", L.name(),
                  "' requested after reduce_grads in the same micro-batch",
                  mb_count_ == 1
                      ? std::string()
                      : std::string("; with several micro-batches, call begin_micro_batch(index, count) before each "
                                    "one's backward (it was not called since the last micro-batch)"));
    if constexpr (strategy::shards_params)
      TESSERA_CHECK(units_[u].holders > 0, "gradient view of unit '", L.name(),
                    "' requested while the unit is released; take it inside gather(unit)");
  }
  // Zeroes the padding between and after a unit's tensors in a buffer laid out like L.
  static void zero_padding(std::span<G> g, const unit_layout& L) {
    std::size_t end = 0;
    for (const auto& t : L.tensors()) {
      if (t.offset > end) ops::fill(g.subspan(end, t.offset - end), G{});
      end = t.offset + t.numel;
    }
    if (L.padded_numel() > end) ops::fill(g.subspan(end, L.padded_numel() - end), G{});
  }
  void drain_noexcept() noexcept {
    try {
      if (reg_.finalized()) synchronize();
    } catch (...) {
      // A destructor cannot report; requests already terminated on real failures.
    }
  }

  comm::handle<backend_type> comm_;
  outer_link<Cfg> outer_;  // the replica group on a mesh of R > 1 groups; inactive otherwise
  wrapper_options opt_;
  unit_registry reg_;
  unit_store<Cfg> store_;
  std::vector<unit_state> units_;
  std::vector<std::function<void()>> deferred_;  // per unit: waits for its deferred work (defer)
  pool_type slots_;
  row_copies<backend_type> rows_;  // the rows layout's copies (fsdp2)
  gather_pool<C, backend_type> gathers_;
  exact_sums<G, backend_type> exact_;  // exact_reduction only
  memory_plan plan_;
  bool grads_ready_ = false, mb_open_ = false, solo_ = false;
  bool touched_ = false;  // a micro-batch began or a gradient was written or reduced since zero_grad
  int mb_index_ = 0, mb_count_ = 1, last_gathered_ = -1;
};

}  // namespace tessera::detail
