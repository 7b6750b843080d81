#pragma once
//! \file engine_collectives: the state of dp_engine (engine.hpp) and the
//! collectives it issues: gradient reductions (plain and exact) through the
//! reduction slots, their hand-off to the replicas on a mesh, and gathers.
//! dp_engine adds the micro-batch protocol on top; nothing here checks the
//! order of calls, it trusts the protocol to have done so.
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

#include "tessera/backend/convert.hpp"
#include "tessera/backend/memory.hpp"
#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/comm/trace.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/policy/config.hpp"
#include "tessera/shard/layout.hpp"
#include "tessera/shard/row_copy.hpp"
#include "tessera/wrapper/detail/exact_sum.hpp"
#include "tessera/wrapper/detail/gather_pool.hpp"
#include "tessera/wrapper/detail/late_writes.hpp"
#include "tessera/wrapper/detail/outer_link.hpp"
#include "tessera/wrapper/detail/reduction_pool.hpp"
#include "tessera/wrapper/detail/registry.hpp"
#include "tessera/wrapper/detail/storage.hpp"
#include "tessera/wrapper/detail/unit_store.hpp"
#include "tessera/wrapper/options.hpp"

namespace tessera::detail {

template <config_type Cfg>
class engine_collectives {
public:
  using strategy = typename Cfg::strategy;
  using backend_type = typename Cfg::backend_type;
  static_assert(backend_available<backend_type>,
                "tessera: this translation unit does not see the config's backend; include "
                "tessera/backend/cuda/ops.cuh (compile with nvcc) for backend::cuda");

protected:
  using rules = storage<Cfg>;
  using ops = backend_ops<backend_type>;
  using C = typename rules::C;
  using M = typename rules::M;
  using G = typename rules::G;
  using W = typename rules::W;
  using pool_type = reduction_pool<G, W, backend_type>;
  using landing = typename pool_type::landing;
  static constexpr bool exact = Cfg::reduction::exact;

  template <class Comm>
  engine_collectives(Comm& comm, wrapper_options opt) : comm_(comm), opt_(opt) {
    check_options();
  }
  template <class Comm>
  engine_collectives(Comm& shard, Comm& replica, wrapper_options opt) : comm_(shard), outer_(replica), opt_(opt) {
    check_options();
  }
  engine_collectives(const engine_collectives&) = delete;
  engine_collectives& operator=(const engine_collectives&) = delete;
  ~engine_collectives() = default;

public:
  [[nodiscard]] int rank() const { return comm_.rank(); }
  [[nodiscard]] int world() const { return comm_.size(); }
  //! Replica groups of the mesh (1 on a flat world) and this rank's among them.
  [[nodiscard]] int replicas() const { return outer_.size(); }
  [[nodiscard]] int replica_rank() const { return outer_.rank(); }
  [[nodiscard]] const unit_layout& layout(std::size_t u) const { return reg_.layout(u); }

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

protected:
  void check_options() {
    const wrapper_options& opt = opt_;
    if (const char* e = std::getenv("TESSERA_POISON"); e && std::string_view(e) == "1") opt_.poison_released = true;
    TESSERA_CHECK(opt.alignment >= 1, "wrapper_options.alignment must be at least 1");
    TESSERA_CHECK(opt.gather_buffers >= 1, "wrapper_options.gather_buffers must be at least 1");
    TESSERA_CHECK(opt.grad_buffers >= 1, "wrapper_options.grad_buffers must be at least 1");
    TESSERA_CHECK(opt.offload_optimizer >= 0 && opt.offload_optimizer <= 1,
                  "wrapper_options.offload_optimizer is a fraction from 0 to 1, got ", opt.offload_optimizer);
  }
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
    const std::string name = reduce_label(L);
    comm::label lbl("reduce_grads", name.c_str());
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

  // A reduction's label: its unit, and with several micro-batches which one
  // of how many ("mb 2/4 layer.3"), so that the order check refuses ranks
  // that accumulate different counts (under no_shard and optim only the last
  // micro-batch reduces, and their collectives would match one for one).
  std::string reduce_label(const unit_layout& L) const {
    return mb_count_ == 1 ? L.name()
                          : "mb " + std::to_string(mb_index_ + 1) + "/" + std::to_string(mb_count_) + " " + L.name();
  }

