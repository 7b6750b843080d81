#pragma once
//! \file exact_sums: the engine's side of exact_reduction (policy/reduction.hpp).
//! Every micro-batch's gradients are rounded once onto a per-unit fixed-point
//! grid (core/fixed_point.hpp) and only integers are added after that: into
//! a per-unit accumulator of int64 limbs on this rank, and across ranks by
//! integer collectives (an all-reduce or reduce-scatter of the limbs). At the
//! end of the step the limbs become gradients once. Integer sums do not
//! depend on their order, so the gradients are the same bits whatever the
//! world size, strategy, wrapper or split of micro-batches over ranks.
//!
//! Range: each unit's scale comes from the largest addend of the previous
//! step, agreed by a max all-reduce (a max does not depend on order either).
//! An addend beyond the grid, or not finite, makes that unit's gradients NaN
//! for the step, so the optimizer skips the step on every rank, and the
//! scale moves to fit; the same happens at every world size, so determinism
//! survives it. Scales are part of a checkpoint.
//!
//! Cost: 16 bytes per element on the wire and in the accumulator (4 for a
//! float wire), a conversion per micro-batch (which also takes the range),
//! one conversion back per step. None of it on one rank with one micro-batch per step: a
//! single addend is its own exact sum (the engine passes its gradients
//! through; out(u) is empty in finish then).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/comm/trace.hpp"
#include "tessera/core/config.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/fixed_point.hpp"

namespace tessera::detail {

//! dst[2i], dst[2i+1] = (or +=) the limbs of src[i] at scale *s; 0 for an
//! addend that does not fit (the step is skipped then: see exact_sums).
//! Returns |src[i]| (+inf where not finite) for the unit's range, which
//! backend_ops::for_each_max takes in the same pass.
template <class G>
struct to_limbs_fn {
  const G* src;
  std::int64_t* dst;
  const int* scale;
  bool add;
  TESSERA_HOST_DEVICE double operator()(std::size_t i) const {
    const double g = convert<double>(src[i]);
    const int s = *scale;
    std::int64_t hi = 0, lo = 0;
    if (fixed::fits(g, s)) fixed::to_limbs(g, s, hi, lo);
    if (add) {
      dst[fixed::limbs_per_element * i] += hi;
      dst[fixed::limbs_per_element * i + 1] += lo;
    } else {
      dst[fixed::limbs_per_element * i] = hi;
      dst[fixed::limbs_per_element * i + 1] = lo;
    }
    return fixed::magnitude(g);
  }
};
//! dst[i] += src[i] (or = when overwrite), over limbs.
struct add_limbs_fn {
  const std::int64_t* src;
  std::int64_t* dst;
  bool overwrite;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const { dst[i] = overwrite ? src[i] : dst[i] + src[i]; }
};
//! dst[i] = the value of limbs i at scale *s, times post; NaN where the unit's range failed.
template <class G>
struct from_limbs_fn {
  const std::int64_t* src;
  G* dst;
  const int* scale;
  const int* bad;
  double post;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t k = fixed::limbs_per_element * i;
    const double v = *bad ? double(NAN) : fixed::from_limbs(src[k], src[k + 1], *scale) * post;
    dst[i] = convert<G>(v);
  }
};
//! Per unit, after the max of its addends over every rank is known: whether
//! they fitted the scale used, and the scale for the next step.
struct judge_range_fn {
  const double* max;
  const int* scale;
  int* next;
  int* bad;
  TESSERA_HOST_DEVICE void operator()(std::size_t u) const {
    bad[u] = fixed::fits(max[u], scale[u]) ? 0 : 1;
    next[u] = fixed::next_scale(max[u], scale[u]);
  }
};

template <class G, class B>
class exact_sums {
  using ops = backend_ops<B>;
  template <class T> using buffer = typename ops::template buffer<T>;

public:
  //! Bytes for units whose accumulators (and parts, on a mesh under
  //! outer<optim>) hold `elements` gradients in all, and `units` units.
  static constexpr std::size_t bytes(std::size_t elements, std::size_t units) noexcept {
    return elements * fixed::limbs_per_element * sizeof(std::int64_t) + units * (sizeof(double) + 3 * sizeof(int));
  }

