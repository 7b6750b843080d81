#pragma once
// Llama 3's forward and backward on the host backend: CBLAS GEMMs in fp32
// (bf16 compute weights widened per unit), the kit's host layers
// (trainer_kit/host_layers.hpp: RMSNorm, rotary embeddings, grouped-query
// attention, SwiGLU, cross-entropy) for the rest. The micro-batch protocol is
// GPT-2's: the embed unit (table, final norm, untied head) gathered once and
// held for the micro-batch, each block gathered in forward and again in
// backward, each unit's reduce_grads as soon as its gradients are complete.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "llama/model.hpp"
#include "llama/rope.hpp"
#include "tessera/backend/host/blas.hpp"
#include "tessera/backend/host/buffer.hpp"
#include "tessera/core/error.hpp"
#include "trainer_kit/buffers.hpp"
#include "trainer_kit/fp8_linears.hpp"
#include "trainer_kit/host_layers.hpp"
#include "trainer_kit/host_math.hpp"
#include "trainer_kit/tokens.hpp"

namespace llama {

using token = std::uint32_t;

//! How a net keeps activations for backward, and the CUDA net's choices.
struct net_options {
  //! Keep each block's input only and recompute the block's forward in its
  //! backward (one block's activations instead of L).
  bool recompute = false;
  //! The CUDA net's attention in bf16: auto (cuDNN's fused SDPA where the
  //! build has it and it runs, else exact), cudnn or exact.
  std::string attention = "auto";
  //! Every sum in a fixed order (the CUDA net; the host's are ordered already).
  bool deterministic = false;
  //! Micro-batches whose tokens the CUDA net holds at once (a step graph's).
  int input_slots = 1;
  //! --precision fp8: the blocks' four products in fp8 (the host net; trainer_kit/fp8_linears.hpp).
  trainer_kit::fp8_options fp8{};
};

//! Rows of logits the host classifier holds at once.
inline constexpr std::size_t host_classifier_rows = 32;

//! Per-token floats of one block's saved activations (see host_llama::slot).
inline std::size_t block_floats(const model_shape& s) {
  return 2 + 3 * std::size_t(s.d) + std::size_t(s.qkv_dim()) + std::size_t(s.heads) + std::size_t(s.q_dim()) +
         2 * std::size_t(s.ffn);
}

//! The buffers host_llama holds at `batch` sequences per micro-batch, as one
//! list (trainer_kit/buffers.hpp): what its constructor allocates and what
//! the estimate counts.
struct host_buffers {
  trainer_kit::buffer_list list;
  trainer_kit::buffer_slot<float> x, act, xf, rstdf, dx, dsmall, a, da, dbig, dy, logits, scratch, cos, sin, xq, wq, dyq;
  trainer_kit::buffer_slot<token> inputs, targets;
  host_buffers(const model_shape& s, int batch, const net_options& o) {
    const std::size_t n = std::size_t(batch) * std::size_t(s.seq), D = std::size_t(s.d), F = std::size_t(s.ffn);
    const std::size_t half = std::size_t(s.seq) * std::size_t(s.head_dim() / 2);
    x = list.add<float>("residual stream", (std::size_t(s.layers) + 1) * n * D);
    act = list.add<float>("saved activations", std::size_t(o.recompute ? 1 : s.layers) * n * block_floats(s));
    xf = list.add<float>("final norm output", n * D);
    rstdf = list.add<float>("final norm statistics", n);
    dx = list.add<float>("dx", n * D);
    dsmall = list.add<float>("dxn", n * D);
    a = list.add<float>("SwiGLU output", n * F);
    da = list.add<float>("dA", n * F);
    dbig = list.add<float>("dgate_up, dqkv", n * std::max(2 * F, std::size_t(s.qkv_dim())));
    dy = list.add<float>("dy", n * std::size_t(s.q_dim()));
    logits = list.add<float>("logits chunk", host_classifier_rows * std::size_t(s.vocab));
    scratch = list.add<float>("attention row", std::size_t(s.seq));
    cos = list.add<float>("rotary cos", half);
    sin = list.add<float>("rotary sin", half);
    inputs = list.add<token>("inputs", n);
    targets = list.add<token>("targets", n);
    if (o.fp8.on) {  // the fp8 codes of a product's operands (trainer_kit::host_linears)
      const std::size_t R = std::size_t(s.qkv_dim()), Q = std::size_t(s.q_dim());
      xq = list.add<float>("fp8 input codes", n * std::max({D, Q, F}));
      wq = list.add<float>("fp8 weight codes", std::max({R * D, D * Q, 2 * F * D}));
      dyq = list.add<float>("fp8 gradient codes", n * std::max({R, D, 2 * F}));
    }
  }
};

template <class Wrapper>
class host_llama : public trainer_kit::host_fp8_products {
  using C = typename Wrapper::compute_type;
  static_assert(std::is_same_v<typename Wrapper::grad_type, float>, "the host trainer accumulates fp32 gradients");
  template <class T> using buf = tessera::host::buffer<T>;
  using widened = trainer_kit::widened_units<C, buf<float>>;

public:
  static constexpr const char* backend_name = "host";
  [[nodiscard]] const char* attention_name() const { return "exact (host)"; }
  [[nodiscard]] std::string products_used() const { return "host kernels"; }

