#pragma once
//! \file Per-tensor fp8 scaling: which scale a tensor is cast with, under the
//! two recipes of the anchors (Transformer Engine, torchao).
//!
//! A tensor x is stored as fp8(x * scale) and read back as fp8 * (1 / scale);
//! the scale maps the tensor's largest magnitude (its amax) onto the format's
//! largest finite value, 2^-margin below it. `current` takes the amax of the
//! values being cast (one reduction before the cast); `delayed` takes the
//! largest amax of the last `history` casts, so the cast can run in the kernel
//! that produces the values, and records this cast's amax for the next ones.
//! The first delayed cast has no history and uses its own amax.
//!
//! Everything here is a pure function of its arguments in float arithmetic
//! (one IEEE division, one exact power-of-two scaling), so the host backend and
//! the device compute the same scale bit for bit.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tessera/core/error.hpp"
#include "tessera/core/fp8.hpp"

namespace tessera::fp8 {

enum class recipe : std::uint8_t { current, delayed };

[[nodiscard]] constexpr std::string_view name_of(recipe r) noexcept {
  return r == recipe::current ? "current" : "delayed";
}
//! The recipe a flag names ("current" or "delayed"); anything else is a tessera: error.
[[nodiscard]] inline recipe parse_recipe(std::string_view s) {
  if (s == "current") return recipe::current;
  if (s == "delayed") return recipe::delayed;
  detail::fail(detail::concat("fp8 recipe '", s, "' is neither 'current' nor 'delayed'"));
}

//! How one tensor's scale is chosen.
struct scaling {
  recipe kind = recipe::current;
  int history = 16;  //!< delayed: how many past amaxes the scale looks at (Transformer Engine's default is 1024; 16 follows torchao's)
  int margin = 0;    //!< the amax maps to max * 2^-margin

  void check() const {
    TESSERA_CHECK(history >= 1 && history <= 4096, "fp8 amax history of ", history,
                  " casts; give 1 to 4096");
    TESSERA_CHECK(margin >= 0 && margin <= 16, "fp8 scale margin of ", margin, "; give 0 to 16");
  }
};

//! The scale that maps `amax` onto F's largest value 2^-margin below it. An
//! amax that is zero, not finite, or so small that the scale overflows keeps
//! `previous`: a tensor of zeros casts exactly with any scale, and a step whose
//! values overflowed must not leave a scale of zero or infinity behind.
template <fp8_format F>
TESSERA_HOST_DEVICE inline float scale_for(float amax, float previous, int margin = 0) noexcept {
  constexpr float inf = __builtin_huge_valf();
  if (!(amax > 0.0f) || !(amax < inf)) return previous;  // NaN fails both
  float s = F::max / amax;
  for (int i = 0; i < margin; ++i) s *= 0.5f;  // exact: a power of two
  return (s < inf && s > 0.0f) ? s : previous;
}

//! The amax a delayed cast at step `step` (0-based) takes from its history
//! (`len` slots, slot step % len written after each cast): the largest recorded
//! one, or `current` at step 0 when nothing is recorded yet.
TESSERA_HOST_DEVICE inline float delayed_amax(const float* history, int len, std::size_t step, float current) noexcept {
  if (step == 0) return current;
  const std::size_t filled = step < std::size_t(len) ? step : std::size_t(len);
  float m = 0.0f;
  for (std::size_t i = 0; i < filled; ++i) m = history[i] > m ? history[i] : m;
  return m;
}

//! One tensor's scale update as a one-element functor (backend_ops::for_each(1,
//! ...)), so it runs where the amax is, host or device: `scale` = [the scale,
//! its inverse] from the amax at `amax` under the recipe (delayed: from
//! `history`, `len` slots, at cast number `step`, recording this amax).
template <fp8_format F, class Amax>
struct scale_update {
  const Amax* amax;
  float* scale;
  float* history;
  int len;
  std::size_t step;
  recipe kind;
  int margin;
  TESSERA_HOST_DEVICE void operator()(std::size_t) const {
    const float a = float(*amax);
    const float use = kind == recipe::delayed ? delayed_amax(history, len, step, a) : a;
    const float s = scale_for<F>(use, scale[0], margin);
    scale[0] = s;
    scale[1] = 1.0f / s;
    if (kind == recipe::delayed) history[step % std::size_t(len)] = a;
  }
};

//! x * scale cast to F: what every fp8 cast in the library computes.
template <fp8_format F, class T>
TESSERA_HOST_DEVICE inline F cast(T x, float scale) noexcept {
  return F(convert<float>(x) * scale);
}

}  // namespace tessera::fp8