  exact_sums() = default;
  //! One accumulator of sizes[u] gradients per unit, and where parts[u] > 0
  //! (outer<optim>) the limbs of this replica's part of the shard.
  exact_sums(const std::vector<std::size_t>& sizes, const std::vector<std::size_t>& parts)
      : max_(sizes.size()), scale_(sizes.size()), next_(sizes.size()), bad_(sizes.size()), fresh_(sizes.size(), true) {
    for (std::size_t n : sizes) acc_.emplace_back(fixed::limbs_per_element * n);
    for (std::size_t n : parts) part_.emplace_back(fixed::limbs_per_element * n);
    ops::fill(scale_.span(), fixed::initial_scale);
    ops::fill(bad_.span(), 0);
    begin();
  }
  [[nodiscard]] std::size_t size() const noexcept { return acc_.size(); }

  //! A new accumulation: nothing added, no maximum seen.
  void begin() {
    ops::fill(max_.span(), 0.0);
    fresh_.assign(fresh_.size(), true);
  }
  //! Rounds one micro-batch's gradients g of unit u onto its grid and adds
  //! them to its accumulator (first elements of it: g.size()).
  void add(std::size_t u, std::span<const G> g) {
    ops::for_each_max(g.size(), to_limbs_fn<G>{g.data(), acc_.at(u).data(), scale_.data() + u, !fresh_[u]},
                      max_.data() + u);
    fresh_[u] = false;
  }
  //! Rounds g onto unit u's grid into `out` (2 g.size() limbs) for a collective.
  void round(std::size_t u, std::span<const G> g, std::int64_t* out) {
    ops::for_each_max(g.size(), to_limbs_fn<G>{g.data(), out, scale_.data() + u, false}, max_.data() + u);
  }
  //! Unit u's accumulator, 2 limbs per gradient.
  [[nodiscard]] std::int64_t* limbs(std::size_t u) { return acc_.at(u).data(); }
  //! Under outer<optim>: the limbs of this replica's part (what the reduce-scatter across replicas writes).
  [[nodiscard]] std::int64_t* part_limbs(std::size_t u) { return part_.at(u).data(); }
  [[nodiscard]] bool has_part(std::size_t u) const { return part_.at(u).size() > 0; }
  //! Whether u's accumulator had nothing yet this step (a reduction landing
  //! there then copies instead of adding); it has from now on.
  [[nodiscard]] bool take_fresh(std::size_t u) {
    const bool f = fresh_.at(u);
    fresh_[u] = false;
    return f;
  }

  //! The step's sums are complete on every rank: agrees on each unit's
  //! largest addend (max_over(x, n): a max over every rank that added to the
  //! sums), judges the range, and writes each unit's gradients through
  //! out(u) (a span of G, from the first limbs of its accumulator, or of its
  //! part where it has one) times `post`. Collective.
  template <class MaxOver, class Out>
  void finish(MaxOver&& max_over, Out&& out, double post) {
    {
      comm::label lbl("exact_range");
      max_over(max_.data(), max_.size());
    }
    ops::for_each(size(), judge_range_fn{max_.data(), scale_.data(), next_.data(), bad_.data()});
    for (std::size_t u = 0; u < size(); ++u) {
      std::span<G> g = out(u);
      const auto& src = has_part(u) ? part_[u] : acc_[u];
      TESSERA_CHECK(fixed::limbs_per_element * g.size() <= src.size(), "exact_sums: unit ", u, " has ",
                    src.size() / fixed::limbs_per_element,
                    " summed gradients, ", g.size(), " requested");
      ops::for_each(g.size(), from_limbs_fn<G>{src.data(), g.data(), scale_.data() + u, bad_.data() + u, post});
    }
    ops::copy(scale_.span(), std::span<const int>(next_.span()));
  }

  //! Every unit's scale (host copy; waits for the device).
  [[nodiscard]] std::vector<int> scales() const {
    std::vector<int> s(size());
    ops::copy_to_host(std::span<int>(s), std::span<const int>(scale_.span()));
    return s;
  }
  void set_scales(std::span<const int> s) {
    TESSERA_CHECK(s.size() == size(), "exact scales for ", s.size(), " units, the model has ", size());
    for (int v : s)
      TESSERA_CHECK(v >= fixed::min_scale && v <= fixed::max_scale, "exact scale ", v, " out of range [",
                    fixed::min_scale, ", ", fixed::max_scale, "]");
    ops::copy_from_host(scale_.span(), s);
  }

private:
  std::vector<buffer<std::int64_t>> acc_, part_;  // per unit: the accumulator; this replica's part (outer<optim>)
  buffer<double> max_;      // per unit: the largest |addend| this step (this rank, then all)
  buffer<int> scale_, next_, bad_;
  std::vector<bool> fresh_;
};

}  // namespace tessera::detail
