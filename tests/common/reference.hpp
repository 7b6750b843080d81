#pragma once
// The float64 references the kernel tests hold the models' functions to, one
// definition each: the tanh GELU and its derivative, SiLU and its derivative.
#include <cmath>

namespace tessera_test {

inline double gelu64(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
inline double gelu_grad64(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}
inline double silu64(double x) { return x / (1 + std::exp(-x)); }
inline double silu_grad64(double x) {
  const double s = 1 / (1 + std::exp(-x));
  return s * (1 + x * (1 - s));
}

}  // namespace tessera_test
