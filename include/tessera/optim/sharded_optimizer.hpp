#pragma once
//! \file ShardedOptimizer<Algorithm, Wrapper>: optimizer state over each rank's
//! optimizer range only; one pass per step, then the strategy's weight all-gather.
#include <bit>
#include <cmath>
#include <functional>
#include <span>
#include <vector>

#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/core/vec.hpp"
#include "tessera/optim/algorithms.hpp"
#include "tessera/wrapper/data_parallel.hpp"
#include "tessera/wrapper/shard_view.hpp"

namespace tessera {

struct optimizer_options {
  //! Clip the global gradient norm to this value; 0 disables clipping.
  double clip_norm = 0.0;
};

//! What one step did.
struct step_result {
  bool skipped = false;    //!< non-finite gradients on some rank: nothing updated on any rank
  double grad_norm = 0.0;  //!< global L2 norm before clipping (inf / nan when skipped)
  double clip_coef = 1.0;  //!< factor applied to the gradients
  double lr = 0.0;         //!< learning rate used
  long step = 0;           //!< steps applied so far
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
    for (std::size_t u = 0; u < e_.num_units(); ++u) {
      const auto& L = e_.layout(u);
      const auto [lo, n] = e_.opt_range(u);
      unit_state st;
      for (int k = 0; k < Algorithm::state_count; ++k) {
        st.state.emplace_back(n);
        ops::fill(st.state.back().span(), M{});
      }
      // The decay mask: a bit per granule of the layout's alignment (a power
      // of two), or per element otherwise; none when every tensor decays.
      const std::size_t A = L.alignment();
      const unsigned shift = (A & (A - 1)) == 0 ? unsigned(std::countr_zero(A)) : 0u;
      const std::size_t granules = (n + (std::size_t(1) << shift) - 1) >> shift;
      std::vector<std::uint32_t> bits((granules + 31) / 32, ~0u);
      bool any_exempt = false;
      for (std::size_t t = 0; t < L.tensors().size(); ++t) {
        const piece p = e_.range_piece(u, t);  // the tensor's part of the range, range-relative
        if (p.empty() || L.tensors()[t].spec.weight_decay) continue;
        any_exempt = true;
        for (std::size_t gi = p.shard_begin >> shift; gi <= (p.shard_begin + p.count - 1) >> shift; ++gi)
          bits[gi >> 5] &= ~(1u << (gi & 31));
      }
      if (any_exempt) {
        st.decay_bits = buffer<std::uint32_t>(bits.size());
        ops::copy_from_host(st.decay_bits.span(), std::span<const std::uint32_t>(bits));
      }
      st.decay_shift = shift;
      units_.push_back(std::move(st));
    }
  }

  //! Bytes this optimizer holds on this rank: its state, the decay masks
  //! and the norm accumulator.
  [[nodiscard]] std::size_t state_bytes() const noexcept {
    std::size_t b = acc_.size() * sizeof(double);
    for (auto& u : units_) {
      b += u.decay_bits.size() * sizeof(std::uint32_t);
      for (auto& s : u.state) b += s.size() * sizeof(M);
    }
    return b;
  }
  //! The learning rate at step s (1-based): schedule(s, base lr) if set, else the base.
  void set_schedule(std::function<double(long step, double base_lr)> f) { schedule_ = std::move(f); }
  [[nodiscard]] long steps() const noexcept { return step_; }
  //! Sets the step counters (bias correction, schedule) when resuming from a checkpoint.
  void restore_counters(long steps, long skipped) {
    TESSERA_CHECK(steps >= 0 && skipped >= 0, "restore_counters(", steps, ", ", skipped, ")");
    step_ = steps;
    skipped_ = skipped;
  }
  using algorithm_type = Algorithm;
  using wrapper_type = Wrapper;
  //! The wrapper's shards this optimizer updates (for checkpoints and tools).
  [[nodiscard]] view_type shards() const noexcept { return e_; }
  [[nodiscard]] long skipped_steps() const noexcept { return skipped_; }
  [[nodiscard]] const Algorithm& hyper_parameters() const noexcept { return hp_; }
  //! State k of unit u over this rank's optimizer range (m = 0, v = 1 for AdamW).
  [[nodiscard]] std::span<M> state(std::size_t u, int k) { return units_.at(u).state.at(std::size_t(k)).span(); }

  //! Finishes the gradient sync, computes the global norm with one all-reduce,
  //! skips the step on every rank if any rank saw a non-finite gradient, else
  //! clips, updates, publishes the new compute weights and zeroes gradients.
  step_result step() {
    e_.finish_grad_sync();
    // Partial sums of squares and non-finite counts accumulate in backend
    // memory; one all-reduce of the two doubles, one copy to the host.
    ops::fill(acc_.span(), 0.0);
    for (std::size_t u = 0; u < units_.size(); ++u) ops::sum_squares_into(std::span<const G>(e_.norm_grads(u)), acc_.data());
    {
      comm::label lbl("grad_norm");
      e_.sum_partials(acc_.data(), 2);  // each element counted once on any mesh
    }
    double partial[2];
    ops::copy_to_host(std::span<double>(partial, 2), std::span<const double>(acc_.span()));
    step_result r;
    r.grad_norm = partial[1] > 0 ? std::nan("") : std::sqrt(partial[0]);
    if (partial[1] > 0 || !std::isfinite(r.grad_norm)) {
      r.skipped = true;
      r.step = step_;
      ++skipped_;
      e_.zero_grad();
      return r;
    }
    if (opt_.clip_norm > 0 && r.grad_norm > opt_.clip_norm) r.clip_coef = opt_.clip_norm / (r.grad_norm + 1e-6);
    ++step_;
    r.step = step_;
    r.lr = schedule_ ? schedule_(step_, hp_.lr) : hp_.lr;
    for (std::size_t u = 0; u < units_.size(); ++u) update(u, r);
    e_.publish_weights(/*converted=*/true);
    e_.zero_grad();
    return r;
  }

private:
  using C = typename Wrapper::compute_type;
  struct unit_state {
    std::vector<buffer<M>> state;
    buffer<std::uint32_t> decay_bits;  // empty: every element decays
    unsigned decay_shift = 0;
  };

  // One pass over the unit's whole optimizer range: the algorithm's own kernel.
  void update(std::size_t u, const step_result& r) {
    auto& st = units_[u];
    const auto w = e_.main_weights(u);
    M* state[Algorithm::state_count];
    for (int k = 0; k < Algorithm::state_count; ++k) state[k] = st.state[std::size_t(k)].data();
    const update_args<M, G, C> args{w.data(), e_.opt_grads(u).data(), state, e_.compute_out(u),
                                    decay_mask{st.decay_bits.data(), st.decay_shift}, r.lr, r.clip_coef, step_};
    ops::for_each(w.size(), hp_.template kernel<M, G, C>(args));
  }

  view_type e_;
  Algorithm hp_;
  optimizer_options opt_;
  std::function<double(long, double)> schedule_;
  std::vector<unit_state> units_;
  buffer<double> acc_{2};  // sum of squares, non-finite count
  long step_ = 0, skipped_ = 0;
};

}  // namespace tessera
