#pragma once
// GPT-2's layers on the host in fp32, forward and backward, as plain loops
// over row-major arrays (the GEMMs go through CBLAS in host_compute.hpp): its
// LayerNorm here, attention and the loss from the kit (host_layers.hpp).
// The reference the CUDA kernels and the numpy forward are held to; written
// for clarity, not speed (the host backend trains the small models of tests).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "trainer_kit/host_layers.hpp"
#include "trainer_kit/host_math.hpp"

namespace gpt::host {

inline constexpr float ln_eps = 1e-5f;

using trainer_kit::gelu;
using trainer_kit::gelu_grad;

//! out = (x - mean) * rstd * w + b per row of d; mean and rstd kept for backward.
inline void layernorm(const float* x, const float* w, const float* b, float* out, float* mean, float* rstd,
                      std::size_t n, std::size_t d) {
  for (std::size_t i = 0; i < n; ++i) {
    const float* r = x + i * d;
    double s = 0, s2 = 0;
    for (std::size_t c = 0; c < d; ++c) s += r[c];
    const double mu = s / double(d);
    for (std::size_t c = 0; c < d; ++c) s2 += (r[c] - mu) * (r[c] - mu);
    const float rs = float(1.0 / std::sqrt(s2 / double(d) + double(ln_eps)));
    mean[i] = float(mu), rstd[i] = rs;
    for (std::size_t c = 0; c < d; ++c) out[i * d + c] = (r[c] - float(mu)) * rs * w[c] + b[c];
  }
}

//! dx += LayerNorm backward of dout; dw, db accumulate.
inline void layernorm_backward(const float* dout, const float* x, const float* w, const float* mean,
                               const float* rstd, float* dx, float* dw, float* db, std::size_t n, std::size_t d) {
  for (std::size_t i = 0; i < n; ++i) {
    const float* g = dout + i * d;
    const float* r = x + i * d;
    double m1 = 0, m2 = 0;  // means of dxhat and dxhat * xhat
    for (std::size_t c = 0; c < d; ++c) {
      const float xh = (r[c] - mean[i]) * rstd[i];
      const float dxh = g[c] * w[c];
      m1 += dxh, m2 += double(dxh) * xh;
      dw[c] += g[c] * xh;
      db[c] += g[c];
    }
    m1 /= double(d), m2 /= double(d);
    for (std::size_t c = 0; c < d; ++c) {
      const float xh = (r[c] - mean[i]) * rstd[i];
      dx[i * d + c] += rstd[i] * (g[c] * w[c] - float(m1) - xh * float(m2));
    }
  }
}

// Attention and the cross-entropy are every model's (trainer_kit/host_layers.hpp).
using trainer_kit::host::attention;
using trainer_kit::host::attention_backward;
using trainer_kit::host::cross_entropy;
using trainer_kit::host::cross_entropy_loss;
using qkv_layout = trainer_kit::host::qkv_layout;

}  // namespace gpt::host
