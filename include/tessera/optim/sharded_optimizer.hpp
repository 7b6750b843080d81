#pragma once
//! \file ShardedOptimizer<Algorithm, Wrapper>: optimizer state over each rank's
//! optimizer range only; one pass per step, then the strategy's weight all-gather.
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "tessera/backend/host/pool.hpp"
#include "tessera/backend/memory.hpp"
#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/core/checksum.hpp"
#include "tessera/core/fixed_point.hpp"
#include "tessera/core/vec.hpp"
#include "tessera/optim/algorithms.hpp"
#include "tessera/optim/detail/unit_update.hpp"
#include "tessera/optim/global_norm.hpp"
#include "tessera/optim/step_ledger.hpp"
#include "tessera/wrapper/data_parallel.hpp"
#include "tessera/wrapper/shard_view.hpp"

namespace tessera {

//! Where offloaded units are updated (optimizer_options::offload_update).
enum class update_site { host, device };

struct optimizer_options {
  //! Clip the global gradient norm to this value; 0 disables clipping.
  double clip_norm = 0.0;
  //! Run each unit's update in the next forward's shadow: step() queues the
  //! updates on a side stream (in unit order) and returns; the next use of a
  //! unit (its gather or forward, a gradient view, a checkpoint, any read
  //! through shard_view) waits for that unit's update only, so unit u + 1
  //! updates while unit u computes. Where the wrapper's publication after a
  //! step is a collective (optim, optim_grads over several ranks; outer<optim>
  //! meshes) the updates run in step() as without it. Off: every update is
  //! issued on the current stream in step().
  bool overlap_updates = true;
  //! Where offloaded units (wrapper_options::offload_optimizer) are updated:
  //! `device` (the default): the algorithm's kernel on the GPU reading and
  //! writing the host-resident state across PCIe (12 + 12 bytes per AdamW
  //! element; a narrow grid, so it leaves SMs to the compute stream);
  //! `host`: their gradients copied to pinned memory, the algorithm's own
  //! functor over every core (host::pool), the new compute weights copied
  //! back, all in stream order (PCIe carries 4 + 2 bytes per fp32/bf16
  //! element; host memory 30). On an H200 with 16 cores (86 GB/s of host
  //! memory, 55 GB/s of PCIe each way) the device update measured 2.8 times
  //! faster at 1B (372 against 1027 ms a step; bench/RESULTS.md), hence the default. Units whose main
  //! weights are the compute weights (full_precision) always take `device`.
  update_site offload_update = update_site::device;
};

template <class Algorithm, class Wrapper>
class ShardedOptimizer {
  static_assert(optimizer_algorithm<Algorithm>,
                "tessera: ShardedOptimizer's first argument is not a tessera optimizer algorithm; use adamw or sgd, "
                "or give your type tessera_algorithm, state_count (1-15), name, state_names, lr and "
                "kernel<M, G, C>(update_args) (see tessera/optim/algorithms.hpp)");
  using view_type = shard_view<typename Wrapper::config>;
  using B = typename Wrapper::backend_type;
  using M = typename Wrapper::main_type;
  using G = typename Wrapper::grad_type;
  using ops = backend_ops<B>;
  template <class T> using buffer = typename ops::template buffer<T>;

public:
  //! Allocates state for the wrapper's optimizer ranges (the wrapper must be finalized).
  ShardedOptimizer(Wrapper& model, Algorithm hp, optimizer_options opt = {})
      : e_(model.shards()), hp_(hp), opt_(opt) {
    TESSERA_CHECK(e_.finalized(), "ShardedOptimizer created before the wrapper's finalize()");
    TESSERA_CHECK(opt.clip_norm >= 0, "clip_norm must be >= 0, got ", opt.clip_norm);
    {
      std::size_t host = 0;  // what the loop below places in host memory, before it allocates
      for (std::size_t u = 0; u < e_.num_units(); ++u)
        if (e_.offloaded(u)) host += offloaded_unit_bytes(e_.opt_range(u).second, opt.offload_update);
      detail::check_host_room(host, "offloading the optimizer state (wrapper_options::offload_optimizer)");
    }
    for (std::size_t u = 0; u < e_.num_units(); ++u) {
      const auto& L = e_.layout(u);
      const std::size_t n = e_.opt_range(u).second;
      unit_state st;
      const placement where = e_.offloaded(u) ? placement::host : placement::device;
      for (int k = 0; k < Algorithm::state_count; ++k) {
        st.state.emplace_back(n, where);
        ops::fill(st.state.back().span(), M{});
      }
      const auto bits = detail::decay_mask_bits(L, n, [&](std::size_t t) { return e_.range_piece(u, t); }, st.decay_shift);
      if (!bits.empty()) {
        st.decay_bits = buffer<std::uint32_t>(bits.size());
        ops::copy_from_host(st.decay_bits.span(), std::span<const std::uint32_t>(bits));
      }
      if (host_update(e_.offloaded(u), opt.offload_update)) {
        st.on_host = true;
        st.host_bits = bits;
        st.grads_host = buffer<G>(n, placement::host);
        st.compute_host = buffer<C>(n, placement::host);
        if (ctl_host_.size() == 0) ctl_host_ = buffer<step_control>(1, placement::host);
      }
      units_.push_back(std::move(st));
    }
    const step_control zero = zero_control();
    ops::copy_from_host(ctl_.span(), std::span<const step_control>(&zero, 1));
  }

  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;
  ShardedOptimizer(ShardedOptimizer&&) noexcept = default;  // deferred updates point into the state, not at *this
  ShardedOptimizer& operator=(ShardedOptimizer&&) = delete;  // would drop this one's state under its deferred updates
  //! Waits (on the current stream) for updates still deferred: they write this optimizer's state.
  ~ShardedOptimizer() {
    try {
      e_.flush();
    } catch (...) {
      // A destructor cannot report; the wrapper's next use reports a failed stream.
    }
  }