  host_llama(Wrapper& m, const model_ids& ids, const model_shape& s, int batch, net_options o = {})
      : m_(m), ids_(ids), s_(s), o_(o), n_max_(std::size_t(batch) * std::size_t(s.seq)),
        L_{std::size_t(s.heads), std::size_t(s.kv_heads), std::size_t(s.head_dim())} {
    const host_buffers b(s, batch, o);  // the list the estimate counts
    block_ = trainer_kit::buffer_block<tessera::host::buffer>(b.list);
    x_ = block_[b.x], act_ = block_[b.act], xf_ = block_[b.xf], rstdf_ = block_[b.rstdf], dx_ = block_[b.dx];
    dsmall_ = block_[b.dsmall], a_ = block_[b.a], da_ = block_[b.da], dbig_ = block_[b.dbig], dy_ = block_[b.dy];
    logits_ = block_[b.logits], scratch_ = block_[b.scratch], cos_ = block_[b.cos], sin_ = block_[b.sin];
    inputs_ = block_[b.inputs], targets_ = block_[b.targets];
    if (o.fp8.on)  // qkv, o, gate_up, down of each block
      use_fp8(o.fp8, 4 * std::size_t(s.layers), block_[b.xq].data(), block_[b.wq].data(), block_[b.dyq].data());
    const rope_tables t(s, s.seq);
    std::copy(t.cos.begin(), t.cos.end(), cos_.begin()), std::copy(t.sin.begin(), t.sin.end(), sin_.begin());
    wide_ = widened(ids, [&](tessera::unit_id u) { return m.layout(u).padded_numel(); });
  }

  [[nodiscard]] std::size_t runtime_workspace_bytes() const { return 0; }
  [[nodiscard]] static constexpr std::size_t blas_workspace_bytes() { return 0; }
  //! Floats of the fp32 copies bf16 units are widened into (0 in fp32): the
  //! embed unit's and the widest block's, from the layouts `padded_numel` gives.
  template <class F>
  [[nodiscard]] static std::size_t widened_floats(const model_ids& ids, F&& padded_numel) {
    return widened::floats(ids, padded_numel);
  }
  [[nodiscard]] static std::size_t workspace_bytes(const model_shape& s, int batch, net_options o = {}) {
    return host_buffers(s, batch, o).list.bytes();
  }

