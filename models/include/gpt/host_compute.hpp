#pragma once
// GPT-2's forward and backward on the host backend: CBLAS GEMMs in fp32 (bf16
// compute weights widened per unit), host_kernels.hpp for the rest. The
// micro-batch protocol as a user writes it: the embed unit (tied table,
// positions, final LayerNorm) gathered once and held for the micro-batch,
// each block gathered in forward and again in backward, each unit's
// reduce_grads as soon as its gradients are complete.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpt/data.hpp"
#include "gpt/host_kernels.hpp"
#include "gpt/model.hpp"
#include "tessera/backend/host/blas.hpp"
#include "tessera/backend/host/buffer.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "trainer_kit/buffers.hpp"
#include "trainer_kit/fp8_linears.hpp"

namespace gpt {

//! Rows of logits the classifier holds at once: the fp32 logits of the whole
//! batch are never in memory (50257 x 4 bytes a token for GPT-2).
inline constexpr std::size_t classifier_rows = 64;

//! Per-token floats of one block's saved activations (see host_gpt::slot).
inline std::size_t block_floats(const model_shape& s) {
  return 11 * std::size_t(s.d) + std::size_t(s.heads) + 4;
}

//! The buffers host_gpt holds at `batch` sequences per micro-batch, as one
//! list (trainer_kit/buffers.hpp): what its constructor allocates and what
//! the estimate counts. Every block's saved activations (one block's under
//! recompute), the residual stream, the backward's buffers, a chunk of logits.
struct host_buffers {
  trainer_kit::buffer_list list;
  trainer_kit::buffer_slot<float> x, act, xf, lnf_stats, dx, dbig, dsmall, logits, scratch, xq, wq, dyq;
  trainer_kit::buffer_slot<std::uint16_t> inputs, targets;
  host_buffers(const model_shape& s, int batch, const net_options& o) {
    const std::size_t n = std::size_t(batch) * std::size_t(s.seq), D = std::size_t(s.d);
    x = list.add<float>("residual stream", (std::size_t(s.layers) + 1) * n * D);
    act = list.add<float>("saved activations", std::size_t(o.recompute ? 1 : s.layers) * n * block_floats(s));
    xf = list.add<float>("final LayerNorm output", n * D);
    lnf_stats = list.add<float>("final LayerNorm statistics", 2 * n);
    dx = list.add<float>("dx", n * D);
    dbig = list.add<float>("GELU output, dH, dqkv", 4 * n * D);
    dsmall = list.add<float>("dxn, dy", n * D);
    logits = list.add<float>("logits chunk", classifier_rows * std::size_t(s.vocab));
    scratch = list.add<float>("attention row", std::size_t(s.seq));
    inputs = list.add<std::uint16_t>("inputs", n);
    targets = list.add<std::uint16_t>("targets", n);
    if (o.fp8.on) {  // the fp8 codes of a product's operands (trainer_kit::host_linears), 4 d its widest
      xq = list.add<float>("fp8 input codes", n * 4 * D);
      wq = list.add<float>("fp8 weight codes", 4 * D * D);
      dyq = list.add<float>("fp8 gradient codes", n * 4 * D);
    }
  }
};

template <class Wrapper>
class host_gpt : public trainer_kit::host_fp8_products {
  using C = typename Wrapper::compute_type;
  static_assert(std::is_same_v<typename Wrapper::grad_type, float>, "the host trainer accumulates fp32 gradients");
  template <class T> using buf = tessera::host::buffer<T>;
  using widened = trainer_kit::widened_units<C, buf<float>>;

public:
  static constexpr const char* backend_name = "host";
  [[nodiscard]] const char* attention_name() const { return "exact (host)"; }
  [[nodiscard]] std::string products_used() const { return "host kernels"; }

  host_gpt(Wrapper& m, const model_ids& ids, const model_shape& s, int batch, net_options o = {})
      : m_(m), ids_(ids), s_(s), o_(o), n_max_(std::size_t(batch) * std::size_t(s.seq)) {
    const host_buffers b(s, batch, o);  // the list tessera-plan counts
    block_ = trainer_kit::buffer_block<tessera::host::buffer>(b.list);
    x_ = block_[b.x], act_ = block_[b.act], xf_ = block_[b.xf], lnf_stats_ = block_[b.lnf_stats], dx_ = block_[b.dx];
    dbig_ = block_[b.dbig], dsmall_ = block_[b.dsmall], logits_ = block_[b.logits], scratch_ = block_[b.scratch];
    inputs_ = block_[b.inputs], targets_ = block_[b.targets];
    if (o.fp8.on)  // qkv, proj, fc, fc_proj of each block
      use_fp8(o.fp8, 4 * std::size_t(s.layers), block_[b.xq].data(), block_[b.wq].data(), block_[b.dyq].data());
    wide_ = widened(ids, [&](tessera::unit_id u) { return m.layout(u).padded_numel(); });
  }