  //! Bytes this optimizer holds on this rank in the backend's memory: its
  //! state (of units not offloaded), the decay masks and the norm accumulator.
  [[nodiscard]] std::size_t state_bytes() const noexcept { return held(placement::device); }
  //! Bytes it holds in host memory for offloaded units: their state, and
  //! for the host update the staging of gradients, compute weights and the
  //! step's decision.
  [[nodiscard]] std::size_t offloaded_bytes() const noexcept { return held(placement::host); }
  //! Planned bytes on one rank: in the backend's memory, and offloaded.
  struct planned_bytes {
    std::size_t device = 0, host = 0;
  };
  //! What state_bytes() and offloaded_bytes() will be on rank `rank`
  //! (replica part `part` under outer<optim>) of a wrapper with these
  //! layouts and options, without building either: the same ranges, masks
  //! and placements the constructor allocates (tessera/plan/memory.hpp).
  [[nodiscard]] static planned_bytes planned_state(const std::vector<unit_layout>& layouts, int rank, int part = 0,
                                                   const wrapper_options& wo = {}, const optimizer_options& oo = {}) {
    using rules = detail::storage<typename Wrapper::config>;
    planned_bytes b;
    b.device = detail::norm_scalars * sizeof(double) + norm_limbs * sizeof(std::uint64_t) + sizeof(step_control);
    const std::vector<bool> off = detail::offloaded_units(layouts, wo.offload_optimizer);
    bool control = false;
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      const unit_layout& L = layouts[u];
      const std::size_t n = rules::opt_range(L, rank, part).second;
      unsigned shift = 0;
      const auto bits = detail::decay_mask_bits(L, n, [&](std::size_t t) { return rules::range_piece(L, t, rank, part); }, shift);
      b.device += bits.size() * sizeof(std::uint32_t);
      if (!off[u]) {
        b.device += std::size_t(Algorithm::state_count) * n * sizeof(M);
        continue;
      }
      b.host += offloaded_unit_bytes(n, oo.offload_update);
      if (host_update(true, oo.offload_update)) {
        b.host += bits.size() * sizeof(std::uint32_t);
        control = true;
      }
    }
    if (control) b.host += sizeof(step_control);
    return b;
  }
  //! planned_state(...).device without offload.
  [[nodiscard]] static std::size_t planned_state_bytes(const std::vector<unit_layout>& layouts, int rank, int part = 0) {
    return planned_state(layouts, rank, part).device;
  }
  //! The learning rate at step s (1-based): schedule(s, base lr) if set, else the base.
  //! Steps already decided keep the learning rate they had; the ring of step
  //! scalars ahead is rewritten at the next decide().
  void set_schedule(std::function<double(long step, double base_lr)> f) {
    ledger_.settle();
    schedule_ = std::move(f);
    ledger_.rewrite_ahead();
  }
  //! Tensor parallelism: the global norm over a tp group too (tp_norm_over).
  void set_tensor_parallel(tp_norm t) {
    TESSERA_CHECK(!exact, "set_tensor_parallel: exact_reduction's norm over a tensor-parallel group is not built yet");
    TESSERA_CHECK(bool(t.sum) && bool(t.replicated), "set_tensor_parallel: a tp_norm needs its sum and its replicated set");
    TESSERA_CHECK(!decided_, "set_tensor_parallel between decide() and apply(); set it between steps");
    tp_ = std::move(t);
    tp_acc_ = buffer<double>(2 * detail::norm_scalars);  // 32 bytes, not in planned_state (tessera-plan has no tp yet)
  }
  //! Steps applied so far (waits for the last step's decision).
  [[nodiscard]] long steps() { return ledger_.settle(), ledger_.applied(); }
  //! Sets the step counters (bias correction, schedule) when resuming from a checkpoint.
  void restore_counters(long steps, long skipped) {
    TESSERA_CHECK(steps >= 0 && skipped >= 0, "restore_counters(", steps, ", ", skipped, ")");
    ledger_.settle();
    ledger_.restore(steps, skipped);
    ops::for_each(1, detail::set_applied{ctl_.data(), steps});  // the device numbers the next step steps + 1
  }
  using algorithm_type = Algorithm;
  using wrapper_type = Wrapper;
  //! The wrapper's shards this optimizer updates (for checkpoints and tools).
  [[nodiscard]] view_type shards() const noexcept { return e_; }
  //! Steps skipped for non-finite gradients so far (waits for the last step's decision).
  [[nodiscard]] long skipped_steps() { return ledger_.settle(), ledger_.skipped(); }
  [[nodiscard]] const Algorithm& hyper_parameters() const noexcept { return hp_; }
  [[nodiscard]] const optimizer_options& options() const noexcept { return opt_; }
  //! State k of unit u over this rank's optimizer range (m = 0, v = 1 for
  //! AdamW), after the unit's update (settles a deferred one).
  [[nodiscard]] std::span<M> state(std::size_t u, int k) {
    auto& st = units_.at(u);
    e_.flush(u);
    return st.state.at(std::size_t(k)).span();
  }

