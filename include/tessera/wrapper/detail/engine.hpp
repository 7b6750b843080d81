#pragma once
//! \file The machinery both wrappers share: registration, flat buffers per
//! unit, the gather pool, gradient reduction with accumulation, averaging and
//! wire-dtype conversion, and the weight publication after an optimizer step.
//!
//! Vocabulary used below, per unit and rank:
//! - compute weights (C): the full padded unit when parameters are replicated,
//!   the rank's shard under optim_grads_params (gathered into a pool slot on use);
//! - optimizer range: what this rank's optimizer updates. The full padded unit
//!   for no_shard (every rank updates identically), the rank's shard otherwise;
//! - main weights (M) over the optimizer range. When M == C they alias the
//!   compute weights, so full_precision holds each weight once;
//! - gradients (G): a persistent full buffer for no_shard and optim (they
//!   accumulate micro-batches locally and communicate once), pool slots for
//!   optim_grads and optim_grads_params, which reduce-scatter every micro-batch
//!   and accumulate into a persistent shard.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/policy/config.hpp"
#include "tessera/shard/layout.hpp"
#include "tessera/wrapper/options.hpp"

namespace tessera::detail {

//! y[i] = convert(x[i]) * s
template <class To, class From>
struct scale_convert {
  const From* x;
  To* y;
  double s;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const { y[i] = convert<To>(convert<float>(x[i]) * float(s)); }
};
//! y[i] += convert(x[i]) * s  (or = when overwrite)
template <class To, class From>
struct accumulate_convert {
  const From* x;
  To* y;
  float s;
  bool overwrite;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const {
    const float v = convert<float>(x[i]) * s;
    y[i] = overwrite ? convert<To>(v) : convert<To>(convert<float>(y[i]) + v);
  }
};

//! n elements of T in device memory shared with the other ranks where the
//! communicator offers it (comm::handle::alloc_symmetric: collectives between
//! such buffers may take a faster path), else a plain backend buffer.
template <class T, class B>
class comm_buffer {
public:
  comm_buffer() = default;
  comm_buffer(comm::handle<B> c, std::size_t n, bool shared) : n_(n) {
    if (shared && n > 0)
      if (void* p = c.alloc_symmetric(n * sizeof(T))) {
        comm_ = std::move(c);
        ptr_ = static_cast<T*>(p);
        return;
      }
    own_ = typename backend_ops<B>::template buffer<T>(n);
    ptr_ = own_.data();
  }
  comm_buffer(comm_buffer&& o) noexcept
      : own_(std::move(o.own_)), comm_(std::move(o.comm_)), ptr_(std::exchange(o.ptr_, nullptr)),
        n_(std::exchange(o.n_, 0)) {}
  comm_buffer& operator=(comm_buffer&& o) noexcept {
    if (this != &o) {
      release();
      own_ = std::move(o.own_);
      comm_ = std::move(o.comm_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~comm_buffer() { release(); }
  [[nodiscard]] T* data() noexcept { return ptr_; }
  [[nodiscard]] std::span<T> span() noexcept { return {ptr_, n_}; }
  [[nodiscard]] std::span<const T> span() const noexcept { return {ptr_, n_}; }

private:
  void release() noexcept {
    if (comm_ && ptr_) comm_.free_symmetric(ptr_);
    comm_ = {};
    ptr_ = nullptr;
  }
  typename backend_ops<B>::template buffer<T> own_;
  comm::handle<B> comm_;  // set when the memory came from the communicator
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
};

template <config_type Cfg>
class dp_engine {
public:
  using config = Cfg;
  using strategy = typename Cfg::strategy;
  using backend_type = typename Cfg::backend_type;
  using compute_type = typename Cfg::compute_type;
  using main_type = typename Cfg::main_type;
  using grad_type = typename Cfg::grad_type;
  using wire_type = typename Cfg::wire_type;
  static_assert(backend_available<backend_type>,
                "tessera: this translation unit does not see the config's backend; include "
                "tessera/backend/cuda/ops.cuh (compile with nvcc) for backend::cuda");

private:
  using ops = backend_ops<backend_type>;
  template <class T> using buffer = typename ops::template buffer<T>;
  using C = compute_type;
  using M = main_type;
  using G = grad_type;
  using W = wire_type;
  static constexpr bool main_aliases_compute = std::is_same_v<C, M>;
  static constexpr bool wire_is_grad = std::is_same_v<W, G>;
  static constexpr bool persistent_full_grads = !strategy::shards_grads;

public:
  template <class Comm>
  dp_engine(Comm& comm, wrapper_options opt) : comm_(comm), opt_(opt) {
    TESSERA_CHECK(opt.alignment >= 1, "wrapper_options.alignment must be at least 1");
    TESSERA_CHECK(opt.gather_buffers >= 1, "wrapper_options.gather_buffers must be at least 1");
    TESSERA_CHECK(opt.grad_buffers >= 1, "wrapper_options.grad_buffers must be at least 1");
  }
  dp_engine(const dp_engine&) = delete;
  dp_engine& operator=(const dp_engine&) = delete;
  ~dp_engine() { drain_noexcept(); }

  // ---- registration -----------------------------------------------------------
  unit_id add_unit(std::string name) {
    check_open("add_unit('" + name + "')");
    for (auto& s : specs_) TESSERA_CHECK(s.name != name, "unit '", name, "' registered twice");
    specs_.push_back({std::move(name), {}});
    return unit_id{int(specs_.size()) - 1};
  }
  param_id add_param(unit_id u, std::string name, shape s, bool weight_decay = true) {
    check_open("add_param('" + name + "')");
    TESSERA_CHECK(u.index >= 0 && std::size_t(u.index) < specs_.size(), "add_param('", name, "'): unknown unit ",
                  u.index);
    auto& unit = specs_[std::size_t(u.index)];
    for (auto& t : unit.tensors)
      TESSERA_CHECK(t.name != name, "parameter '", name, "' registered twice in unit '", unit.name, "'");
    unit.tensors.push_back(tensor_spec{std::move(name), std::move(s), weight_decay});
    return param_id{u.index, int(unit.tensors.size()) - 1};
  }

  //! Fixes the layout, checks that every rank registered the same model
  //! (collective), and allocates. Parameters start at zero.
  void finalize() {
    check_open("finalize()");
    TESSERA_CHECK(!specs_.empty(), "finalize() with no unit registered");
    for (auto& s : specs_) layouts_.emplace_back(s.name, s.tensors, comm_.size(), opt_.alignment);
    verify_agreement();
    solo_ = solo(comm_.size());
    plan_ = plan(layouts_, comm_.size(), opt_);
    allocate();
    finalized_ = true;
  }

  //! What this rank will hold, computed from the layout alone (valid after finalize).
  [[nodiscard]] static memory_plan plan(const std::vector<unit_layout>& units, int world, const wrapper_options& o) {
    memory_plan p;
    std::size_t max_padded = 0;
    const bool alone = solo(world);
    for (auto& u : units) {
      const std::size_t full = u.padded_numel(), shard = u.shard_numel();
      const std::size_t opt_range = strategy::shards_optimizer ? shard : full;
      max_padded = std::max(max_padded, full);
      p.compute_weights += (strategy::shards_params ? shard : full) * sizeof(C);
      if (!main_aliases_compute) p.main_weights += opt_range * sizeof(M);
      if (persistent_full_grads || alone) p.grads += full * sizeof(G);
      if (strategy::shards_optimizer && !alone && !o.lend_grad_shards) p.grads += shard * sizeof(G);
    }
    if (alone) return p;  // no gather or reduction buffers: nothing is communicated
    if (strategy::shards_params) p.gathered_buffers = std::size_t(o.gather_buffers) * max_padded * sizeof(C);
    p.reduction_buffers = std::size_t(o.grad_buffers) * slot_bytes(max_padded, max_padded / std::size_t(world));
    return p;
  }
  [[nodiscard]] const memory_plan& planned() const { return require_final("planned()"), plan_; }

  // ---- queries --------------------------------------------------------------------
  [[nodiscard]] bool finalized() const noexcept { return finalized_; }
  [[nodiscard]] int rank() const { return comm_.rank(); }
  [[nodiscard]] int world() const { return comm_.size(); }
  [[nodiscard]] comm::handle<backend_type>& communicator() noexcept { return comm_; }
  [[nodiscard]] std::size_t num_units() const noexcept { return finalized_ ? layouts_.size() : specs_.size(); }
  [[nodiscard]] const unit_layout& layout(std::size_t u) const { return require_final("layout()"), layouts_.at(u); }
  [[nodiscard]] const std::vector<unit_layout>& layouts() const { return require_final("layouts()"), layouts_; }
  [[nodiscard]] const tensor_slot& slot(param_id p) const {
    require_final("slot()");
    check_param(p);
    return layouts_[std::size_t(p.unit)].tensors()[std::size_t(p.index)];
  }
  //! The parameter called name in unit u.
  [[nodiscard]] param_id find(unit_id u, std::string_view name) const {
    TESSERA_CHECK(u.index >= 0 && std::size_t(u.index) < specs_.size(), "find: unknown unit ", u.index);
    const auto& t = specs_[std::size_t(u.index)].tensors;
    for (std::size_t i = 0; i < t.size(); ++i)
      if (t[i].name == name) return {u.index, int(i)};
    fail("no parameter '" + std::string(name) + "' in unit '" + specs_[std::size_t(u.index)].name + "'");
  }
  [[nodiscard]] std::size_t num_params() const noexcept {
    std::size_t n = 0;
    for (auto& l : layouts_)
      for (auto& t : l.tensors()) n += t.numel;
    return n;
  }

  // ---- parameter values -----------------------------------------------------------
  //! Sets a parameter from its full value in host memory. Every rank passes the
  //! same values and keeps its own piece; no communication.
  void set_param(param_id p, std::span<const M> full) {
    const auto& s = slot(p);
    TESSERA_CHECK(full.size() == s.numel, "set_param('", s.spec.name, "'): ", full.size(),
                  " values for shape ", s.spec.shape.str(), " (", s.numel, " elements)");
    wait_weights_ready(std::size_t(p.unit));
    invalidate_gathered();
    auto& st = units_[std::size_t(p.unit)];
    const auto& L = layouts_[std::size_t(p.unit)];
    // Main weights over the optimizer range.
    const auto [lo, n] = opt_range(L);
    const auto local = intersect(s.offset, s.numel, lo, n);
    if (local.count) {
      std::vector<M> host(full.begin() + std::ptrdiff_t(local.tensor_begin),
                          full.begin() + std::ptrdiff_t(local.tensor_begin + local.count));
      if constexpr (main_aliases_compute)
        ops::copy_from_host(compute_span(st, L).subspan(weights_offset(L, lo) + local.range_begin, local.count),
                            std::span<const M>(host));
      else
        ops::copy_from_host(st.main.span().subspan(local.range_begin, local.count), std::span<const M>(host));
    }
    // Compute weights: the whole tensor where replicated, the piece where sharded.
    const std::size_t c_lo = strategy::shards_params ? L.shard_begin(rank()) : 0;
    const std::size_t c_n = strategy::shards_params ? L.shard_numel() : L.padded_numel();
    const auto c = intersect(s.offset, s.numel, c_lo, c_n);
    if (c.count) {
      std::vector<C> host(c.count);
      for (std::size_t i = 0; i < c.count; ++i) host[i] = convert<C>(full[c.tensor_begin + i]);
      ops::copy_from_host(st.weights.span().subspan(c.range_begin, c.count), std::span<const C>(host));
    }
  }

  //! The full main-weight value of a parameter, gathered to every rank's host memory. Collective.
  [[nodiscard]] std::vector<M> get_param(param_id p) {
    const auto& s = slot(p);
    std::vector<M> unit_values = gather_main(std::size_t(p.unit));
    return {unit_values.begin() + std::ptrdiff_t(s.offset),
            unit_values.begin() + std::ptrdiff_t(s.offset + s.numel)};
  }
  //! The whole padded unit of main weights on every rank's host. Collective.
  [[nodiscard]] std::vector<M> gather_main(std::size_t u) {
    require_final("gather_main()");
    auto& st = units_.at(u);
    const auto& L = layouts_[u];
    wait_weights_ready(u);
    std::vector<M> local(opt_range(L).second);
    ops::copy_to_host(std::span<M>(local), std::span<const M>(main_span(st, L)));
    if constexpr (!strategy::shards_optimizer) {
      return local;
    } else {
      std::vector<M> full(L.padded_numel());
      all_gather_host(std::span<const M>(local), std::span<M>(full));
      return full;
    }
  }

  //! All-reduce of a few host values over the wrapper's communicator, staged
  //! through backend memory when the communicator works on device buffers.
  template <class T>
  void all_reduce_host(std::span<T> v, comm::reduce_op op) {
    if constexpr (std::is_same_v<backend_type, backend::host>) {
      comm_.all_reduce(v.data(), v.data(), v.size(), dtype_of_v<T>, op);
    } else {
      buffer<T> d(v.size());
      ops::copy_from_host(d.span(), std::span<const T>(v));
      comm_.all_reduce(d.data(), d.data(), v.size(), dtype_of_v<T>, op);
      ops::copy_to_host(v, std::span<const T>(d.span()));
    }
  }
  //! All-gather of host values (every rank contributes local.size()), staged likewise.
  template <class T>
  void all_gather_host(std::span<const T> local, std::span<T> full) {
    if constexpr (std::is_same_v<backend_type, backend::host>) {
      comm_.all_gather(local.data(), full.data(), local.size(), dtype_of_v<T>);
    } else {
      buffer<T> d_local(local.size()), d_full(full.size());
      ops::copy_from_host(d_local.span(), local);
      comm_.all_gather(d_local.data(), d_full.data(), local.size(), dtype_of_v<T>);
      ops::copy_to_host(full, std::span<const T>(d_full.span()));
    }
  }

  // ---- the step: gather, gradients, reduction ------------------------------------
  class scope;

  //! Starts micro-batch `index` of `count`. no_shard and optim communicate only
  //! in the last one; sharded gradients are reduced every micro-batch.
  void begin_micro_batch(int index, int count) {
    require_final("begin_micro_batch()");
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
    if (index > 0) sync_micro_batch();
    mb_index_ = index;
    mb_count_ = count;
    mb_open_ = true;
    for (auto& st : units_) st.reduced = false;
  }

  //! Gradient view of one parameter (full tensor) for this micro-batch.
  [[nodiscard]] std::span<G> grad(param_id p) {
    const auto& s = slot(p);
    auto full = unit_grads(std::size_t(p.unit));
    return full.subspan(s.offset, s.numel);
  }
  //! Gradient view of a whole padded unit.
  [[nodiscard]] std::span<G> unit_grads(std::size_t u) {
    check_grad_access(u);
    auto& st = units_.at(u);
    const auto& L = layouts_[u];
    if (persistent_full_grads || solo_) {
      materialize_zeros(st);
      return st.grad_full.span();
    }
    if (st.grad_slot < 0) st.grad_slot = acquire_slot(u, /*zero grads=*/true);
    return slots_[std::size_t(st.grad_slot)].grad.span().first(L.padded_numel());
  }

  //! What unit_grads_for_write hands out.
  struct grad_target {
    std::span<G> grads;  //!< the whole padded unit
    bool fresh;          //!< true: holds no gradient yet; assign, do not accumulate
  };
  //! Gradient view of unit u for a writer that, when `fresh`, assigns every
  //! element of every parameter (a GEMM with beta = 0, say) and otherwise
  //! accumulates. A fresh buffer's contents are undefined except the padding,
  //! which is zero; this saves zeroing all gradients every step.
  [[nodiscard]] grad_target unit_grads_for_write(std::size_t u) {
    check_grad_access(u);
    auto& st = units_.at(u);
    const auto& L = layouts_[u];
    if (persistent_full_grads || solo_) return {st.grad_full.span(), std::exchange(st.zero_pending, false)};
    if (st.grad_slot >= 0) return {slots_[std::size_t(st.grad_slot)].grad.span().first(L.padded_numel()), false};
    st.grad_slot = acquire_slot(u, /*zero grads=*/false);
    auto g = slots_[std::size_t(st.grad_slot)].grad.span().first(L.padded_numel());
    zero_padding(g, L);  // the slot last held another unit
    return {g, true};
  }

  //! Starts the reduction of unit u's gradients (non-blocking). Each rank must
  //! call it for the same units in the same order.
  void reduce_grads(std::size_t u) {
    require_final("reduce_grads()");
    auto& st = units_.at(u);
    const auto& L = layouts_[u];
    TESSERA_CHECK(!grads_ready_, "reduce_grads('", L.name(), "') after finish_grad_sync");
    TESSERA_CHECK(!st.reduced, "reduce_grads('", L.name(), "') called twice in one micro-batch");
    st.reduced = true;
    if (persistent_full_grads || solo_) materialize_zeros(st);  // nobody wrote: zeros
    if (solo_) return;  // one rank, wire = grad type: the sum over ranks is the gradient itself
    const bool last = mb_index_ == mb_count_ - 1;
    if (!strategy::shards_grads && !last) return;  // accumulate locally, communicate once

    std::span<G> src;
    int s;
    if constexpr (persistent_full_grads) {
      src = st.grad_full.span();
      s = acquire_slot(u, false);
    } else {
      if (st.grad_slot < 0) st.grad_slot = acquire_slot(u, true);  // no gradient written: zeros
      s = st.grad_slot;
      src = slots_[std::size_t(s)].grad.span().first(L.padded_numel());
    }
    auto& sl = slots_[std::size_t(s)];
    const int N = world();
    const float pre = std::is_same_v<typename Cfg::averaging, pre_divide> ? 1.0f / float(N) : 1.0f;
    const auto op = std::is_same_v<typename Cfg::averaging, average_in_collective> ? comm::reduce_op::avg
                                                                                    : comm::reduce_op::sum;
    // The wire buffer: the gradients themselves when the dtypes agree.
    W* send;
    if constexpr (wire_is_grad) {
      if (pre != 1.0f) ops::for_each(src.size(), scale_convert<G, G>{src.data(), src.data(), pre});
      send = src.data();
    } else {
      ops::for_each(src.size(), scale_convert<W, G>{src.data(), sl.wire.data(), pre});
      send = sl.wire.data();
    }
    const std::size_t n = L.shard_numel();
    if constexpr (!strategy::shards_optimizer) {
      sl.req = comm_.iall_reduce(send, send, L.padded_numel(), dtype_of_v<W>, op);
      sl.target = slot_state::all_reduced;
    } else {
      // Straight into the gradient shard when the wire carries gradients. A
      // shard that already holds earlier micro-batches is folded into this
      // rank's piece of the send buffer first (times N where the reduction is
      // divided by N afterwards: avg in the collective, or post_divide), so the
      // collective delivers the running sum and no staging shard is needed.
      if constexpr (wire_is_grad) {
        if (!st.shard_fresh) {
          const bool divided = op == comm::reduce_op::avg || post_scale() != 1.0f;
          ops::for_each(n, accumulate_convert<G, G>{shard_of(u).data(), send + L.shard_begin(rank()),
                                                     divided ? float(N) : 1.0f, false});
        }
        sl.req = comm_.ireduce_scatter(send, shard_of(u).data(), n, dtype_of_v<W>, op);
        sl.target = slot_state::direct;
      } else {
        (void)shard_of(u);  // where it lands after conversion: fail now, before the collective, if missing
        sl.req = comm_.ireduce_scatter(send, sl.wire_shard.data(), n, dtype_of_v<W>, op);
        sl.target = slot_state::staged;
      }
    }
    sl.pending = true;
    sl.order = ++order_;
  }

  //! Completes every reduction of this micro-batch; at the last micro-batch the
  //! gradients over each rank's optimizer range are then final.
  void finish_grad_sync() {
    require_final("finish_grad_sync()");
    if (grads_ready_) return;
    TESSERA_CHECK(mb_index_ == mb_count_ - 1, "finish_grad_sync in micro-batch ", mb_index_, " of ", mb_count_,
                  "; it ends the last one");
    sync_micro_batch();
    grads_ready_ = true;
  }
  [[nodiscard]] bool grads_ready() const noexcept { return grads_ready_; }

  //! Zeroes every gradient and starts a new accumulation (micro-batch 0 of 1).
  void zero_grad() {
    require_final("zero_grad()");
    complete_all();
    for (auto& st : units_) {
      // grad_full is zeroed when next used; grad_shard is overwritten by its
      // first reduction (shard_fresh), so neither is filled here.
      st.zero_pending = persistent_full_grads || solo_;
      st.shard_fresh = true;
      st.reduced = false;
      st.grad_slot = -1;
    }
    for (auto& sl : slots_) sl.unit = -1;
    grads_ready_ = false;
    mb_open_ = false;
    mb_index_ = 0;
    mb_count_ = 1;
  }

  // ---- what the optimizer works on ------------------------------------------------
  //! [first element, count) of this rank's optimizer range in unit u's flat buffer.
  [[nodiscard]] std::pair<std::size_t, std::size_t> opt_range(const unit_layout& L) const {
    if constexpr (strategy::shards_optimizer) return {L.shard_begin(rank()), L.shard_numel()};
    else return {0, L.padded_numel()};
  }
  [[nodiscard]] std::pair<std::size_t, std::size_t> opt_range(std::size_t u) const { return opt_range(layouts_.at(u)); }
  [[nodiscard]] std::span<M> main_weights(std::size_t u) { return main_span(units_.at(u), layouts_.at(u)); }
  [[nodiscard]] std::span<G> opt_grads(std::size_t u) {
    auto& st = units_.at(u);
    if (persistent_full_grads || solo_) materialize_zeros(st);
    if (strategy::shards_optimizer && !solo_) return shard_of(u);
    return st.grad_full.span();
  }
  //! The part of opt_grads this rank counts in the global norm: the optimizer range
  //! where sharded; the rank's shard of the replicated gradient for no_shard, so
  //! that one all-reduce of the partial sums gives the norm on every world size.
  [[nodiscard]] std::span<G> norm_grads(std::size_t u) {
    const auto& L = layouts_.at(u);
    if (strategy::shards_optimizer || solo_) return opt_grads(u);
    return opt_grads(u).subspan(L.shard_begin(rank()), L.shard_numel());
  }

  //! Where the optimizer may write compute weights for unit u's optimizer range
  //! in the same pass as the update; null when they alias the main weights.
  [[nodiscard]] C* compute_out(std::size_t u) {
    if constexpr (main_aliases_compute) {
      return nullptr;
    } else {
      const auto& L = layouts_.at(u);
      return units_[u].weights.data() + weights_offset(L, opt_range(L).first);
    }
  }

  //! After the optimizer wrote main weights (and, if `converted`, the compute
  //! weights through compute_out): refresh the compute weights and, where they
  //! are replicated but the optimizer is sharded, start their all-gather.
  void publish_weights(bool converted = false) {
    invalidate_gathered();
    for (std::size_t u = 0; u < units_.size(); ++u) {
      auto& st = units_[u];
      const auto& L = layouts_[u];
      const auto [lo, n] = opt_range(L);
      C* dst = compute_span(st, L).data() + weights_offset(L, lo);
      if constexpr (!main_aliases_compute)
        if (!converted) ops::for_each(n, scale_convert<C, M>{st.main.data(), dst, 1.0});
      if constexpr (strategy::shards_optimizer && !strategy::shards_params)
        if (!solo_) st.weights_ready = comm_.iall_gather(dst, st.weights.data(), n, dtype_of_v<C>);
    }
  }

  //! Drops every cached gathered copy of a unit (optim_grads_params), so the
  //! next gather(unit) all-gathers again: for benchmarks and memory pressure.
  void release_gathered() { invalidate_gathered(); }

  //! Under wrapper_options::lend_grad_shards: unit u's reduced gradient shard
  //! lives in `memory` (at least layout(u).shard_numel() elements, 16-byte
  //! aligned) from now on. The wrapper writes it from u's reduce_grads until
  //! the optimizer step has read it; the caller may use it between a step and
  //! u's next reduce_grads (the unit's own activations, say). Between steps
  //! only; a no-op where nothing is sharded or one rank holds everything.
  void lend_grad_shard(std::size_t u, std::span<G> memory) {
    require_final("lend_grad_shard()");
    const auto& L = layouts_.at(u);
    TESSERA_CHECK(opt_.lend_grad_shards, "lend_grad_shard('", L.name(),
                  "') needs wrapper_options.lend_grad_shards (the wrapper owns its gradient shards otherwise)");
    TESSERA_CHECK(!mb_open_ && !grads_ready_, "lend_grad_shard('", L.name(),
                  "') during a step; lend between steps (after step() or zero_grad())");
    if (!lends_shards()) return;  // no shard: nothing sharded, or one rank holds everything
    TESSERA_CHECK(memory.size() >= L.shard_numel(), "lend_grad_shard('", L.name(), "'): ", memory.size(),
                  " elements lent, its gradient shard needs ", L.shard_numel());
    TESSERA_CHECK(reinterpret_cast<std::uintptr_t>(memory.data()) % 16 == 0, "lend_grad_shard('", L.name(),
                  "'): memory not 16-byte aligned");
    units_[u].grad_shard = memory.data();
    units_[u].shard_fresh = true;
  }
  //! Whether gradient shards live in memory lent by the caller.
  [[nodiscard]] bool lends_shards() const noexcept {
    return opt_.lend_grad_shards && strategy::shards_optimizer && !solo_;
  }

  //! Waits for every collective in flight.
  void synchronize() {
    complete_all();
    for (std::size_t u = 0; u < units_.size(); ++u) wait_weights_ready(u);
    for (auto& g : gathered_) g.ready.wait();
  }

  // ---- gathering --------------------------------------------------------------------
  //! Gathered (or replicated) compute weights of unit u while a scope holds it.
  [[nodiscard]] std::span<const C> unit_weights(std::size_t u) const {
    const auto& st = units_.at(u);
    const auto& L = layouts_[u];
    TESSERA_CHECK(st.holders > 0, "weights of unit '", L.name(), "' used while released; take them inside gather(unit)");
    if (strategy::shards_params && !solo_) return gathered_[std::size_t(st.gathered_slot)].data.span().first(L.padded_numel());
    return st.weights.span();  // replicated, or the one rank's shard is the whole unit
  }

  void acquire(std::size_t u) {
    require_final("gather()");
    auto& st = units_.at(u);
    if (!strategy::shards_params || solo_) {
      wait_weights_ready(u);
    } else {
      if (st.gathered_slot < 0) start_gather(u, /*for_prefetch=*/false);
      auto& g = gathered_[std::size_t(st.gathered_slot)];
      g.ready.wait();
      g.last_use = ++order_;
      const int dir = (last_gathered_ < 0 || int(u) > last_gathered_) ? 1 : -1;
      last_gathered_ = int(u);
      st.holders++;
      if (opt_.prefetch) {
        const long next = long(u) + dir;
        if (next >= 0 && std::size_t(next) < units_.size() && units_[std::size_t(next)].gathered_slot < 0)
          start_gather(std::size_t(next), true);
      }
      return;
    }
    st.holders++;
  }
  void release(std::size_t u) noexcept {
    auto& st = units_[u];
    if (st.holders > 0) st.holders--;
  }

private:
  struct unit_spec {
    std::string name;
    std::vector<tensor_spec> tensors;
  };
  struct unit_state {
    comm_buffer<C, backend_type> weights;  // full padded, or the shard under optim_grads_params (shared memory then)
    buffer<M> main;          // optimizer range; empty when aliasing the compute weights
    buffer<G> grad_full;     // persistent full gradients (no_shard, optim)
    buffer<G> own_shard;     // the reduced gradient shard's memory, unless lent
    G* grad_shard = nullptr; // reduced gradient shard (sharded optimizer): own_shard or lent memory
    comm::request weights_ready;  // post-step all-gather (optim, optim_grads)
    int gathered_slot = -1;  // gather pool slot (optim_grads_params)
    int grad_slot = -1;      // reduction slot holding this micro-batch's full gradients (sharded grads)
    int holders = 0;         // live scopes
    bool reduced = false;    // reduce_grads called in this micro-batch
    bool shard_fresh = true; // grad_shard holds nothing yet this step
    bool zero_pending = false;  // grad_full is logically zero (see materialize_zeros)
  };
  enum class slot_state { direct, staged, all_reduced };
  struct reduction_slot {
    buffer<G> grad;        // full gradients (sharded grads only)
    buffer<W> wire;        // full wire buffer (when W != G)
    buffer<W> wire_shard;  // reduced shard before conversion and accumulation (sharded optimizer, W != G)
    comm::request req;
    int unit = -1;
    bool pending = false;
    slot_state target = slot_state::direct;
    std::uint64_t order = 0;
  };
  struct gathered_slot {
    comm_buffer<C, backend_type> data;  // in shared memory with the shards: all-gathers between them may skip SMs
    comm::request ready;
    int unit = -1;
    std::uint64_t last_use = 0;
  };
  struct range_hit {
    std::size_t tensor_begin = 0, range_begin = 0, count = 0;
  };

  static std::size_t slot_bytes(std::size_t padded, std::size_t shard) {
    std::size_t b = 0;
    if (strategy::shards_grads) b += padded * sizeof(G);
    if (!wire_is_grad) b += padded * sizeof(W);
    if (strategy::shards_optimizer && !wire_is_grad) b += shard * sizeof(W);  // staging for the conversion back
    return b;
  }
  // Unit u's reduced gradient shard; a clear error where it was to be lent and was not.
  std::span<G> shard_of(std::size_t u) {
    auto& st = units_[u];
    TESSERA_CHECK(st.grad_shard != nullptr, "unit '", layouts_[u].name(),
                  "' has no gradient shard: wrapper_options.lend_grad_shards is set and lend_grad_shard was not "
                  "called for it");
    return {st.grad_shard, layouts_[u].shard_numel()};
  }
  // What a reduced sum is multiplied by after the collective (post_divide: 1/N).
  float post_scale() const {
    return std::is_same_v<typename Cfg::averaging, post_divide> ? 1.0f / float(world()) : 1.0f;
  }
  static range_hit intersect(std::size_t off, std::size_t numel, std::size_t lo, std::size_t n) {
    const std::size_t a = std::max(off, lo), b = std::min(off + numel, lo + n);
    if (a >= b) return {};
    return {a - off, a - lo, b - a};
  }
  [[noreturn]] static void fail(const std::string& m) { detail::fail(m); }
  void check_grad_access(std::size_t u) const {
    require_final("grad()");
    const auto& st = units_.at(u);
    const auto& L = layouts_[u];
    TESSERA_CHECK(!grads_ready_, "gradient of unit '", L.name(),
                  "' requested after finish_grad_sync; call step() or zero_grad() first");
    TESSERA_CHECK(!st.reduced, "gradient of unit '", L.name(), "' requested after reduce_grads in the same micro-batch");
    if constexpr (strategy::shards_params)
      TESSERA_CHECK(st.holders > 0, "gradient view of unit '", L.name(),
                    "' requested while the unit is released; take it inside gather(unit)");
  }
  // Persistent gradients are zeroed lazily: zero_grad() only marks them, and
  // a writer that assigns every element (unit_grads_for_write) never pays.
  void materialize_zeros(unit_state& st) {
    if (std::exchange(st.zero_pending, false)) ops::fill(st.grad_full.span(), G{});
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
  // One rank and gradients already in the wire type: nothing to communicate,
  // so the shard is the whole unit and gather / reduce become views.
  static bool solo(int world) { return world == 1 && wire_is_grad; }
  void check_open(const std::string& what) const {
    TESSERA_CHECK(!finalized_, what, " after finalize(): register every unit and parameter before finalize()");
  }
  void require_final(const char* what) const {
    TESSERA_CHECK(finalized_, what, " before finalize()");
  }
  void check_param(param_id p) const {
    TESSERA_CHECK(p.unit >= 0 && std::size_t(p.unit) < layouts_.size() && p.index >= 0 &&
                      std::size_t(p.index) < layouts_[std::size_t(p.unit)].tensors().size(),
                  "unknown parameter (unit ", p.unit, ", index ", p.index, ")");
  }

  // Every rank must have registered the same units, tensors and shapes: compare
  // a digest with one all-reduce of (h, ~h) under max. If any rank differs, every
  // rank sees max(h) != h or max(~h) != ~h and throws; nobody is left waiting.
  void verify_agreement() {
    const std::uint64_t h = digest(layouts_);
    std::int64_t v[2] = {std::int64_t(h >> 1), std::int64_t((~h) >> 1)};
    const std::int64_t mine[2] = {v[0], v[1]};
    all_reduce_host(std::span<std::int64_t>(v, 2), comm::reduce_op::max);
    TESSERA_CHECK(v[0] == mine[0] && v[1] == mine[1], "ranks disagree on the model: rank ", rank(),
                  " registered a different set of units, parameter names or shapes than another rank (",
                  layouts_.size(), " units, ", num_params(), " elements here)");
  }

  void allocate() {
    std::size_t max_padded = 0, max_shard = 0;
    for (auto& L : layouts_) {
      max_padded = std::max(max_padded, L.padded_numel());
      max_shard = std::max(max_shard, L.shard_numel());
      unit_state st;
      st.weights = strategy::shards_params ? comm_buffer<C, backend_type>(comm_, L.shard_numel(), !solo_)
                                           : comm_buffer<C, backend_type>(comm_, L.padded_numel(), false);
      ops::fill(st.weights.span(), C{});
      if constexpr (!main_aliases_compute) {
        st.main = buffer<M>(opt_range(L).second);
        ops::fill(st.main.span(), M{});
      }
      if (persistent_full_grads || solo_) {
        st.grad_full = buffer<G>(L.padded_numel());
        ops::fill(st.grad_full.span(), G{});  // the padding stays zero from here on
      }
      if (strategy::shards_optimizer && !solo_ && !opt_.lend_grad_shards) {
        st.own_shard = buffer<G>(L.shard_numel());
        ops::fill(st.own_shard.span(), G{});
        st.grad_shard = st.own_shard.data();
      }
      units_.push_back(std::move(st));
    }
    if (solo_) return;
    for (int i = 0; i < opt_.grad_buffers; ++i) {
      reduction_slot s;
      if constexpr (strategy::shards_grads) s.grad = buffer<G>(max_padded);
      if constexpr (!wire_is_grad) s.wire = buffer<W>(max_padded);
      if constexpr (strategy::shards_optimizer && !wire_is_grad) s.wire_shard = buffer<W>(max_shard);
      slots_.push_back(std::move(s));
    }
    if constexpr (strategy::shards_params)
      for (int i = 0; i < opt_.gather_buffers; ++i)
        gathered_.push_back({comm_buffer<C, backend_type>(comm_, max_padded, true), {}, -1, 0});
  }

  std::span<C> compute_span(unit_state& st, const unit_layout&) { return st.weights.span(); }
  // Offset of flat element `lo` inside the compute-weight buffer (0 when it is the shard).
  static std::size_t weights_offset(const unit_layout&, std::size_t lo) {
    return strategy::shards_params ? 0 : lo;
  }
  std::span<M> main_span(unit_state& st, const unit_layout& L) {
    if constexpr (main_aliases_compute) {
      const auto [lo, n] = opt_range(L);
      return st.weights.span().subspan(weights_offset(L, lo), n);
    } else {
      return st.main.span();
    }
  }

  void wait_weights_ready(std::size_t u) { units_.at(u).weights_ready.wait(); }

  // Gathered copies stay valid until the weights change; drop them then.
  void invalidate_gathered() {
    last_gathered_ = -1;
    for (auto& g : gathered_) {
      g.ready.wait();
      if (g.unit >= 0) units_[std::size_t(g.unit)].gathered_slot = -1;
      g.unit = -1;
    }
  }

  void start_gather(std::size_t u, bool for_prefetch) {
    // A free slot first, then the least recently used one no scope holds.
    int best = -1;
    for (std::size_t i = 0; i < gathered_.size(); ++i) {
      const auto& g = gathered_[i];
      if (g.unit < 0) { best = int(i); break; }
      if (units_[std::size_t(g.unit)].holders == 0 &&
          (best < 0 || g.last_use < gathered_[std::size_t(best)].last_use))
        best = int(i);
    }
    if (best < 0) {
      if (for_prefetch) return;  // every buffer in use: skip the prefetch
      fail("gather('" + layouts_[u].name() + "'): all " + std::to_string(gathered_.size()) +
           " gather buffers are held by live scopes; release one or raise wrapper_options.gather_buffers");
    }
    auto& g = gathered_[std::size_t(best)];
    g.ready.wait();
    if (g.unit >= 0) units_[std::size_t(g.unit)].gathered_slot = -1;
    g.unit = int(u);
    g.last_use = ++order_;
    units_[u].gathered_slot = best;
    const auto& L = layouts_[u];
    g.ready = comm_.iall_gather(units_[u].weights.data(), g.data.data(), L.shard_numel(), dtype_of_v<C>);
  }

  // A reduction slot for unit u: a free one, else the oldest reduction in flight is completed.
  int acquire_slot(std::size_t u, bool zero_grads) {
    int best = -1;
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].unit < 0) { best = int(i); break; }
    if (best < 0) {
      for (std::size_t i = 0; i < slots_.size(); ++i)
        if (slots_[i].pending && (best < 0 || slots_[i].order < slots_[std::size_t(best)].order)) best = int(i);
      if (best < 0)
        fail("unit '" + layouts_[u].name() + "': all " + std::to_string(slots_.size()) +
             " gradient buffers hold gradients not yet reduced; call reduce_grads sooner or raise "
             "wrapper_options.grad_buffers");
      complete(std::size_t(best));
    }
    auto& sl = slots_[std::size_t(best)];
    sl.unit = int(u);
    if constexpr (strategy::shards_grads)
      if (zero_grads) ops::fill(sl.grad.span().first(layouts_[u].padded_numel()), G{});
    return best;
  }

  // Finishes the reduction held by slot i: waits, converts from the wire,
  // post-divides, accumulates into the gradient shard, frees the slot.
  void complete(std::size_t i) {
    auto& sl = slots_[i];
    if (!sl.pending) {
      if (sl.unit >= 0 && units_[std::size_t(sl.unit)].grad_slot == int(i)) return;  // still being written
      sl.unit = -1;
      return;
    }
    sl.req.wait();
    sl.pending = false;
    const std::size_t u = std::size_t(sl.unit);
    auto& st = units_[u];
    const auto& L = layouts_[u];
    const float post = post_scale();
    switch (sl.target) {
      case slot_state::all_reduced:
        if constexpr (!wire_is_grad)
          ops::for_each(L.padded_numel(), scale_convert<G, W>{sl.wire.data(), st.grad_full.data(), post});
        else if (post != 1.0f)
          ops::for_each(L.padded_numel(), scale_convert<G, G>{st.grad_full.data(), st.grad_full.data(), post});
        break;
      case slot_state::direct:
        if (post != 1.0f)
          ops::for_each(L.shard_numel(), scale_convert<G, G>{st.grad_shard, st.grad_shard, post});
        break;
      case slot_state::staged:
        ops::for_each(L.shard_numel(),
                      accumulate_convert<G, W>{sl.wire_shard.data(), st.grad_shard, post, st.shard_fresh});
        break;
    }
    st.shard_fresh = false;
    if (st.grad_slot == int(i)) st.grad_slot = -1;
    sl.unit = -1;
  }
  void complete_all() {
    // In issue order, so every rank waits on the same sequence.
    for (;;) {
      int best = -1;
      for (std::size_t i = 0; i < slots_.size(); ++i)
        if (slots_[i].pending && (best < 0 || slots_[i].order < slots_[std::size_t(best)].order)) best = int(i);
      if (best < 0) break;
      complete(std::size_t(best));
    }
  }
  // Units the trainer did not reduce are reduced now, last unit first (the
  // order backward would have used), then everything in flight completes.
  void sync_micro_batch() {
    for (std::size_t u = units_.size(); u-- > 0;)
      if (!units_[u].reduced) reduce_grads(u);
    complete_all();
  }
  void drain_noexcept() noexcept {
    try {
      if (finalized_) synchronize();
    } catch (...) {
      // A destructor cannot report; requests already terminated on real failures.
    }
  }

  comm::handle<backend_type> comm_;
  wrapper_options opt_;
  std::vector<unit_spec> specs_;
  std::vector<unit_layout> layouts_;
  std::vector<unit_state> units_;
  std::vector<reduction_slot> slots_;
  std::vector<gathered_slot> gathered_;
  memory_plan plan_;
  bool finalized_ = false, grads_ready_ = false, mb_open_ = false, solo_ = false;
  int mb_index_ = 0, mb_count_ = 1, last_gathered_ = -1;
  std::uint64_t order_ = 0;
};

}  // namespace tessera::detail