  //! Nothing of the host net's size is known only once it is built.
  [[nodiscard]] std::size_t runtime_workspace_bytes() const { return 0; }
  //! The host backend's BLAS holds no workspace of the library's.
  [[nodiscard]] static constexpr std::size_t blas_workspace_bytes() { return 0; }
  //! Floats of the fp32 copies bf16 compute weights are widened into: the
  //! embed unit's (held for a whole micro-batch) and the widest block's (one
  //! block at a time); 0 in fp32. `padded_numel` maps a unit_id to its
  //! layout's: the wrapper's in the trainer, the plan's in tessera-plan, so
  //! both count what the constructor allocates.
  template <class F>
  [[nodiscard]] static std::size_t widened_floats(const model_ids& ids, F&& padded_numel) {
    return widened::floats(ids, padded_numel);
  }
  //! Host bytes this class holds apart from widened_floats, for the memory estimate.
  [[nodiscard]] static std::size_t workspace_bytes(const model_shape& s, int batch, net_options o = {}) {
    return host_buffers(s, batch, o).list.bytes();
  }

  //! One micro-batch of `batch` sequences of seq + 1 tokens: forward, loss,
  //! backward with gradients accumulated into the wrapper (scaled by
  //! 1 / global_tokens). The summed cross-entropy accumulates until finish_loss().
  void forward_backward(const std::uint16_t* seqs, int batch, double global_tokens) {
    const std::size_t B = std::size_t(batch), T = std::size_t(s_.seq), n = B * T;
    TESSERA_CHECK(n <= n_max_, "micro-batch of ", batch, " sequences over the planned ", n_max_ / T);
    training(true);
    split(seqs, B, T);
    auto se = m_.gather(ids_.embed);  // held to the end: lookup, head, embedding backward
    const float* E = wide_.embed(se.weights());
    forward_blocks(E, B, T);
    // ---- head: final LayerNorm, tied classifier, loss and its backward in chunks ----
    const std::size_t D = std::size_t(s_.d), V = std::size_t(s_.vocab);
    const float* wte = E + m_.slot(ids_.wte).offset;
    auto g_wte = se.grad(ids_.wte);
    const float inv = float(1.0 / global_tokens);
    float* dxf = dsmall_.data();
    double loss = 0;
    head_logits(E, n, [&](std::size_t r0, std::size_t rows, float* Z) {
      loss += host::cross_entropy(Z, targets_.data() + r0, rows, V, inv);  // Z becomes dloss/dZ
      tessera::host::gemm(true, false, int(V), int(D), int(rows), 1.0f, Z, xf_.data() + r0 * D, 1.0f, g_wte.data());
      tessera::host::gemm(false, false, int(rows), int(D), int(V), 1.0f, Z, wte, 0.0f, dxf + r0 * D);
    });
    const float* XL = x_.data() + std::size_t(s_.layers) * n_max_ * D;
    const float* lw = E + m_.slot(ids_.lnf_w).offset;
    const float *mean = lnf_stats_.data(), *rstd = mean + n_max_;
    std::fill_n(dx_.data(), n * D, 0.0f);
    host::layernorm_backward(dxf, XL, lw, mean, rstd, dx_.data(), se.grad(ids_.lnf_w).data(),
                             se.grad(ids_.lnf_b).data(), n, D);
    // ---- blocks, last first ----
    for (int l = s_.layers - 1; l >= 0; --l) backward_block(l, B, T);
    // ---- embeddings: the token table's second use, then the unit's one reduction ----
    auto g_wpe = se.grad(ids_.wpe);
    for (std::size_t i = 0; i < n; ++i) {
      float* rt = g_wte.data() + std::size_t(inputs_.data()[i]) * D;
      float* rp = g_wpe.data() + (i % T) * D;
      const float* g = dx_.data() + i * D;
      for (std::size_t c = 0; c < D; ++c) rt[c] += g[c], rp[c] += g[c];
    }
    se.reduce_grads();
    loss_ += loss;
  }

  //! Forward only: the summed cross-entropy of `batch` sequences (evaluation).
  double forward_loss(const std::uint16_t* seqs, int batch) {
    const std::size_t B = std::size_t(batch), T = std::size_t(s_.seq), n = B * T, V = std::size_t(s_.vocab);
    training(false);
    split(seqs, B, T);
    auto se = m_.gather(ids_.embed);
    const float* E = wide_.embed(se.weights());
    forward_blocks(E, B, T);
    double loss = 0;
    head_logits(E, n, [&](std::size_t r0, std::size_t rows, float* Z) {
      loss += host::cross_entropy_loss(Z, targets_.data() + r0, rows, V);
    });
    return loss;
  }