  //! One optimizer step: decide() then apply(). The host does not wait for
  //! the device: the returned handle does when read.
  step_handle<B> step() {
    auto h = decide();
    apply();
    return h;
  }

  //! The first half of step(): finishes the gradient sync, computes the
  //! global norm with one all-reduce, and decides on the device whether to
  //! skip (a non-finite gradient on any rank: nothing changes on any rank),
  //! how much to clip, and the step's number, learning rate and scalars. The
  //! host learns the outcome when a handle is read, or when it needs it (at
  //! most step_ledger::max_outstanding decisions stay unread). apply() must follow before the
  //! next decide(); between them the weights are the last step's. A step
  //! graph (optim/step_graph.cuh) captures apply(), the next forward and
  //! backward, and decide(), so that the updates stay in the next forward's
  //! shadow.
  step_handle<B> decide() {
    TESSERA_CHECK(!decided_, "ShardedOptimizer::decide() twice without apply()");
    e_.flush();  // updates a forward did not reach (unused units) read the control block this decision rewrites
    e_.finish_grad_sync();  // may refuse (no gradients): before the decision is numbered
    auto rec = issue();  // numbered after finish_grad_sync() accepted the step
    settings_ = settings_text(rec->index + 1);
    double* acc = tp_.sum ? tp_acc_.data() : acc_.data();
    detail::decide_global_norm<B, exact>(e_, units_.size(), acc, limbs_.data(), ctl_.data(), opt_.clip_norm,
                                         ledger_.book(), settings_.c_str(), tp_);
    if (!ops::capturing()) ledger_.mark();
    decided_ = true;
    return step_handle<B>(std::move(rec));
  }