  //! One micro-batch of `batch` sequences of seq + 1 tokens: forward, loss,
  //! backward with gradients accumulated into the wrapper (scaled by
  //! 1 / global_tokens). The summed cross-entropy accumulates until finish_loss().
  void forward_backward(const token* seqs, int batch, double global_tokens) {
    const std::size_t B = std::size_t(batch), T = std::size_t(s_.seq), n = B * T;
    TESSERA_CHECK(n <= n_max_, "micro-batch of ", batch, " sequences over the planned ", n_max_ / T);
    training(true);
    trainer_kit::split_sequences(seqs, B, T, inputs_.data(), targets_.data());
    auto se = m_.gather(ids_.embed);  // held to the end: lookup, head, embedding backward
    const float* E = wide_.embed(se.weights());
    forward_blocks(E, B, T);
    const std::size_t D = std::size_t(s_.d), V = std::size_t(s_.vocab);
    const float* head = E + m_.slot(ids_.head).offset;
    auto g_head = se.grad(ids_.head);
    const float inv = float(1.0 / global_tokens);
    float* dxf = dsmall_.data();
    double loss = 0;
    head_logits(E, n, [&](std::size_t r0, std::size_t rows, float* Z) {
      loss += trainer_kit::host::cross_entropy(Z, targets_.data() + r0, rows, V, inv);  // Z becomes dloss/dZ
      tessera::host::gemm(true, false, int(V), int(D), int(rows), 1.0f, Z, xf_.data() + r0 * D, 1.0f, g_head.data());
      tessera::host::gemm(false, false, int(rows), int(D), int(V), 1.0f, Z, head, 0.0f, dxf + r0 * D);
    });
    std::fill_n(dx_.data(), n * D, 0.0f);
    trainer_kit::host::rmsnorm_backward(dxf, x(s_.layers), E + m_.slot(ids_.norm).offset, rstdf_.data(), dx_.data(),
                                        se.grad(ids_.norm).data(), n, D);
    for (int l = s_.layers - 1; l >= 0; --l) backward_block(l, B, T);
    auto g_tok = se.grad(ids_.tok);  // the table's second use (its first, where tied, is the head)
    for (std::size_t i = 0; i < n; ++i) {
      float* row = g_tok.data() + std::size_t(inputs_[i]) * D;
      const float* g = dx_.data() + i * D;
      for (std::size_t c = 0; c < D; ++c) row[c] += g[c];
    }
    se.reduce_grads();
    loss_ += loss;
  }

  //! Forward only: the summed cross-entropy of `batch` sequences (evaluation).
  double forward_loss(const token* seqs, int batch) {
    const std::size_t B = std::size_t(batch), T = std::size_t(s_.seq), n = B * T;
    training(false);  // an evaluation's amaxes are not the training's
    trainer_kit::split_sequences(seqs, B, T, inputs_.data(), targets_.data());
    auto se = m_.gather(ids_.embed);
    const float* E = wide_.embed(se.weights());
    forward_blocks(E, B, T);
    double loss = 0;
    head_logits(E, n, [&](std::size_t r0, std::size_t rows, float* Z) {
      loss += trainer_kit::host::cross_entropy_loss(Z, targets_.data() + r0, rows, std::size_t(s_.vocab));
    });
    return loss;
  }

  //! The next-token logits (real vocabulary) after `len` <= seq tokens of one sequence.
  std::vector<float> next_logits(const token* tokens, int len) {
    TESSERA_CHECK(len >= 1 && len <= s_.seq, "a prompt of ", len, " tokens for a context of ", s_.seq);
    const std::size_t T = std::size_t(len), V = std::size_t(s_.vocab);
    std::copy_n(tokens, T, inputs_.data());
    training(false);
    auto se = m_.gather(ids_.embed);
    const float* E = wide_.embed(se.weights());
    forward_blocks(E, 1, T);
    std::vector<float> out(V);
    head_logits(E, T, [&](std::size_t r0, std::size_t rows, float* Z) {
      if (r0 + rows == T) std::copy_n(Z + (rows - 1) * V, V, out.begin());
    });
    return out;
  }