  //! The next-token logits (real vocabulary) after `len` <= seq tokens of one sequence.
  std::vector<float> next_logits(const std::uint16_t* tokens, int len) {
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
    float *ln1_mean, *ln1_rstd, *xn1, *qkv, *lse, *y, *xmid, *ln2_mean, *ln2_rstd, *xn2, *h;
  };
  slot slot_of(int l) {
    const std::size_t n = n_max_, D = std::size_t(s_.d);
    float* p = act_.data() + std::size_t(o_.recompute ? 0 : l) * n * block_floats(s_);
    slot a{};
    a.ln1_mean = p, p += n;
    a.ln1_rstd = p, p += n;
    a.xn1 = p, p += n * D;
    a.qkv = p, p += 3 * n * D;
    a.lse = p, p += n * std::size_t(s_.heads);
    a.y = p, p += n * D;
    a.xmid = p, p += n * D;
    a.ln2_mean = p, p += n;
    a.ln2_rstd = p, p += n;
    a.xn2 = p, p += n * D;
    a.h = p;
    return a;
  }
  using block_weights = gpt::block_weights<float>;
  // GPT-2's attention as the kit's layers read it: as many kv heads as heads.
  host::qkv_layout qkv_layout() const {
    return {std::size_t(s_.heads), std::size_t(s_.heads), std::size_t(s_.head_dim())};
  }
  block_weights weights_of(const block_ids& b, const float* w) const { return gpt::weights_of(m_, b, w); }
  void split(const std::uint16_t* seqs, std::size_t B, std::size_t T) {
    split_sequences(seqs, B, T, inputs_.data(), targets_.data());
  }

  // Embedding lookup and every block's forward (inputs_ holds B x T tokens).
  void forward_blocks(const float* E, std::size_t B, std::size_t T) {
    const std::size_t n = B * T, D = std::size_t(s_.d);
    const float *wte = E + m_.slot(ids_.wte).offset, *wpe = E + m_.slot(ids_.wpe).offset;
    float* X0 = x_.data();
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t c = 0; c < D; ++c) X0[i * D + c] = wte[std::size_t(inputs_.data()[i]) * D + c] + wpe[(i % T) * D + c];
    for (int l = 0; l < s_.layers; ++l) {
      const auto& b = ids_.blocks[std::size_t(l)];
      auto sc = m_.gather(b.unit);
      forward_block(weights_of(b, wide_.block(sc.weights())), l, B, T);
    }
  }