  //! The second half of step(): the decided step's updates (deferred per
  //! unit under optimizer_options::overlap_updates), the publication of the
  //! new compute weights, and zeroed gradients.
  void apply() {
    TESSERA_CHECK(decided_, "ShardedOptimizer::apply() without a decide() before it");
    decided_ = false;
    // An algorithm without step scalars builds its kernel from this step's
    // number and learning rate, which the host learns from the decision.
    step_result now{};
    if constexpr (!capturable) now = ledger_.settle();
    const bool defer = opt_.overlap_updates && e_.local_publication();
    // Local publication only drops gathered copies (which the updates make
    // stale); each unit's next gather settles its update first.
    if (defer) e_.publish_weights(/*converted=*/true);
    // The host update reads the decision from pinned memory, copied in
    // stream order before any unit's update is queued.
    if (ctl_host_.size()) ops::copy_to_host_async(ctl_host_.span(), std::span<const step_control>(ctl_.span()));
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (units_[u].on_host) {  // queued on side streams now; the wait is what settling runs
        std::function<void()> wait = queue_host_update(u, now);
        if (defer) e_.defer(u, std::move(wait));
        else wait();
        continue;
      }
      const auto k = kernel(u, now);
      const std::size_t n = e_.opt_range(u).second;
      const auto update = [k, n, across_pcie = e_.offloaded(u)] {
        if (across_pcie) ops::for_each_streaming(n, k);
        else ops::for_each(n, k);
      };
      if (defer) e_.defer(u, ops::template after<1>([] {}, update));
      else update();
    }
    if (!defer) e_.publish_weights(/*converted=*/true);
    e_.zero_grad();
  }

  //! Whether a step was decided and not yet applied.
  [[nodiscard]] bool decided() const noexcept { return decided_; }
  //! Whether the algorithm declares its per-step scalars (optim/algorithms.hpp):
  //! its kernels then read the step's lr and scalars from the device's
  //! decision, so apply() needs no host wait and steps can be captured in a graph.
  static constexpr bool capturable = has_step_scalars<Algorithm>;

  //! For a step graph's replay (optim/step_graph.cuh), whose graph holds
  //! apply() of the decided step, a forward and backward, and decide(): what
  //! those do on the host (numbers the new decision, writes the ring of step
  //! scalars ahead, returns its handle), without issuing device work. The
  //! step stays decided. mark() once the graph is launched.
  step_handle<B> replay_decide() {
    static_assert(capturable, "tessera: a step graph needs an algorithm with step_scalars (optim/algorithms.hpp)");
    TESSERA_CHECK(decided_, "ShardedOptimizer::replay_decide() replays apply() of a decided step, and none is decided");
    return step_handle<B>(issue());
  }
  //! Marks every decision issued so far as reachable: their results are
  //! there once the current stream passes this point (decide() does it
  //! itself unless it is being captured).
  void mark() { ledger_.mark(); }