  void finish_loss() { finished_ = std::exchange(loss_, 0.0); }
  [[nodiscard]] double take_loss() const { return finished_; }

private:
  // One block's saved activations in slot l (slot 0 for every block under --recompute).
  struct slot {
    float *rstd1, *xn1, *qkv, *lse, *y, *xmid, *rstd2, *xn2, *gu;
  };
  slot slot_of(int l) {
    const std::size_t n = n_max_, D = std::size_t(s_.d);
    float* p = act_.data() + std::size_t(o_.recompute ? 0 : l) * n * block_floats(s_);
    slot a{};
    a.rstd1 = p, p += n;
    a.xn1 = p, p += n * D;
    a.qkv = p, p += n * std::size_t(s_.qkv_dim());
    a.lse = p, p += n * std::size_t(s_.heads);
    a.y = p, p += n * std::size_t(s_.q_dim());
    a.xmid = p, p += n * D;
    a.rstd2 = p, p += n;
    a.xn2 = p, p += n * D;
    a.gu = p;
    return a;
  }
  float* x(int l) { return x_.data() + std::size_t(l) * n_max_ * std::size_t(s_.d); }
  using weights = block_weights<float>;

  void forward_blocks(const float* E, std::size_t B, std::size_t T) {
    const std::size_t n = B * T, D = std::size_t(s_.d);
    const float* tok = E + m_.slot(ids_.tok).offset;
    for (std::size_t i = 0; i < n; ++i) std::copy_n(tok + std::size_t(inputs_[i]) * D, D, x(0) + i * D);
    for (int l = 0; l < s_.layers; ++l) {
      const auto& b = ids_.blocks[std::size_t(l)];
      auto sc = m_.gather(b.unit);
      forward_block(llama::weights_of(m_, b, wide_.block(sc.weights())), l, B, T);
    }
  }

  void forward_block(const weights& w, int l, std::size_t B, std::size_t T) {
    const std::size_t n = B * T, D = std::size_t(s_.d), R = std::size_t(s_.qkv_dim()), Q = std::size_t(s_.q_dim()),
                      F = std::size_t(s_.ffn), hd = std::size_t(s_.head_dim());
    const float eps = float(s_.norm_eps);
    const slot a = slot_of(l);
    const auto lin = linears();
    const std::size_t k = 4 * std::size_t(l);  // this block's first product
    namespace h = trainer_kit::host;
    h::rmsnorm(x(l), w.attn_norm, a.xn1, a.rstd1, n, D, eps);
    lin.forward(k, a.xn1, w.qkv, a.qkv, n, D, R, 0.0f);
    h::rope(a.qkv, n, T, R, 0, L_.H, hd, cos_.data(), sin_.data());       // q
    h::rope(a.qkv, n, T, R, Q, L_.KV, hd, cos_.data(), sin_.data());      // k
    h::attention(a.qkv, a.y, a.lse, B, T, L_, scratch_.data());
    std::copy_n(x(l), n * D, a.xmid);
    lin.forward(k + 1, a.y, w.o, a.xmid, n, Q, D, 1.0f);  // xmid = x + y Wo^T
    h::rmsnorm(a.xmid, w.ffn_norm, a.xn2, a.rstd2, n, D, eps);
    lin.forward(k + 2, a.xn2, w.gate_up, a.gu, n, D, 2 * F, 0.0f);
    h::swiglu(a.gu, a_.data(), n, F);
    std::copy_n(a.xmid, n * D, x(l + 1));
    lin.forward(k + 3, a_.data(), w.down, x(l + 1), n, F, D, 1.0f);  // x' = xmid + a Wd^T
  }

