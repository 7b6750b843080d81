#pragma once
// What the reference models' nets share: the tanh GELU and its derivative
// (host and device), an fp32 view of a unit's compute weights, and the count of
// the buffers that view needs.
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
TESSERA_HOST_DEVICE inline float gelu_grad(float x) {
  const float k = 0.7978845608028654f;
  const float t = tanhf(k * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * x * x);
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

}  // namespace trainer_kit
