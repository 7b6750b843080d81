#pragma once
//! \file unit_store: each unit's persistent buffers on this rank (compute
//! weights, main weights, gradients or their shard) and everything that reads
//! or writes them outside the micro-batch protocol: initial values, the
//! optimizer's ranges, the weight publication after a step, lent shards.
//! storage.hpp says which buffers a config has.
#include <algorithm>
#include <cstdint>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "tessera/backend/convert.hpp"
#include "tessera/backend/memory.hpp"
#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/comm/staged.hpp"
#include "tessera/comm/trace.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/wrapper/detail/comm_buffer.hpp"
#include "tessera/wrapper/detail/registry.hpp"
#include "tessera/wrapper/detail/storage.hpp"

namespace tessera::detail {

template <config_type Cfg>
class unit_store {
  using rules = storage<Cfg>;
  using strategy = typename Cfg::strategy;
  using B = typename Cfg::backend_type;
  using ops = backend_ops<B>;
  template <class T> using buffer = typename ops::template buffer<T>;
  using C = typename rules::C;
  using M = typename rules::M;
  using G = typename rules::G;

public:
  struct unit {
    comm_buffer<C, B> weights;    // full padded, or the shard under optim_grads_params (shared memory then)
    buffer<M> main;               // optimizer range; empty when aliasing the compute weights
    buffer<G> grad_full;          // persistent full gradients (no_shard, optim; or one rank alone)
    buffer<G> own_shard;          // the reduced gradient shard's memory, unless lent
    G* grad_shard = nullptr;      // reduced gradient shard (sharded optimizer): own_shard or lent memory
    buffer<G> part_grads;         // outer<optim>: this replica's part of the shard, reduced across replicas
    comm::request weights_ready;  // post-step all-gather (optim, optim_grads; across replicas under outer<optim>)
    bool shard_fresh = true;      // grad_shard holds nothing yet this step
    bool zero_pending = false;    // grad_full is logically zero (see full_grads)
  };

  //! Allocates every unit's buffers (after the registry is finalized); `solo`:
  //! one rank holds everything; `outer`: the replica group of a mesh (empty on
  //! a flat world), whose rank is this rank's part of a split shard.
  //! `offload`: wrapper_options::offload_optimizer.
  void allocate(const unit_registry& reg, comm::handle<B> c, bool solo, bool lend_shards, double offload,
                comm::handle<B> outer = {}) {
    reg_ = &reg;
    comm_ = c;
    outer_ = outer;
    part_ = Cfg::outer_type::splits_optimizer && outer ? outer.rank() : 0;
    solo_ = solo;
    offloaded_ = offloaded_units(reg.layouts(), offload);
    for (std::size_t i = 0; i < reg.layouts().size(); ++i) {
      const unit_layout& L = reg.layouts()[i];
      unit st;
      st.weights = strategy::shards_params ? comm_buffer<C, B>(c, L.shard_numel(), !solo)
                                           : comm_buffer<C, B>(c, L.padded_numel(), false);
      ops::fill(st.weights.span(), C{});
      if constexpr (!rules::main_aliases_compute) {
        st.main = buffer<M>(rules::opt_range(L, c.rank(), part_).second, offloaded_[i] ? placement::host : placement::device);
        ops::fill(st.main.span(), M{});
      }
      if (has_full_grads()) {
        st.grad_full = buffer<G>(L.padded_numel());
        ops::fill(st.grad_full.span(), G{});  // the padding stays zero from here on
        // Nothing accumulated yet: the first step is fresh like every later one
        // (a writer through grads_for_write assigns; another reader gets zeros).
        st.zero_pending = true;
      }
      if (has_shards() && !lend_shards) {
        st.own_shard = buffer<G>(L.shard_numel());
        ops::fill(st.own_shard.span(), G{});
        st.grad_shard = st.own_shard.data();
      }
      if (L.splits() > 1) {
        st.part_grads = buffer<G>(rules::opt_range(L, c.rank(), part_).second);
        ops::fill(st.part_grads.span(), G{});
      }
      units_.push_back(std::move(st));
    }
  }
  [[nodiscard]] std::size_t size() const noexcept { return units_.size(); }
  //! Whether unit u's main weights (and its optimizer state) live in host memory.
  [[nodiscard]] bool offloaded(std::size_t u) const { return offloaded_.at(u); }
  [[nodiscard]] unit& operator[](std::size_t u) { return units_.at(u); }
  [[nodiscard]] const unit& operator[](std::size_t u) const { return units_.at(u); }
  //! Gradients live in a persistent full buffer (else in reduction slots).
  [[nodiscard]] bool has_full_grads() const noexcept { return rules::persistent_full_grads || solo_; }
  //! Reduced gradients land in a shard per unit (the optimizer is sharded over several ranks).
  [[nodiscard]] bool has_shards() const noexcept { return strategy::shards_optimizer && !solo_; }

