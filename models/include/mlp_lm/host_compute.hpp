#pragma once
// Forward and backward of the MLP language model on the host: CBLAS GEMMs in
// fp32 (bf16 compute weights are widened to fp32 per unit), plain loops for
// embedding, GELU, residual and softmax cross-entropy.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mlp_lm/model.hpp"
#include "tessera/backend/host/blas.hpp"
#include "tessera/backend/host/buffer.hpp"
#include "tessera/core/dtype.hpp"
#include "trainer_kit/buffers.hpp"
#include "trainer_kit/host_math.hpp"

namespace mlp_lm {

using trainer_kit::gelu;
using trainer_kit::gelu_grad;

//! The buffers host_mlp holds for micro-batches of up to n tokens, as one
//! list (trainer_kit/buffers.hpp): what its constructor allocates and what
//! the estimate counts. Every block's stream and GELU input, one block's GELU
//! output and its gradient, dx, the logits.
struct host_buffers {
  trainer_kit::buffer_list list;
  trainer_kit::buffer_slot<float> x, h, a, da, dx, logits;
  host_buffers(const model_shape& s, std::size_t n) {
    const std::size_t D = std::size_t(s.d), H = std::size_t(s.hidden());
    x = list.add<float>("residual stream", std::size_t(s.layers + 1) * n * D);
    h = list.add<float>("GELU inputs", std::size_t(s.layers) * n * H);
    a = list.add<float>("GELU output", n * H);
    da = list.add<float>("dA", n * H);
    dx = list.add<float>("dx", n * D);
    logits = list.add<float>("logits", n * vocab);
  }
};

//! Activations and scratch for up to `max_tokens` tokens, in library-counted host buffers.
template <class Wrapper>
class host_mlp {
  using C = typename Wrapper::compute_type;
  using G = typename Wrapper::grad_type;
  static_assert(std::is_same_v<G, float>, "the host trainer accumulates fp32 gradients");
  template <class T> using buf = tessera::host::buffer<T>;

public:
  static constexpr const char* backend_name = "host";

  host_mlp(Wrapper& m, const model_ids& ids, const model_shape& s, std::size_t max_tokens, net_options = {})  // recomputes GELU outputs always
      : m_(m), ids_(ids), s_(s), n_max_(max_tokens) {
    const host_buffers b(s, max_tokens);  // the list the estimate counts
    block_ = trainer_kit::buffer_block<tessera::host::buffer>(b.list);
    x_ = block_[b.x], h_ = block_[b.h], a_ = block_[b.a], da_ = block_[b.da], dx_ = block_[b.dx];
    logits_ = block_[b.logits];
    wide_ = buf<float>(widened_floats(ids, [&](tessera::unit_id u) { return m.layout(u).padded_numel(); }));  // none in fp32
  }

  [[nodiscard]] static constexpr bool fused() noexcept { return false; }
  [[nodiscard]] static std::string fusion() { return {}; }
  [[nodiscard]] static std::string choices() { return {}; }
  static void force_fusion(bool) {}
  //! The host backend's BLAS holds no workspace of the library's.
  [[nodiscard]] static constexpr std::size_t blas_workspace_bytes() { return 0; }
  //! Host bytes this class holds (activations and scratch), for the memory estimate.
  [[nodiscard]] static std::size_t workspace_bytes(const model_shape& s, std::size_t n, net_options = {}) {
    return host_buffers(s, n).list.bytes();
  }
  //! Floats of the fp32 copy bf16 compute weights are widened into, one unit
  //! at a time: the widest unit's padded numel (0 in fp32). `padded_numel`
  //! maps a unit_id to its layout's: the wrapper's in the trainer, the plan's
  //! in tessera-plan, so both count what the constructor allocates.
  template <class F>
  [[nodiscard]] static std::size_t widened_floats(const model_ids& ids, F&& padded_numel) {
    if constexpr (std::is_same_v<C, float>) return 0;
    std::size_t w = std::max(padded_numel(ids.embed), padded_numel(ids.head));
    for (const auto& b : ids.blocks) w = std::max(w, padded_numel(b.unit));
    return w;
  }

