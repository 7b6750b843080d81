#pragma once
//! \file The global gradient norm and the step's decision, on the device:
//! each rank's partial sums over its part of the gradients, one collective
//! (two for exact_reduction), and one thread that decides whether to skip
//! (a non-finite gradient on any rank) and how much to clip. The update
//! kernels read the decision (step_control) from backend memory, so a step
//! needs no host synchronisation. ShardedOptimizer::step() runs it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>
#include <vector>

#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/comm/trace.hpp"
#include "tessera/core/fixed_point.hpp"
#include "tessera/optim/algorithms.hpp"
#include "tessera/shard/layout.hpp"
#include "tessera/wrapper/options.hpp"

namespace tessera {

//! What the host computes ahead for one step number (host memory the device
//! reads: a ring of them, entry step % size): its learning rate after the
//! schedule, and the algorithm's per-step scalars (has_step_scalars).
struct step_scalars {
  long long step;  //!< the step number this entry is for (the device checks it)
  double lr;
  float v[max_step_scalars];
};

//! What the device decides after the global norm, in backend memory: the
//! update kernels read grad_scale, skip and scalars from here, so a step
//! needs no host synchronisation. The device also counts the steps it
//! applied, so it numbers each step itself and takes that step's learning
//! rate and scalars from the host's ring (step_book): the host never needs
//! the last step's outcome before it issues the next one.
struct step_control {
  double grad_norm;  //!< sqrt of the sum of squares; NaN where some element was not finite
  double clip_coef;  //!< clip_norm / (norm + 1e-6) where clipped, else 1
  float grad_scale;  //!< clip_coef as the kernels use it
  int skip;          //!< 1: a non-finite gradient on some rank; the step changes nothing
  long long step;    //!< this step's number if it applies (applied steps before it + 1)
  double lr;         //!< its learning rate
  float scalars[max_step_scalars];  //!< the algorithm's scalars for it
  long long applied;  //!< steps applied so far, this one included
  long long issued;   //!< decisions made so far, this one included
  int stale;          //!< 1: the ring had no entry for this step number (a host error; the step was skipped)
};

//! Where the device finds the host's step scalars and leaves each decision
//! for the host (host memory: pinned on the CUDA backend): `ring[s % size]`
//! for step number s, and decision i (0-based) at `results[i % size]`.
struct step_book {
  const step_scalars* ring;
  step_control* results;
  long long size;
};

//! Tensor parallelism's part of the global norm (ShardedOptimizer::
//! set_tensor_parallel): each rank of a tp group holds a slice of some
//! parameters (tp::split) and the rest whole. `sum` sums n doubles (backend
//! memory) over the group in place; `replicated(p)` names the parameters
//! every rank of the group holds whole (norms, the row-parallel products'
//! biases), counted once; the slices are summed over the group.
struct tp_norm {
  std::function<void(double*, std::size_t)> sum;
  std::function<bool(param_id)> replicated;
};
//! A tp_norm over a tensor-parallel group (comm::make_tp_groups' tp).
template <class Comm>
[[nodiscard]] tp_norm tp_norm_over(Comm& tp, std::function<bool(param_id)> replicated) {
  return {[&tp](double* x, std::size_t n) {
            comm::label lbl("grad_norm", "over the tensor-parallel group");
            tp.all_reduce(x, x, n, dtype::f64, comm::reduce_op::sum);
          },
          std::move(replicated)};
}

namespace detail {

// The device's decision from the all-reduced partial sums (one thread): the
// same arithmetic, in double, that a host would do.
TESSERA_HOST_DEVICE inline void decide(double sum, double bad, double clip_norm, step_control* out) {
#if defined(__CUDA_ARCH__)
    const double norm = bad > 0 ? __longlong_as_double(0x7ff8000000000000LL) : sqrt(sum);
    const bool skip = bad > 0 || !isfinite(norm);
#else
    const double norm = bad > 0 ? std::nan("") : std::sqrt(sum);
    const bool skip = bad > 0 || !std::isfinite(norm);
#endif
    const double coef = !skip && clip_norm > 0 && norm > clip_norm ? clip_norm / (norm + 1e-6) : 1.0;
    out->grad_norm = norm;
    out->clip_coef = coef;
    out->grad_scale = float(coef);
    out->skip = skip ? 1 : 0;
}
// After decide: the step's number, its scalars from the host's ring, the
// applied count, and a copy of the whole decision for the host.
TESSERA_HOST_DEVICE inline void number_step(step_control* c, const step_book& book) {
  const long long s = c->applied + 1;
  const step_scalars& e = book.ring[s % book.size];
  c->step = s;
  c->stale = e.step != s;
  if (c->stale) {
    c->skip = 1;  // nothing changes; the host reports it when it reads this decision
  } else {
    c->lr = e.lr;
    for (int k = 0; k < max_step_scalars; ++k) c->scalars[k] = e.v[k];
  }
  if (!c->skip) c->applied = s;
  c->issued += 1;
  book.results[(c->issued - 1) % book.size] = *c;
}
struct decide_step {
  const double* acc;  // sum of squares, non-finite count
  step_control* out;
  double clip_norm;
  step_book book;
  TESSERA_HOST_DEVICE void operator()(std::size_t) const {
    decide(acc[0], acc[1], clip_norm, out);
    number_step(out, book);
  }
};
// exact_reduction: the same from the all-reduced largest magnitude and the
// fixed-point limbs of the squares (core/fixed_point.hpp).
struct decide_exact_step {
  const double* max;
  const std::uint64_t* limbs;
  step_control* out;
  double clip_norm;
  step_book book;
  TESSERA_HOST_DEVICE void operator()(std::size_t) const {
    const double m = *max;
    const bool finite = fixed::finite_magnitude(m);
    const double sum = finite && m > 0 ? fixed::square_sum(limbs, fixed::square_shift(m)) : 0.0;
    decide(sum, finite ? 0.0 : 1.0, clip_norm, out);
    number_step(out, book);
  }
};
// Tensor parallelism: the replicated tensors' sums (acc + norm_scalars, over
// the data-parallel ranks) added to the split ones' (over the tp group too).
struct add_replicated {
  double* acc;
  TESSERA_HOST_DEVICE void operator()(std::size_t) const { acc[0] += acc[2], acc[1] += acc[3]; }
};
// Sets the device's count of applied steps (restoring a checkpoint's).
struct set_applied {
  step_control* out;
  long long applied;
  TESSERA_HOST_DEVICE void operator()(std::size_t) const { out->applied = applied; }
};
// Carries in this rank's limbs before they are summed over ranks.
struct carry_limbs {
  std::uint64_t* limbs;
  TESSERA_HOST_DEVICE void operator()(std::size_t) const { fixed::carry(limbs); }
};


//! Doubles of a norm's accumulator: the sum of squares and the count of
//! non-finite elements (exact_reduction: the largest magnitude first).
inline constexpr std::size_t norm_scalars = 2;

//! Fills `ctl` with the step's decision (and its number and scalars, from `book`) from the gradients engine `e` counts
//! in the norm (e.norm_grads(u) for each of `units` units): a sum of squares
//! all-reduced (acc: norm_scalars doubles), or under exact_reduction the largest
//! magnitude (a max) and then the squares on its fixed-point grid (an
//! integer sum of fixed::norm_limbs limbs), order-independent on any split of the elements.
//! `settings` names the step's optimizer settings in the all-reduce's label,
//! which the collective-order check compares across ranks.
//! With tensor parallelism (`tp.sum` set; not under Exact): acc holds 2 x
//! norm_scalars doubles; the tensors tp.replicated names are summed over the
//! data-parallel ranks only, the others over the tp group too.
template <class B, bool Exact, class Engine>
void decide_global_norm(Engine& e, std::size_t units, double* acc, std::uint64_t* limbs, step_control* ctl,
                        double clip_norm, const step_book& book, const char* settings = nullptr,
                        const tp_norm& tp = {}) {
  using ops = backend_ops<B>;
  using G = std::remove_cvref_t<typename decltype(e.norm_grads(0))::element_type>;
  ops::fill(std::span<double>(acc, norm_scalars), 0.0);
  std::vector<std::span<const G>> grads(units);  // every unit's in one pass
  for (std::size_t u = 0; u < units; ++u) grads[u] = e.norm_grads(u);
  const std::span<const std::span<const G>> all(grads);
  if constexpr (Exact) {
    ops::max_abs_into(all, acc);
    comm::label lbl("grad_norm", settings);
    e.combine_partials(acc, 1, comm::reduce_op::max);
    ops::fill(std::span<std::uint64_t>(limbs, fixed::norm_limbs), std::uint64_t(0));
    ops::sum_squares_fixed_into(all, acc, limbs);
    ops::for_each(1, carry_limbs{limbs});
    e.combine_partials(reinterpret_cast<std::int64_t*>(limbs), fixed::norm_limbs, comm::reduce_op::sum);
    ops::for_each(1, decide_exact_step{acc, limbs, ctl, clip_norm, book});
  } else if (tp.sum) {
    std::vector<std::span<const G>> split, replicated;
    for (std::size_t u = 0; u < units; ++u)
      for (std::size_t t = 0; t < e.layout(u).tensors().size(); ++t)
        if (const piece p = e.norm_piece(u, t); p.count > 0)
          (tp.replicated(param_id{int(u), int(t)}) ? replicated : split).push_back(grads[u].subspan(p.shard_begin, p.count));
    ops::fill(std::span<double>(acc + norm_scalars, norm_scalars), 0.0);  // the first half is zeroed above
    ops::sum_squares_into(std::span<const std::span<const G>>(split), acc);
    ops::sum_squares_into(std::span<const std::span<const G>>(replicated), acc + norm_scalars);
    {
      comm::label lbl("grad_norm", settings);
      e.sum_partials(acc, 2 * norm_scalars);
    }
    tp.sum(acc, norm_scalars);  // the slices' squares over the tensor-parallel group
    ops::for_each(1, add_replicated{acc});
    ops::for_each(1, decide_step{acc, ctl, clip_norm, book});
  } else {
    ops::sum_squares_into(all, acc);
    {
      comm::label lbl("grad_norm", settings);
      e.sum_partials(acc, norm_scalars);  // each element counted once on any mesh
    }
    ops::for_each(1, decide_step{acc, ctl, clip_norm, book});
  }
}

}  // namespace detail
}  // namespace tessera