  // ---- what the optimizer works on ------------------------------------------------
  [[nodiscard]] std::pair<std::size_t, std::size_t> opt_range(std::size_t u) const {
    return rules::opt_range(reg_->layout(u), comm_.rank(), part_);
  }
  //! This rank's part of a split shard: its replica rank under outer<optim>, else 0.
  [[nodiscard]] int part() const noexcept { return part_; }
  [[nodiscard]] std::span<M> main_weights(std::size_t u) {
    if constexpr (rules::main_aliases_compute) {
      return units_.at(u).weights.span().subspan(in_weights(u), opt_range(u).second);
    } else {
      return units_.at(u).main.span();
    }
  }
  //! Where the optimizer may write compute weights for unit u's optimizer range
  //! in the same pass as the update; null when they alias the main weights.
  [[nodiscard]] C* compute_out(std::size_t u) {
    if constexpr (rules::main_aliases_compute) return nullptr;
    else return units_.at(u).weights.data() + in_weights(u);
  }
  //! The persistent full gradients of unit u, zeroed first if a zero_grad is pending.
  std::span<G> full_grads(std::size_t u) {
    auto& st = units_.at(u);
    if (std::exchange(st.zero_pending, false)) ops::fill(st.grad_full.span(), G{});
    return st.grad_full.span();
  }
  //! Unit u's reduced gradient shard; a clear error where it was to be lent and was not.
  std::span<G> shard(std::size_t u) {
    TESSERA_CHECK(units_.at(u).grad_shard != nullptr, "unit '", reg_->layout(u).name(),
                  "' has no gradient shard: wrapper_options.lend_grad_shards is set and lend_grad_shard was not "
                  "called for it");
    return {units_[u].grad_shard, reg_->layout(u).shard_numel()};
  }
  //! The gradients reduced within the shard group: the shard where the
  //! optimizer is sharded over several ranks, else the full gradients.
  [[nodiscard]] std::span<G> group_grads(std::size_t u) { return has_shards() ? shard(u) : full_grads(u); }
  //! The gradients the optimizer reads over its range: group_grads, or under
  //! outer<optim> this replica's part of them, reduced across the replicas.
  [[nodiscard]] std::span<G> opt_grads(std::size_t u) {
    return reg_->layout(u).splits() > 1 ? units_.at(u).part_grads.span() : group_grads(u);
  }
  //! Lent memory for unit u's gradient shard (checked by the caller).
  void lend(std::size_t u, G* memory) {
    units_.at(u).grad_shard = memory;
    units_[u].shard_fresh = true;
  }
  //! A new accumulation: full gradients zeroed when next used; shards overwritten by their first reduction.
  void start_accumulation() {
    for (auto& st : units_) {
      st.zero_pending = has_full_grads();
      st.shard_fresh = true;
    }
  }