  void forward_block(const block_weights& w, int l, std::size_t B, std::size_t T) {
    const std::size_t n = B * T, D = std::size_t(s_.d), H4 = 4 * D;
    const float* xin = x_.data() + std::size_t(l) * n_max_ * D;
    float* xout = x_.data() + std::size_t(l + 1) * n_max_ * D;
    const slot a = slot_of(l);
    host::layernorm(xin, w.ln1_w, w.ln1_b, a.xn1, a.ln1_mean, a.ln1_rstd, n, D);
    const auto lin = linears();
    const std::size_t k = 4 * std::size_t(l);  // this block's first product
    for (std::size_t i = 0; i < n; ++i) std::copy_n(w.qkv_b, 3 * D, a.qkv + i * 3 * D);
    lin.forward(k, a.xn1, w.qkv_w, a.qkv, n, D, 3 * D, 1.0f);
    host::attention(a.qkv, a.y, a.lse, B, T, qkv_layout(), scratch_.data());
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t c = 0; c < D; ++c) a.xmid[i * D + c] = xin[i * D + c] + w.proj_b[c];
    lin.forward(k + 1, a.y, w.proj_w, a.xmid, n, D, D, 1.0f);
    host::layernorm(a.xmid, w.ln2_w, w.ln2_b, a.xn2, a.ln2_mean, a.ln2_rstd, n, D);
    for (std::size_t i = 0; i < n; ++i) std::copy_n(w.fc_b, H4, a.h + i * H4);
    lin.forward(k + 2, a.xn2, w.fc_w, a.h, n, D, H4, 1.0f);
    float* act = dbig_.data();  // GELU output, recomputed in backward
    for (std::size_t i = 0; i < n * H4; ++i) act[i] = host::gelu(a.h[i]);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t c = 0; c < D; ++c) xout[i * D + c] = a.xmid[i * D + c] + w.fc_proj_b[c];
    lin.forward(k + 3, act, w.fc_proj_w, xout, n, H4, D, 1.0f);
  }

  // dx_ holds d loss / d x_{l+1}; leaves d loss / d x_l.
  void backward_block(int l, std::size_t B, std::size_t T) {
    const auto& b = ids_.blocks[std::size_t(l)];
    auto sc = m_.gather(b.unit);
    const block_weights w = weights_of(b, wide_.block(sc.weights()));
    if (o_.recompute) forward_block(w, l, B, T);
    const std::size_t n = B * T, D = std::size_t(s_.d), H4 = 4 * D;
    const float* xin = x_.data() + std::size_t(l) * n_max_ * D;
    const slot a = slot_of(l);
    float* dX = dx_.data();
    const auto lin = linears();
    const std::size_t k = 4 * std::size_t(l);
    auto col_sums = [n](const float* g, std::size_t width, float* into) {
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t c = 0; c < width; ++c) into[c] += g[i * width + c];
    };
    // MLP: x_{l+1} = xmid + gelu(xn2 Wfc^T + bfc) Wp^T + bp
    float* act = dbig_.data();
    for (std::size_t i = 0; i < n * H4; ++i) act[i] = host::gelu(a.h[i]);
    col_sums(dX, D, sc.grad(b.fc_proj_b).data());
    float* dH = dbig_.data();  // over act: its wgrad reads it first
    lin.backward(k + 3, dX, act, w.fc_proj_w, sc.grad(b.fc_proj_w).data(), dH, n, H4, D);
    for (std::size_t i = 0; i < n * H4; ++i) dH[i] *= host::gelu_grad(a.h[i]);
    col_sums(dH, H4, sc.grad(b.fc_b).data());
    float* dxn = dsmall_.data();
    lin.backward(k + 2, dH, a.xn2, w.fc_w, sc.grad(b.fc_w).data(), dxn, n, D, H4);
    // dX becomes d loss / d xmid: the residual's share plus LayerNorm 2's
    host::layernorm_backward(dxn, a.xmid, w.ln2_w, a.ln2_mean, a.ln2_rstd, dX, sc.grad(b.ln2_w).data(),
                             sc.grad(b.ln2_b).data(), n, D);
    // attention: xmid = x_l + y Wproj^T + bproj
    col_sums(dX, D, sc.grad(b.proj_b).data());
    float* dY = dsmall_.data();
    lin.backward(k + 1, dX, a.y, w.proj_w, sc.grad(b.proj_w).data(), dY, n, D, D);
    float* dQKV = dbig_.data();  // 3d of the 4d wide scratch
    host::attention_backward(dY, a.qkv, a.y, a.lse, dQKV, B, T, qkv_layout());
    col_sums(dQKV, 3 * D, sc.grad(b.qkv_b).data());
    lin.backward(k, dQKV, a.xn1, w.qkv_w, sc.grad(b.qkv_w).data(), dxn, n, D, 3 * D);
    host::layernorm_backward(dxn, xin, w.ln1_w, a.ln1_mean, a.ln1_rstd, dX, sc.grad(b.ln1_w).data(),
                             sc.grad(b.ln1_b).data(), n, D);
    sc.reduce_grads();
  }

  // The final LayerNorm and the tied classifier over n rows, a chunk of
  // logits at a time, each chunk handed to f(first row, rows, logits).
  template <class F>
  void head_logits(const float* E, std::size_t n, F&& f) {
    const std::size_t D = std::size_t(s_.d), V = std::size_t(s_.vocab);
    const float* XL = x_.data() + std::size_t(s_.layers) * n_max_ * D;
    float *mean = lnf_stats_.data(), *rstd = mean + n_max_;
    host::layernorm(XL, E + m_.slot(ids_.lnf_w).offset, E + m_.slot(ids_.lnf_b).offset, xf_.data(), mean, rstd, n, D);
    for (std::size_t r0 = 0; r0 < n; r0 += classifier_rows) {
      const std::size_t rows = std::min(classifier_rows, n - r0);
      tessera::host::gemm(false, true, int(rows), int(V), int(D), 1.0f, xf_.data() + r0 * D,
                          E + m_.slot(ids_.wte).offset, 0.0f, logits_.data());
      f(r0, rows, logits_.data());
    }
  }


  Wrapper& m_;
  const model_ids& ids_;
  model_shape s_;
  net_options o_;
  std::size_t n_max_;
  double loss_ = 0, finished_ = 0;
  trainer_kit::buffer_block<tessera::host::buffer> block_;  // every span below (host_buffers)
  std::span<float> x_, act_, xf_, lnf_stats_, dx_, dbig_, dsmall_, logits_, scratch_;
  std::span<std::uint16_t> inputs_, targets_;
  widened wide_;  // bf16 units widened (widened_floats: their size is the layouts')
};

}  // namespace gpt