  //! One micro-batch: forward, loss, backward with gradients accumulated into the
  //! wrapper (scaled by 1 / global_tokens), each unit's reduction started as soon
  //! as its gradients are complete. The summed cross-entropy of these tokens
  //! accumulates until finish_loss().
  void forward_backward(const std::uint8_t* ctx, const std::uint8_t* target, std::size_t n, double global_tokens) {
    TESSERA_CHECK(n <= n_max_, "micro-batch of ", n, " tokens over the planned ", n_max_);
    const int d = s_.d, e = s_.e(), hd = s_.hidden(), L = s_.layers;
    const auto D = std::size_t(d), H = std::size_t(hd);
    float* X = x_.data();
    // ---- forward ----
    {
      auto sc = m_.gather(ids_.embed);
      const float* E = widen(sc.weight(ids_.table));
      for (std::size_t j = 0; j < n; ++j)
        for (int k = 0; k < s_.ctx; ++k)
          std::copy_n(E + std::size_t(ctx[j * std::size_t(s_.ctx) + std::size_t(k)]) * std::size_t(e), e,
                      X + j * D + std::size_t(k * e));
    }
    for (int l = 0; l < L; ++l) {
      auto sc = m_.gather(ids_.blocks[std::size_t(l)].unit);
      const auto& b = ids_.blocks[std::size_t(l)];
      const float* xin = X + std::size_t(l) * n_max_ * D;
      float* xout = X + std::size_t(l + 1) * n_max_ * D;
      float* Hl = h_.data() + std::size_t(l) * n_max_ * H;
      const float* w = widen(sc.weights());
      const auto off = [&](tessera::param_id p) { return m_.slot(p).offset; };
      const float *W1 = w + off(b.w1), *B1 = w + off(b.b1), *W2 = w + off(b.w2), *B2 = w + off(b.b2);
      for (std::size_t j = 0; j < n; ++j) std::copy_n(B1, H, Hl + j * H);
      tessera::host::gemm(false, true, int(n), hd, d, 1.0f, xin, W1, 1.0f, Hl);  // H = X W1^T + b1
      float* A = a_.data();
      for (std::size_t i = 0; i < n * H; ++i) A[i] = gelu(Hl[i]);
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t c = 0; c < D; ++c) xout[j * D + c] = xin[j * D + c] + B2[c];
      tessera::host::gemm(false, true, int(n), d, hd, 1.0f, A, W2, 1.0f, xout);  // X' = X + A W2^T + b2
    }
    const float* XL = X + std::size_t(L) * n_max_ * D;
    double loss = 0;
    // ---- head, loss, and the head's backward ----
    {
      auto sc = m_.gather(ids_.head);
      const float* w = widen(sc.weights());
      const float *Wh = w + m_.slot(ids_.hw).offset, *Bh = w + m_.slot(ids_.hb).offset;
      float* Z = logits_.data();
      for (std::size_t j = 0; j < n; ++j) std::copy_n(Bh, vocab, Z + j * vocab);
      tessera::host::gemm(false, true, int(n), vocab, d, 1.0f, XL, Wh, 1.0f, Z);
      const float inv = float(1.0 / global_tokens);
      for (std::size_t j = 0; j < n; ++j) {
        float* z = Z + j * vocab;
        const float mx = *std::max_element(z, z + vocab);
        double sum = 0;
        for (int c = 0; c < vocab; ++c) sum += std::exp(double(z[c] - mx));
        loss += std::log(sum) + mx - z[target[j]];
        for (int c = 0; c < vocab; ++c) z[c] = float(std::exp(double(z[c] - mx)) / sum) * inv;  // dlogits
        z[target[j]] -= inv;
      }
      auto gW = sc.grad(ids_.hw), gB = sc.grad(ids_.hb);
      tessera::host::gemm(true, false, vocab, d, int(n), 1.0f, Z, XL, 1.0f, gW.data());  // dWh += dZ^T X
      for (std::size_t j = 0; j < n; ++j)
        for (int c = 0; c < vocab; ++c) gB[std::size_t(c)] += Z[j * vocab + std::size_t(c)];
      tessera::host::gemm(false, false, int(n), d, vocab, 1.0f, Z, Wh, 0.0f, dx_.data());  // dX = dZ Wh
      sc.reduce_grads();
    }
    // ---- blocks, last first ----
    for (int l = L - 1; l >= 0; --l) {
      auto sc = m_.gather(ids_.blocks[std::size_t(l)].unit);
      const auto& b = ids_.blocks[std::size_t(l)];
      const float* xin = X + std::size_t(l) * n_max_ * D;
      const float* Hl = h_.data() + std::size_t(l) * n_max_ * H;
      const float* w = widen(sc.weights());
      const auto off = [&](tessera::param_id p) { return m_.slot(p).offset; };
      const float *W1 = w + off(b.w1), *W2 = w + off(b.w2);
      float* A = a_.data();
      for (std::size_t i = 0; i < n * H; ++i) A[i] = gelu(Hl[i]);  // recomputed, not stored
      auto gW1 = sc.grad(b.w1), gB1 = sc.grad(b.b1), gW2 = sc.grad(b.w2), gB2 = sc.grad(b.b2);
      float* dX = dx_.data();
      tessera::host::gemm(true, false, d, hd, int(n), 1.0f, dX, A, 1.0f, gW2.data());  // dW2 += dY^T A
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t c = 0; c < D; ++c) gB2[c] += dX[j * D + c];
      float* dA = da_.data();
      tessera::host::gemm(false, false, int(n), hd, d, 1.0f, dX, W2, 0.0f, dA);  // dA = dY W2
      for (std::size_t i = 0; i < n * H; ++i) dA[i] *= gelu_grad(Hl[i]);           // dH
      tessera::host::gemm(true, false, hd, d, int(n), 1.0f, dA, xin, 1.0f, gW1.data());  // dW1 += dH^T X
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t c = 0; c < H; ++c) gB1[c] += dA[j * H + c];
      tessera::host::gemm(false, false, int(n), d, hd, 1.0f, dA, W1, 1.0f, dX);  // dX += dH W1
      sc.reduce_grads();
    }
    {
      auto sc = m_.gather(ids_.embed);
      auto gE = sc.grad(ids_.table);
      for (std::size_t j = 0; j < n; ++j)
        for (int k = 0; k < s_.ctx; ++k) {
          float* row = gE.data() + std::size_t(ctx[j * std::size_t(s_.ctx) + std::size_t(k)]) * std::size_t(e);
          const float* src = dx_.data() + j * D + std::size_t(k * e);
          for (int c = 0; c < e; ++c) row[c] += src[c];
        }
      sc.reduce_grads();
    }
    loss_ += loss;
  }
  //! Ends the loss summed since the last finish_loss (as the CUDA net: a
  //! step's loss not taken is dropped, not added to the next).
  void finish_loss() { finished_ = std::exchange(loss_, 0.0); }
  //! The loss finish_loss ended.
  double take_loss() const { return finished_; }

private:
  // fp32 view of compute weights: the weights themselves, or a widened copy.
  const float* widen(std::span<const C> w) { return trainer_kit::widen(w, wide_.data()); }

  Wrapper& m_;
  const model_ids& ids_;
  model_shape s_;
  std::size_t n_max_;
  double loss_ = 0, finished_ = 0;
  trainer_kit::buffer_block<tessera::host::buffer> block_;  // every span below (host_buffers)
  std::span<float> x_, h_, a_, da_, dx_, logits_;
  buf<float> wide_;  // bf16 units widened (widened_floats: their size is the layouts')
};

}  // namespace mlp_lm
