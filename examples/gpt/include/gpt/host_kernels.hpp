#pragma once
// GPT-2's layers on the host in fp32, forward and backward, as plain loops
// over row-major arrays (the GEMMs go through CBLAS in host_compute.hpp).
// The reference the CUDA kernels and the numpy forward are held to; written
// for clarity, not speed (the host backend trains the small models of tests).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

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

//! Causal self-attention of B sequences of T tokens, H heads of hd: qkv rows
//! are [q | k | v] (3 H hd wide), y rows H hd. lse (B T H) keeps each row's
//! log-sum-exp, so backward recomputes the probabilities instead of storing
//! the T x T matrix.
inline void attention(const float* qkv, float* y, float* lse, std::size_t B, std::size_t T, std::size_t H,
                      std::size_t hd, float* scratch /* T */) {
  const std::size_t d = H * hd, row = 3 * d;
  const float scale = float(1.0 / std::sqrt(double(hd)));
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i) {
        const float* q = qkv + (b * T + i) * row + h * hd;
        float mx = -INFINITY;
        for (std::size_t j = 0; j <= i; ++j) {
          const float* k = qkv + (b * T + j) * row + d + h * hd;
          float s = 0;
          for (std::size_t c = 0; c < hd; ++c) s += q[c] * k[c];
          scratch[j] = s * scale;
          mx = std::max(mx, scratch[j]);
        }
        double sum = 0;
        for (std::size_t j = 0; j <= i; ++j) sum += std::exp(double(scratch[j] - mx));
        const float l = mx + float(std::log(sum));
        lse[(b * T + i) * H + h] = l;
        float* out = y + (b * T + i) * d + h * hd;
        std::fill_n(out, hd, 0.0f);
        for (std::size_t j = 0; j <= i; ++j) {
          const float p = std::exp(scratch[j] - l);
          const float* v = qkv + (b * T + j) * row + 2 * d + h * hd;
          for (std::size_t c = 0; c < hd; ++c) out[c] += p * v[c];
        }
      }
}

//! dqkv (assigned) from dy, given the forward's qkv, y and lse.
inline void attention_backward(const float* dy, const float* qkv, const float* y, const float* lse, float* dqkv,
                               std::size_t B, std::size_t T, std::size_t H, std::size_t hd) {
  const std::size_t d = H * hd, row = 3 * d;
  const float scale = float(1.0 / std::sqrt(double(hd)));
  std::fill_n(dqkv, B * T * row, 0.0f);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i) {
        const float* q = qkv + (b * T + i) * row + h * hd;
        const float* g = dy + (b * T + i) * d + h * hd;
        const float* o = y + (b * T + i) * d + h * hd;
        float D = 0;
        for (std::size_t c = 0; c < hd; ++c) D += g[c] * o[c];
        const float l = lse[(b * T + i) * H + h];
        float* dq = dqkv + (b * T + i) * row + h * hd;
        for (std::size_t j = 0; j <= i; ++j) {
          const float* k = qkv + (b * T + j) * row + d + h * hd;
          const float* v = qkv + (b * T + j) * row + 2 * d + h * hd;
          float s = 0, dp = 0;
          for (std::size_t c = 0; c < hd; ++c) s += q[c] * k[c], dp += g[c] * v[c];
          const float p = std::exp(s * scale - l);
          const float ds = p * (dp - D) * scale;
          float* dk = dqkv + (b * T + j) * row + d + h * hd;
          float* dv = dqkv + (b * T + j) * row + 2 * d + h * hd;
          for (std::size_t c = 0; c < hd; ++c) {
            dq[c] += ds * k[c];
            dk[c] += ds * q[c];
            dv[c] += p * g[c];
          }
        }
      }
}

//! Softmax cross-entropy of `rows` rows of V logits against targets, in place:
//! z becomes dloss/dz x scale. Returns the summed loss (double).
inline double cross_entropy(float* z, const std::uint16_t* targets, std::size_t rows, std::size_t V, float scale) {
  double loss = 0;
  for (std::size_t i = 0; i < rows; ++i) {
    float* r = z + i * V;
    const float mx = *std::max_element(r, r + V);
    double sum = 0;
    for (std::size_t c = 0; c < V; ++c) sum += std::exp(double(r[c] - mx));
    loss += std::log(sum) + mx - r[targets[i]];
    for (std::size_t c = 0; c < V; ++c) r[c] = float(std::exp(double(r[c] - mx)) / sum) * scale;
    r[targets[i]] -= scale;
  }
  return loss;
}

//! Summed loss only (evaluation).
inline double cross_entropy_loss(const float* z, const std::uint16_t* targets, std::size_t rows, std::size_t V) {
  double loss = 0;
  for (std::size_t i = 0; i < rows; ++i) {
    const float* r = z + i * V;
    const float mx = *std::max_element(r, r + V);
    double sum = 0;
    for (std::size_t c = 0; c < V; ++c) sum += std::exp(double(r[c] - mx));
    loss += std::log(sum) + mx - r[targets[i]];
  }
  return loss;
}

}  // namespace gpt::host