  // ---- values -----------------------------------------------------------------------
  //! Sets tensor t of unit u from its full value in host memory; every rank keeps its piece.
  void set_param(std::size_t u, std::size_t t, std::span<const M> full) {
    const auto& L = reg_->layout(u);
    const auto& s = L.tensors().at(t);
    if (const piece p = rules::range_piece(L, t, comm_.rank(), part_); !p.empty())
      ops::copy_from_host(main_weights(u).subspan(p.shard_begin, p.count), full.subspan(p.tensor_begin, p.count));
    // Compute weights: the rank's piece where sharded, the whole tensor where
    // replicated (where they alias the main weights, this covers what the
    // optimizer range did not).
    const piece c = strategy::shards_params ? L.piece_of(t, comm_.rank()) : piece{0, s.offset, s.numel};
    if (c.empty()) return;
    std::vector<C> host(c.count);
    for (std::size_t i = 0; i < c.count; ++i) host[i] = convert<C>(full[c.tensor_begin + i]);
    ops::copy_from_host(units_[u].weights.span().subspan(c.shard_begin, c.count), std::span<const C>(host));
  }
  //! Sets tensor t of unit u from value(i), a pure function of the tensor's
  //! element index: each rank computes only the elements it keeps (its main
  //! piece, and its compute piece where that differs), so the full tensor is
  //! never built and the values do not depend on the world size.
  template <class F>
  void init_param(std::size_t u, std::size_t t, const F& value) {
    const auto& L = reg_->layout(u);
    const auto& s = L.tensors().at(t);
    // On the device where the initializer runs there and the buffer is device memory (main weights
    // offloaded to the host are drawn on the host).
    constexpr bool device = std::is_same_v<B, backend::cuda> && F::on_device;
    // Elements [first, first + n) of the tensor into dst (T: M or C), where `on_device` says.
    auto draw = [&]<class T>(std::span<T> dst, std::size_t first, bool on_device) {
      if constexpr (device) {
        if (on_device) return ops::for_each(dst.size(), detail::drawn_into<T, M, F>{dst.data(), value, first});
      }
      std::vector<T> host(dst.size());
      fill_parallel(host.size(), [&](std::size_t i) { host[i] = convert<T>(M(value(first + i))); });
      ops::copy_from_host(dst, std::span<const T>(host));
    };
    if (const piece p = rules::range_piece(L, t, comm_.rank(), part_); !p.empty())
      draw(main_weights(u).subspan(p.shard_begin, p.count), p.tensor_begin,
           rules::main_aliases_compute || !offloaded_[u]);
    const piece c = strategy::shards_params ? L.piece_of(t, comm_.rank()) : piece{0, s.offset, s.numel};
    if (!c.empty()) draw(units_[u].weights.span().subspan(c.shard_begin, c.count), c.tensor_begin, true);
    if constexpr (device) ops::synchronize();  // what follows may read these buffers from the host (staged paths)
  }
  //! The whole padded unit of main weights on every rank's host, in shard
  //! order (rank 0's shard, rank 1's, ...; the compute layout under a flat
  //! layout or no_shard). Collective.
  [[nodiscard]] std::vector<M> gather_main(std::size_t u) {
    units_.at(u).weights_ready.wait();
    std::vector<M> local(opt_range(u).second);
    ops::copy_to_host(std::span<M>(local), std::span<const M>(main_weights(u)));
    if constexpr (!strategy::shards_optimizer) {
      return local;
    } else {
      const auto& L = reg_->layout(u);
      comm::label lbl("gather_main", L.name().c_str());
      if (L.splits() > 1) {  // the parts of the shard, across the replicas, first
        std::vector<M> shard(L.shard_numel());
        comm::all_gather_host(outer_, std::span<const M>(local), std::span<M>(shard));
        local = std::move(shard);
      }
      std::vector<M> full(L.padded_numel());
      comm::all_gather_host(comm_, std::span<const M>(local), std::span<M>(full));
      return full;
    }
  }
  //! After the optimizer wrote main weights (and, if `converted`, the compute
  //! weights through compute_out): refresh the compute weights and, where they
  //! are replicated but the optimizer is sharded, start their all-gather.
  void publish(bool converted) {
    for (std::size_t u = 0; u < units_.size(); ++u) {
      auto& st = units_[u];
      const auto& L = reg_->layout(u);
      const std::size_t n = opt_range(u).second;
      C* dst = st.weights.data() + in_weights(u);
      if constexpr (!rules::main_aliases_compute)
        if (!converted) ops::for_each(n, scale_convert<C, M>{st.main.data(), dst, 1.0});
      C* shard = st.weights.data() + (strategy::shards_params ? 0 : L.shard_begin(comm_.rank()));
      if (splits(L)) {  // outer<optim>: the replicas' parts into the whole shard
        comm::label lbl("publish", L.name().c_str());
        st.weights_ready = outer_.iall_gather(dst, shard, n, dtype_of_v<C>);
        if constexpr (strategy::shards_params) continue;
        st.weights_ready.wait();  // the shard is complete before the group gathers it
      }
      if (gathers_replicas()) {
        comm::label lbl("publish", L.name().c_str());
        st.weights_ready = comm_.iall_gather(shard, st.weights.data(), L.shard_numel(), dtype_of_v<C>);
      }
    }
  }
  //! Whether publish communicates nothing (so the optimizer writes the
  //! compute weights where the next gather or forward reads them, and its
  //! updates may wait for that use): the two collectives above never run.
  [[nodiscard]] bool publication_is_local() const noexcept {
    return !gathers_replicas() && std::none_of(reg_->layouts().begin(), reg_->layouts().end(), splits);
  }
  void wait_weights() {
    for (auto& st : units_) st.weights_ready.wait();
  }

private:
  // f(i) for i in [0, n) on up to 16 threads: each element depends on its
  // index alone, so threads change the time, not the values (a 1.5B-parameter
  // tensor set on one core takes tens of seconds).
  template <class F>
  static void fill_parallel(std::size_t n, const F& f) {
    const std::size_t threads =
        std::min<std::size_t>({16, std::max(1u, std::thread::hardware_concurrency()), n >> 18});
    if (threads <= 1) {
      for (std::size_t i = 0; i < n; ++i) f(i);
      return;
    }
    std::vector<std::jthread> pool;
    for (std::size_t k = 0; k < threads; ++k)
      pool.emplace_back([&f, lo = n * k / threads, hi = n * (k + 1) / threads] {
        for (std::size_t i = lo; i < hi; ++i) f(i);
      });
  }
  // publish's collectives: the parts of a split shard across the replicas
  // (outer<optim>), and replicated weights from a sharded optimizer.
  static bool splits(const unit_layout& L) noexcept { return L.splits() > 1; }
  bool gathers_replicas() const noexcept { return strategy::shards_optimizer && !strategy::shards_params && !solo_; }
  std::size_t in_weights(std::size_t u) const { return rules::range_in_weights(reg_->layout(u), comm_.rank(), part_); }

  const unit_registry* reg_ = nullptr;
  comm::handle<B> comm_, outer_;
  int part_ = 0;
  std::vector<unit> units_;
  std::vector<bool> offloaded_;
  bool solo_ = false;
};

}  // namespace tessera::detail
