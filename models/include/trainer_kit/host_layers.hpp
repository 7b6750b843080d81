#pragma once
// The reference models' layers on the host in fp32, forward and backward, as
// plain loops over row-major arrays: causal attention with grouped kv heads
// (GPT-2: as many kv heads as heads), rotary position embeddings
// (rotate-half), RMSNorm, SwiGLU and the softmax cross-entropy. The reference
// the CUDA kernels and the numpy forwards are held to; written for clarity,
// not speed (the host backend trains the small models of tests). The GEMMs
// around them go through CBLAS in each model's net.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "trainer_kit/host_math.hpp"

namespace trainer_kit::host {

//! Where a packed row of q, k and v keeps each part: H heads of q, then KV
//! heads of k, then KV of v, each hd wide; q head h reads kv head h / (H / KV).
struct qkv_layout {
  std::size_t H, KV, hd;
  [[nodiscard]] std::size_t row() const { return (H + 2 * KV) * hd; }
  [[nodiscard]] std::size_t q(std::size_t h) const { return h * hd; }
  [[nodiscard]] std::size_t k(std::size_t h) const { return H * hd + (h / (H / KV)) * hd; }
  [[nodiscard]] std::size_t v(std::size_t h) const { return (H + KV) * hd + (h / (H / KV)) * hd; }
};

//! Causal self-attention of B sequences of T tokens: y rows H hd wide. lse (B
//! T H) keeps each row's log-sum-exp, so backward recomputes the
//! probabilities instead of storing the T x T matrix.
inline void attention(const float* qkv, float* y, float* lse, std::size_t B, std::size_t T, const qkv_layout& L,
                      float* scratch /* T */) {
  const std::size_t H = L.H, hd = L.hd, row = L.row(), d = H * hd;
  const float scale = float(1.0 / std::sqrt(double(hd)));
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i) {
        const float* q = qkv + (b * T + i) * row + L.q(h);
        float mx = -INFINITY;
        for (std::size_t j = 0; j <= i; ++j) {
          const float* k = qkv + (b * T + j) * row + L.k(h);
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
          const float* v = qkv + (b * T + j) * row + L.v(h);
          for (std::size_t c = 0; c < hd; ++c) out[c] += p * v[c];
        }
      }
}

//! dqkv (assigned) from dy, given the forward's qkv, y and lse; a kv head's
//! gradient sums over the q heads that read it.
inline void attention_backward(const float* dy, const float* qkv, const float* y, const float* lse, float* dqkv,
                               std::size_t B, std::size_t T, const qkv_layout& L) {
  const std::size_t H = L.H, hd = L.hd, row = L.row(), d = H * hd;
  const float scale = float(1.0 / std::sqrt(double(hd)));
  std::fill_n(dqkv, B * T * row, 0.0f);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i) {
        const float* q = qkv + (b * T + i) * row + L.q(h);
        const float* g = dy + (b * T + i) * d + h * hd;
        const float* o = y + (b * T + i) * d + h * hd;
        float D = 0;
        for (std::size_t c = 0; c < hd; ++c) D += g[c] * o[c];
        const float l = lse[(b * T + i) * H + h];
        float* dq = dqkv + (b * T + i) * row + L.q(h);
        for (std::size_t j = 0; j <= i; ++j) {
          const float* k = qkv + (b * T + j) * row + L.k(h);
          const float* v = qkv + (b * T + j) * row + L.v(h);
          float s = 0, dp = 0;
          for (std::size_t c = 0; c < hd; ++c) s += q[c] * k[c], dp += g[c] * v[c];
          const float p = std::exp(s * scale - l);
          const float ds = p * (dp - D) * scale;
          float* dk = dqkv + (b * T + j) * row + L.k(h);
          float* dv = dqkv + (b * T + j) * row + L.v(h);
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
template <class Target>
double cross_entropy(float* z, const Target* targets, std::size_t rows, std::size_t V, float scale) {
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
template <class Target>
double cross_entropy_loss(const float* z, const Target* targets, std::size_t rows, std::size_t V) {
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

//! RMSNorm: out = w (x rsqrt(mean(x^2) + eps)) per row of d (statistics in
//! double, rstd kept for backward), as transformers' LlamaRMSNorm computes it.
inline void rmsnorm(const float* x, const float* w, float* out, float* rstd, std::size_t n, std::size_t d, float eps) {
  for (std::size_t i = 0; i < n; ++i) {
    const float* r = x + i * d;
    double s2 = 0;
    for (std::size_t c = 0; c < d; ++c) s2 += double(r[c]) * r[c];
    const float rs = float(1.0 / std::sqrt(s2 / double(d) + double(eps)));
    rstd[i] = rs;
    for (std::size_t c = 0; c < d; ++c) out[i * d + c] = w[c] * (r[c] * rs);
  }
}

//! dx += RMSNorm backward of dout; dw accumulates.
inline void rmsnorm_backward(const float* dout, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                             std::size_t n, std::size_t d) {
  for (std::size_t i = 0; i < n; ++i) {
    const float* g = dout + i * d;
    const float* r = x + i * d;
    const float rs = rstd[i];
    double m = 0;  // mean of (g w) xhat
    for (std::size_t c = 0; c < d; ++c) {
      const float xh = r[c] * rs;
      m += double(g[c] * w[c]) * xh;
      dw[c] += g[c] * xh;
    }
    m /= double(d);
    for (std::size_t c = 0; c < d; ++c) dx[i * d + c] += rs * (g[c] * w[c] - r[c] * rs * float(m));
  }
}

//! Rotary position embedding in place on `heads` heads of hd in each of n
//! rows (row stride `stride`, the heads from `first` on), row i at position
//! i % T: the rotate-half convention, x1 and x2 the two halves of a head,
//! x1 cos - x2 sin and x2 cos + x1 sin; cos, sin [T, hd / 2]. `inverse`
//! rotates back (the backward: R^T).
inline void rope(float* x, std::size_t n, std::size_t T, std::size_t stride, std::size_t first, std::size_t heads,
                 std::size_t hd, const float* cos, const float* sin, bool inverse = false) {
  const std::size_t half = hd / 2;
  for (std::size_t i = 0; i < n; ++i) {
    const float* c = cos + (i % T) * half;
    const float* s = sin + (i % T) * half;
    for (std::size_t h = 0; h < heads; ++h) {
      float* v = x + i * stride + first + h * hd;
      for (std::size_t k = 0; k < half; ++k) {
        const float x1 = v[k], x2 = v[k + half], sn = inverse ? -s[k] : s[k];
        v[k] = x1 * c[k] - x2 * sn;
        v[k + half] = x2 * c[k] + x1 * sn;
      }
    }
  }
}

//! SwiGLU over n rows of [gate | up] (2 f wide): a = silu(gate) up, rows f wide.
inline void swiglu(const float* gu, float* a, std::size_t n, std::size_t f) {
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = 0; c < f; ++c) a[i * f + c] = silu(gu[i * 2 * f + c]) * gu[i * 2 * f + f + c];
}
//! Its backward: dgu (rows of [dgate | dup]) from da.
inline void swiglu_backward(const float* da, const float* gu, float* dgu, std::size_t n, std::size_t f) {
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = 0; c < f; ++c) {
      const float g = gu[i * 2 * f + c], u = gu[i * 2 * f + f + c], dy = da[i * f + c];
      dgu[i * 2 * f + c] = dy * u * silu_grad(g);
      dgu[i * 2 * f + f + c] = dy * silu(g);
    }
}

}  // namespace trainer_kit::host