private:
  using C = typename Wrapper::compute_type;
  struct unit_state {
    std::vector<buffer<M>> state;
    buffer<std::uint32_t> decay_bits;  // empty: every element decays
    unsigned decay_shift = 0;
    // The host update (offloaded units): the mask, gradients and new compute weights in host memory.
    bool on_host = false;
    std::vector<std::uint32_t> host_bits;
    buffer<G> grads_host;
    buffer<C> compute_host;
  };
  // Whether an offloaded unit is updated on the host: the option, and compute
  // weights of their own to copy back (else the main weights are on the device).
  static bool host_update(bool offloaded, update_site where) noexcept {
    return offloaded && where == update_site::host && !std::is_same_v<C, M>;
  }
  // Host bytes of an offloaded unit whose optimizer range has n elements:
  // its state, and the host update's staging of gradients and compute weights.
  static std::size_t offloaded_unit_bytes(std::size_t n, update_site where) noexcept {
    return n * (std::size_t(Algorithm::state_count) * sizeof(M) + (host_update(true, where) ? sizeof(G) + sizeof(C) : 0));
  }
  std::size_t held(placement where) const noexcept {
    std::size_t b = 0;
    auto add = [&](const auto& buf) {
      if (buf.where() == where) b += buf.size() * sizeof(*buf.data());
    };
    add(acc_);
    add(limbs_);
    add(ctl_);
    add(ctl_host_);
    for (auto& u : units_) {
      add(u.decay_bits);
      for (auto& s : u.state) add(s);
      add(u.grads_host);
      add(u.compute_host);
      if (where == placement::host) b += u.host_bits.size() * sizeof(std::uint32_t);
    }
    return b;
  }

  // Unit u's update on the host, queued in stream order after the work
  // issued so far: its gradients to pinned memory on side lane 1, then on lane
  // 2 (once they are there) the algorithm's functor over every core (the
  // driver's callback thread hands the range to host::pool) and the new
  // compute weights back to the device. Two lanes, so that unit u + 1's
  // gradients copy while the CPU updates unit u. Returns what makes the
  // current stream wait for all of it.
  std::function<void()> queue_host_update(std::size_t u, const step_result& r) {
    auto& st = units_[u];
    const std::size_t n = e_.opt_range(u).second;
    M* state[Algorithm::state_count];
    for (int k = 0; k < Algorithm::state_count; ++k) state[k] = st.state[std::size_t(k)].data();
    const update_args<M, G, C> args{e_.main_weights(u).data(), st.grads_host.data(), state, st.compute_host.data(),
                                    decay_mask{st.host_bits.empty() ? nullptr : st.host_bits.data(), st.decay_shift},
                                    r.lr, &ctl_host_.data()->grad_scale, r.step,
                                    capturable ? ctl_host_.data()->scalars : nullptr};
    using F = decltype(hp_.template kernel<M, G, C>(args));
    const detail::unless_skipped<F> f{hp_.template kernel<M, G, C>(args), &ctl_host_.data()->skip};
    const std::span<const G> grads = e_.opt_grads(u);
    const std::span<G> grads_host = st.grads_host.span();
    const std::span<C> out(e_.compute_out(u), n);
    const std::span<const C> out_host = st.compute_host.span();
    auto down = ops::template after<1>([] {}, [grads, grads_host] { ops::copy_to_host_async(grads_host, grads); });
    return ops::template after<2>(std::move(down), [f, n, out, out_host] {
      ops::host_task([f, n] {
        host::pool::shared().parallel_for(n, 4096, [&f](std::size_t b, std::size_t e) { run_range(f, b, e); });
      });
      ops::copy_from_host_async(out, out_host);
    });
  }
  // f over [b, e) on this thread, element by element: on the host the
  // functor's vector path (vec<T, V> loops) measured 1.8 times slower than
  // the scalar one (g++ -O3: 4.4 against 2.4 ns per AdamW element).
  template <class F> static void run_range(const F& f, std::size_t b, std::size_t e) {
    for (; b < e; ++b) f(b);
  }

  // One pass over the unit's whole optimizer range: the algorithm's own
  // kernel, doing nothing where the device decided to skip.
  auto kernel(std::size_t u, const step_result& r) {
    auto& st = units_[u];
    const auto w = e_.main_weights(u);
    M* state[Algorithm::state_count];
    for (int k = 0; k < Algorithm::state_count; ++k) state[k] = st.state[std::size_t(k)].data();
    const update_args<M, G, C> args{w.data(), e_.opt_grads(u).data(), state, e_.compute_out(u),
                                    decay_mask{st.decay_bits.data(), st.decay_shift}, r.lr,
                                    control<float>(offsetof(step_control, grad_scale)), r.step,
                                    capturable ? control<float>(offsetof(step_control, scalars)) : nullptr};
    using F = decltype(hp_.template kernel<M, G, C>(args));
    return detail::unless_skipped<F>{hp_.template kernel<M, G, C>(args), control<int>(offsetof(step_control, skip))};
  }
  // A field of the control block (backend memory: its address, never dereferenced here).
  template <class T> const T* control(std::size_t offset) const {
    return reinterpret_cast<const T*>(reinterpret_cast<const char*>(ctl_.data()) + offset);
  }
  // Numbers a decision and writes the ring ahead: each step's lr (the
  // schedule's) and the algorithm's scalars for it.
  std::shared_ptr<detail::step_record<B>> issue() {
    return ledger_.issue([this](long long s, step_scalars& e) {
      e.lr = schedule_ ? schedule_(long(s), hp_.lr) : hp_.lr;
      if constexpr (capturable) hp_.step_scalars(long(s), e.lr, e.v);
    });
  }
  // The step's settings as the grad-norm all-reduce's label: the learning
  // rate the schedule gives decision k (k = decisions so far, the same on
  // every rank) and a digest of every setting's bits. Where the order check
  // runs (comm::mpi's default), a rank whose learning rate, schedule or
  // hyper-parameters differ fails that step with the ranks and values named;
  // so does one that set parameters (set_param, init_param) the others did not.
  std::string settings_text(long long k) const {
    std::vector<double> v{schedule_ ? schedule_(long(k), hp_.lr) : hp_.lr, opt_.clip_norm};
    if constexpr (requires { hp_.settings(); })
      for (double x : hp_.settings()) v.push_back(x);
    char b[72];
    const int n = std::snprintf(b, sizeof b, "lr %.6g, settings %08llx", v[0],
                                static_cast<unsigned long long>(checksum64::of(v.data(), v.size() * sizeof(double)) & 0xffffffffu));
    // Values given to set_param or init_param on some ranks only, or differing between them, show here too.
    if (const std::uint64_t d = e_.set_param_digest(); d != 0 && n > 0 && std::size_t(n) < sizeof b)
      std::snprintf(b + n, sizeof b - std::size_t(n), ", set_param/init_param %08llx", static_cast<unsigned long long>(d & 0xffffffffu));
    return b;
  }
  static step_control zero_control() {
    step_control c{};
    c.grad_scale = 1;
    return c;
  }

  view_type e_;
  Algorithm hp_;
  optimizer_options opt_;
  std::function<double(long, double)> schedule_;
  std::vector<unit_state> units_;
  static constexpr bool exact = Wrapper::config::reduction::exact;
  static constexpr std::size_t norm_limbs = exact ? fixed::norm_limbs : 0;  // exact: the squares' fixed-point limbs
  buffer<double> acc_{detail::norm_scalars};
  tp_norm tp_;
  buffer<double> tp_acc_;  // set_tensor_parallel: the slices' sums and the replicated ones' (2 x norm_scalars)
  buffer<std::uint64_t> limbs_{norm_limbs};
  buffer<step_control> ctl_{1};  // the device's decision (detail::decide_step)
  buffer<step_control> ctl_host_;  // its copy for the host update (offloaded units)
  detail::step_ledger<B> ledger_;  // the decisions' numbers, rings and records
  bool decided_ = false;
  std::string settings_;  // this step's settings label (settings_text), alive while the all-reduce is recorded
};

}  // namespace tessera
