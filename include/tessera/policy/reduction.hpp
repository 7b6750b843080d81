#pragma once
//! \file How sums whose grouping depends on the world size, the strategy or
//! the micro-batch split are computed: gradient accumulation across
//! micro-batches, the cross-rank reduction and the global norm's sum of
//! squares.
#include <string_view>

namespace tessera {

//! Floating-point sums in whatever order the collective and the accumulation
//! take: fastest, and equal across world sizes only within rounding.
struct float_reduction {
  using tessera_reduction = void;
  static constexpr std::string_view name = "float";
  static constexpr bool exact = false;
};

//! Order-independent sums: every addend is rounded once onto a fixed-point
//! grid (two int64 limbs per element, a per-unit exponent every rank agrees
//! on) and integers are summed, which no grouping changes. The same gradient
//! bits, norm and weights at any world size, strategy and wrapper for the
//! same micro-batches (wrapper/detail/exact_sum.hpp says how and what it
//! costs). Gradients outside the grid's range skip the step on every rank
//! and the range adapts; nothing is lost silently.
struct exact_reduction {
  using tessera_reduction = void;
  static constexpr std::string_view name = "exact";
  static constexpr bool exact = true;
};

//! A tessera reduction policy.
template <class R>
concept reduction_policy = requires { typename R::tessera_reduction; };

}  // namespace tessera
