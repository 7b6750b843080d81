#pragma once
// What the reference models' nets share: their activations (the tanh GELU,
// SiLU) and derivatives, host and device, one definition each; an fp32 view
// of a unit's compute weights, and the count of the buffers that view needs
// (widened_units: a sequence model's embed unit and widest block).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>

#include "tessera/core/config.hpp"

namespace trainer_kit {

TESSERA_HOST_DEVICE inline float gelu(float x) {
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
//! The same GELU as x sigmoid(2u) = x / (1 + e^-2u), u = sqrt(2/pi) (x +
//! 0.044715 x^3): a few instructions instead of tanhf's many, a few fp32 ulps
//! from gelu(); what the kernels use for outputs rounded to 16 bits
//! (kernels/elementwise.cuh), where the difference does not survive the rounding.
TESSERA_HOST_DEVICE inline float gelu_fast(float x) {
  const float u = 0.7978845608028654f * fmaf(0.044715f * x, x * x, x);
#if defined(__CUDA_ARCH__)
  return x / (1.0f + __expf(-2.0f * u));
#else
  return x / (1.0f + std::exp(-2.0f * u));
#endif
}
TESSERA_HOST_DEVICE inline float gelu_grad(float x) {
  const float k = 0.7978845608028654f;
  const float t = tanhf(k * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x * x);
}

//! SiLU (swish): x sigmoid(x), and its derivative; SwiGLU is silu(gate) up.
TESSERA_HOST_DEVICE inline float silu(float x) { return x / (1.0f + expf(-x)); }
TESSERA_HOST_DEVICE inline float silu_grad(float x) {
  const float s = 1.0f / (1.0f + expf(-x));
  return s * (1.0f + x * (1.0f - s));
}

//! fp32 view of compute weights: the weights themselves, or their copy widened into `wide`.
template <class C>
const float* widen(std::span<const C> w, float* wide) {
  if constexpr (std::is_same_v<C, float>) {
    return w.data();
  } else {
    for (std::size_t i = 0; i < w.size(); ++i) wide[i] = float(w[i]);
    return wide;
  }
}

//! Bytes of the fp32 buffers a net widens bf16 units into (a host net's
//! Net::widened_floats; 0 for a net that has none, as the CUDA nets). The
//! trainers pass the wrapper's layouts as `padded_numel` (unit_id -> padded
//! numel), tessera-plan the plan's: both count what the net allocates.
template <class Net, class Ids, class F>
std::size_t widened_bytes(const Ids& ids, F&& padded_numel) {
  if constexpr (requires { Net::widened_floats(ids, padded_numel); })
    return sizeof(float) * Net::widened_floats(ids, padded_numel);
  else
    return 0;
}

//! A sequence model's fp32 views of its bf16 units on the host: one buffer
//! for the embed unit (held for a whole micro-batch: lookup, head, embedding
//! backward) and one for the widest block (one block at a time); none in fp32.
//! `Buffer` is tessera::host::buffer<float> (this header is also the
//! device's, so it does not name it). floats() is what the constructor
//! allocates, from the layouts `padded_numel` gives: the wrapper's in the
//! trainer, the plan's in tessera-plan, so both count the same.
template <class C, class Buffer>
class widened_units {
public:
  template <class Ids, class F>
  [[nodiscard]] static std::size_t floats(const Ids& ids, F&& padded_numel) {
    if constexpr (std::is_same_v<C, float>) return 0;
    return padded_numel(ids.embed) + widest_block(ids, padded_numel);
  }
  widened_units() = default;
  template <class Ids, class F>
  widened_units(const Ids& ids, F&& padded_numel) {
    if constexpr (!std::is_same_v<C, float>)
      embed_ = Buffer(padded_numel(ids.embed)), block_ = Buffer(widest_block(ids, padded_numel));
  }
  const float* embed(std::span<const C> w) { return widen(w, embed_.data()); }
  const float* block(std::span<const C> w) { return widen(w, block_.data()); }

private:
  template <class Ids, class F>
  static std::size_t widest_block(const Ids& ids, F&& padded_numel) {
    std::size_t widest = 0;
    for (const auto& b : ids.blocks) widest = std::max(widest, std::size_t(padded_numel(b.unit)));
    return widest;
  }
  Buffer embed_, block_;
};

}  // namespace trainer_kit