  // exact_reduction (exact_sum.hpp): this micro-batch's gradients of unit u
  // onto the unit's grid. Where gradients accumulate locally (no_shard,
  // optim, one rank) they join the unit's accumulator, whose limbs the last
  // micro-batch all-reduces (no_shard) or reduce-scatters (optim); sharded
  // gradients are reduce-scattered as limbs every micro-batch and land in
  // the accumulated shard. finish_grad_sync turns the limbs into gradients.
  void reduce_exact(std::size_t u) {
    const auto& L = layout(u);
    const std::string name = reduce_label(L);
    comm::label lbl("reduce_grads", name.c_str());
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
  // What poison_released says of unit u's gradients written after its reduce_grads, `when` (", while its
  // reduction was in flight", or before the step).
  std::string written_late(std::size_t u, const char* when) const {
    const std::string& n = layout(u).name();
    return "gradients of unit '" + n + "' were written after reduce_grads('" + n + "')" + when +
           "; gradient views are valid until reduce_grads of their unit (found by wrapper_options::poison_released)";
  }
  // poison_released where the gradients stay in full: unit u's are final once
  // reduce_grads of the last micro-batch has issued (or skipped) its
  // reduction, or, under no_shard's all-reduce, once it lands in them.
  void note_final(std::size_t u) {
    if (!opt_.poison_released || !store_.has_full_grads() || mb_index_ != mb_count_ - 1 || outer_.active()) return;
    if (!strategy::shards_optimizer && !solo_ && !exact) late_.awaits_landing(u);
    else late_.sent(u, std::span<const G>(store_[u].grad_full.span()));
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
          misuse = written_late(std::size_t(slots_[s].unit), ", while its reduction was in flight");
      }
    const std::size_t u = std::size_t(slots_.complete(s));
    if constexpr (!strategy::shards_grads)
      if (opt_.poison_released && !late_.landed(u, std::span<const G>(store_[u].grad_full.span())))
        misuse = written_late(u, ", while its reduction was in flight");
    store_[u].shard_fresh = false;
    if (units_[u].grad_slot == s) units_[u].grad_slot = -1;
    if (mb_index_ == mb_count_ - 1) issue_outer(u);  // the group's sum is final: on to the replicas
    if (!misuse.empty()) fail(misuse);  // after the bookkeeping: the wrapper stays usable
  }
  void complete_all() {
    for (int s; (s = slots_.oldest_pending()) >= 0;) complete(s);  // in issue order, as on every rank
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
  // Zeroes the padding between and after a unit's tensors in a buffer laid out like L.
  static void zero_padding(std::span<G> g, const unit_layout& L) {
    std::size_t end = 0;
    for (const auto& t : L.tensors()) {
      if (t.offset > end) ops::fill(g.subspan(end, t.offset - end), G{});
      end = t.offset + t.numel;
    }
    if (L.padded_numel() > end) ops::fill(g.subspan(end, L.padded_numel() - end), G{});
  }

  comm::handle<backend_type> comm_;
  outer_link<Cfg> outer_;  // the replica group on a mesh of R > 1 groups; inactive otherwise
  wrapper_options opt_;
  unit_registry reg_;
  unit_store<Cfg> store_;
  std::vector<unit_state> units_;
  std::vector<std::function<void()>> deferred_;  // per unit: waits for its deferred work (defer)
  pool_type slots_;
  late_writes<G, backend_type> late_;  // poison_released where gradients stay in full (late_writes.hpp)
  row_copies<backend_type> rows_;  // the rows layout's copies (fsdp2)
  gather_pool<C, backend_type> gathers_;
  exact_sums<G, backend_type> exact_;  // exact_reduction only
  memory_plan plan_;
  bool grads_ready_ = false, mb_open_ = false, solo_ = false;
  bool touched_ = false;  // a micro-batch began or a gradient was written or reduced since zero_grad
  std::uint64_t set_digest_ = 0;  // engine::set_param_digest
  int mb_index_ = 0, mb_count_ = 1, last_gathered_ = -1;
};

}  // namespace tessera::detail