  // dx_ holds d loss / d x_{l+1}; leaves d loss / d x_l.
  void backward_block(int l, std::size_t B, std::size_t T) {
    const auto& b = ids_.blocks[std::size_t(l)];
    auto sc = m_.gather(b.unit);
    const weights w = llama::weights_of(m_, b, wide_.block(sc.weights()));
    if (o_.recompute) forward_block(w, l, B, T);
    const std::size_t n = B * T, D = std::size_t(s_.d), R = std::size_t(s_.qkv_dim()), Q = std::size_t(s_.q_dim()),
                      F = std::size_t(s_.ffn), hd = std::size_t(s_.head_dim());
    const slot a = slot_of(l);
    float* dX = dx_.data();
    const auto lin = linears();
    const std::size_t k = 4 * std::size_t(l);
    namespace h = trainer_kit::host;
    // MLP: x_{l+1} = xmid + swiglu(xn2 Wgu^T) Wd^T
    h::swiglu(a.gu, a_.data(), n, F);
    lin.backward(k + 3, dX, a_.data(), w.down, sc.grad(b.down).data(), da_.data(), n, F, D);
    float* dGU = dbig_.data();
    h::swiglu_backward(da_.data(), a.gu, dGU, n, F);
    float* dxn = dsmall_.data();
    lin.backward(k + 2, dGU, a.xn2, w.gate_up, sc.grad(b.gate_up).data(), dxn, n, D, 2 * F);
    h::rmsnorm_backward(dxn, a.xmid, w.ffn_norm, a.rstd2, dX, sc.grad(b.ffn_norm).data(), n, D);  // dX: d/dxmid
    // attention: xmid = x_l + attention(rope(xn1 Wqkv^T)) Wo^T
    lin.backward(k + 1, dX, a.y, w.o, sc.grad(b.o).data(), dy_.data(), n, Q, D);
    float* dQKV = dbig_.data();
    h::attention_backward(dy_.data(), a.qkv, a.y, a.lse, dQKV, B, T, L_);
    h::rope(dQKV, n, T, R, 0, L_.H, hd, cos_.data(), sin_.data(), true);   // dq before the rotation
    h::rope(dQKV, n, T, R, Q, L_.KV, hd, cos_.data(), sin_.data(), true);  // dk
    lin.backward(k, dQKV, a.xn1, w.qkv, sc.grad(b.qkv).data(), dxn, n, D, R);
    h::rmsnorm_backward(dxn, x(l), w.attn_norm, a.rstd1, dX, sc.grad(b.attn_norm).data(), n, D);
    sc.reduce_grads();
  }

  // The final norm and the head over n rows, a chunk of logits at a time,
  // each chunk handed to f(first row, rows, logits).
  template <class F>
  void head_logits(const float* E, std::size_t n, F&& f) {
    const std::size_t D = std::size_t(s_.d), V = std::size_t(s_.vocab);
    trainer_kit::host::rmsnorm(x(s_.layers), E + m_.slot(ids_.norm).offset, xf_.data(), rstdf_.data(), n, D,
                               float(s_.norm_eps));
    for (std::size_t r0 = 0; r0 < n; r0 += host_classifier_rows) {
      const std::size_t rows = std::min(host_classifier_rows, n - r0);
      tessera::host::gemm(false, true, int(rows), int(V), int(D), 1.0f, xf_.data() + r0 * D,
                          E + m_.slot(ids_.head).offset, 0.0f, logits_.data());
      f(r0, rows, logits_.data());
    }
  }


  Wrapper& m_;
  const model_ids& ids_;
  model_shape s_;
  net_options o_;
  std::size_t n_max_;
  trainer_kit::host::qkv_layout L_;
  double loss_ = 0, finished_ = 0;
  trainer_kit::buffer_block<tessera::host::buffer> block_;  // every span below (host_buffers)
  std::span<float> x_, act_, xf_, rstdf_, dx_, dsmall_, a_, da_, dbig_, dy_, logits_, scratch_, cos_, sin_;
  std::span<token> inputs_, targets_;
  widened wide_;  // bf16 units widened (widened_floats: their size is the layouts')
};

}  // namespace llama
