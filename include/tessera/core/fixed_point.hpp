#pragma once
//! \file The fixed-point arithmetic of exact_reduction (policy/reduction.hpp),
//! shared by both backends' kernels and functors.
//!
//! Gradients: an addend g of a unit with scale s becomes the integer
//! q = rint(g * 2^s), kept as two int64 limbs, hi = floor(q / 2^32) and
//! lo = q - hi * 2^32 in [0, 2^32), so that adding limbs never carries
//! between them: with |q| < 2^74 per addend and at most 2^20 addends (ranks x
//! micro-batches), every sum of hi stays below 2^62 and of lo below 2^52.
//! Integer sums are exact, so no order of addition changes them. The value
//! is (hi * 2^32 + lo) * 2^-s once, at the end. The scale of a unit comes
//! from the largest addend of the step before, margin_bits below the limit
//! (gradients may grow 65536-fold in one step): the grid then resolves
//! 2^-58 of that maximum, 2^34 times finer than a float's rounding of it (a
//! float32 sum of K addends errs by ~K * 2^-24).
//!
//! Norms: a square g^2 (exact in double for float and bf16 g) of a vector
//! whose largest |g| is below 2^e becomes floor(g^2 * 2^(61 - 2e)) < 2^61,
//! added in three 21-bit limbs of uint64; carry() brings the low two below
//! 2^21 so that a sum over ranks cannot overflow either.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <math.h>

#include "tessera/core/config.hpp"

namespace tessera::fixed {

inline constexpr int addend_bits = 74;   //!< |q| < 2^74 for one addend
inline constexpr int headroom_bits = 20; //!< at most 2^20 addends (ranks x micro-batches) per sum
inline constexpr int margin_bits = 16;   //!< the last step's largest addend sits 2^16 below the limit
inline constexpr int initial_scale = 58; //!< before a unit's first step: |g| < 2^16 fits
inline constexpr int min_scale = -1000, max_scale = 1000;
inline constexpr int square_bits = 61;   //!< g^2 * 2^t < 2^61 for the largest g
inline constexpr std::uint64_t limb21 = (std::uint64_t(1) << 21) - 1;
inline constexpr std::size_t limbs_per_element = 2;  //!< a gradient's (hi, lo) int64 limbs
inline constexpr std::size_t norm_limbs = 3;         //!< a sum of squares' 21-bit uint64 limbs

//! e with m < 2^e, for finite m > 0 (m = f * 2^e, f in [0.5, 1)).
TESSERA_HOST_DEVICE inline int top_exponent(double m) {
  int e = 0;
  (void)::frexp(m, &e);
  return e;
}
//! Whether a magnitude (or a max of them) is usable: false for inf and NaN,
//! and for the last sliver below DBL_MAX, where a square or a carry overflows.
TESSERA_HOST_DEVICE inline bool finite_magnitude(double m) { return m < 1.0e308; }
//! |g|, and +inf where g is not finite (a max over magnitudes then says so).
TESSERA_HOST_DEVICE inline double magnitude(double g) {
  const double a = ::fabs(g);
  return finite_magnitude(a) ? a : double(INFINITY);
}
//! Whether every addend of magnitude up to m fits scale s (false for NaN and inf).
TESSERA_HOST_DEVICE inline bool fits(double m, int s) { return ::fabs(::ldexp(m, s)) < 0x1p74; }
//! The scale for a unit whose largest addend was m (keeps s where m says nothing: zero or not finite).
TESSERA_HOST_DEVICE inline int next_scale(double m, int s) {
  if (!(m > 0) || !finite_magnitude(m)) return s;
  const int n = addend_bits - margin_bits - top_exponent(m);
  return n < min_scale ? min_scale : n > max_scale ? max_scale : n;
}
//! g rounded onto scale s's grid as limbs; g must fit (callers pass 0 otherwise).
TESSERA_HOST_DEVICE inline void to_limbs(double g, int s, std::int64_t& hi, std::int64_t& lo) {
  const double x = ::rint(::ldexp(g, s));
  const double h = ::floor(::ldexp(x, -32));
  hi = std::int64_t(h);
  lo = std::int64_t(x - ::ldexp(h, 32));  // exact: an integer below 2^32
}
//! The value of summed limbs at scale s.
TESSERA_HOST_DEVICE inline double from_limbs(std::int64_t hi, std::int64_t lo, int s) {
  return ::ldexp(::ldexp(double(hi), 32) + double(lo), -s);
}

//! The shift of the squares of a vector whose largest |g| is m (finite, > 0).
TESSERA_HOST_DEVICE inline int square_shift(double m) { return square_bits - 2 * top_exponent(m); }
//! Adds g^2 * 2^t, truncated, to three 21-bit limbs.
static_assert(norm_limbs == 3, "add_square, carry and square_sum work on three 21-bit limbs");
TESSERA_HOST_DEVICE inline void add_square(double g, int t, std::uint64_t* l) {
  const std::uint64_t v = std::uint64_t(::floor(::ldexp(g * g, t)));
  l[0] += v & limb21;
  l[1] += (v >> 21) & limb21;
  l[2] += v >> 42;
}
//! Moves carries up so that l[0] and l[1] are below 2^21.
TESSERA_HOST_DEVICE inline void carry(std::uint64_t* l) {
  l[1] += l[0] >> 21;
  l[0] &= limb21;
  l[2] += l[1] >> 21;
  l[1] &= limb21;
}
//! The sum of squares the limbs hold at shift t.
TESSERA_HOST_DEVICE inline double square_sum(const std::uint64_t* l, int t) {
  return ::ldexp(double(l[0]) + ::ldexp(double(l[1]), 21) + ::ldexp(double(l[2]), 42), -t);
}

}  // namespace tessera::fixed
