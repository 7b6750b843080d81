#pragma once
// Llama 3's forward and backward on the CUDA backend, the same protocol and
// arithmetic as host_compute.hpp: cuBLASLt products on compute-type operands
// (fp32 strict, or bf16 with fp32 accumulation), the kit's kernels for the
// rest (trainer_kit/kernels/: RMSNorm, rotary embeddings, SwiGLU, the loss;
// trainer_kit/attention.cuh: cuDNN's fused SDPA with grouped kv heads, or the
// exact kernels). The residual stream, the products that feed it and the
// norms' statistics are fp32; the classifier runs in chunks of rows over the
// padded vocabulary (its logits in the compute type, their gradient written
// over them), so the logits of the whole batch are never in memory.
// --deterministic: every sum in a fixed order (the norms' and bias-free
// products' sums are the kit's fixed-order column sums anyway; the loss per
// row, the embedding's rows by token, attention's dk and dv).
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "llama/host_compute.hpp"
#include "llama/model.hpp"
#include "llama/rope.hpp"
#include "llama/workspace.hpp"
#include "tessera/backend/cuda/blaslt.hpp"
#include "tessera/backend/cuda/buffer.hpp"
#include "tessera/backend/cuda/stream.hpp"
#include "tessera/optim/step_graph.cuh"
#include "trainer_kit/kernels/blas_workspace.cuh"
#include "trainer_kit/attention.cuh"
#include "trainer_kit/buffers.hpp"
#include "trainer_kit/embedding.cuh"
#include "trainer_kit/grads.cuh"
#include "trainer_kit/kernels/loss.cuh"
#include "trainer_kit/kernels/rmsnorm.cuh"
#include "trainer_kit/kernels/rope.cuh"

namespace llama {

template <class Wrapper>
class cuda_llama {
  using C = typename Wrapper::compute_type;
  static_assert(std::is_same_v<typename Wrapper::grad_type, float>, "the GPU trainer accumulates fp32 gradients");
  template <class TD> using problem = tessera::cuda::matmul_problem<C, TD>;
  using grads = trainer_kit::unit_grads<Wrapper>;

public:
  static constexpr const char* backend_name = "cuda";
  template <class Opt> using graph_runner = tessera::step_graph<Opt>;

  cuda_llama(Wrapper& m, const model_ids& ids, const model_shape& s, int batch, net_options o = {})
      : m_(m), ids_(ids), s_(s), o_(o), n_max_(std::size_t(batch) * std::size_t(s.seq)),
        attn_(batch, s.seq, shape_of(s), o.attention, o.deterministic) {
    TESSERA_CHECK(o.input_slots >= 1 && (!o.deterministic || o.input_slots == 1), "cuda_llama: input_slots ",
                  o.input_slots, " (one under --deterministic: its token groups are one micro-batch's)");
    const workspace::cuda_buffers<C> b(s, batch, o, attn_.flash());  // the list tessera-plan counts
    block_ = trainer_kit::buffer_block<tessera::cuda::buffer>(b.list);
    x_ = block_[b.x], rstd_ = block_[b.rstd], lse_ = block_[b.lse], xmid_ = block_[b.xmid], dx_ = block_[b.dx];
    dsmall_ = block_[b.dsmall], pbig_ = block_[b.pbig], dvec_ = block_[b.dvec], colscratch_ = block_[b.colscratch];
    xn1_ = block_[b.xn1], qkv_ = block_[b.qkv], y_ = block_[b.y], xn2_ = block_[b.xn2], gu_ = block_[b.gu];
    xf_ = block_[b.xf], a_ = block_[b.a], da_ = block_[b.da], dgu_ = block_[b.dgu], dx_c_ = block_[b.dx_c];
    dy_c_ = block_[b.dy_c], z_ = block_[b.z], loss_ = block_[b.loss], row_loss_ = block_[b.row_loss];
    tokens_ = trainer_kit::token_slots<token>(block_[b.tok], n_max_, block_[b.groups], s.padded_vocab());
    const rope_tables t(s, s.seq);
    const auto cos = block_[b.cos], sin = block_[b.sin];
    TESSERA_CUDA(cudaMemcpyAsync(cos.data(), t.cos.data(), cos.size_bytes(), cudaMemcpyHostToDevice, stream()));
    TESSERA_CUDA(cudaMemcpyAsync(sin.data(), t.sin.data(), sin.size_bytes(), cudaMemcpyHostToDevice, stream()));
    cos_ = cos.data(), sin_ = sin.data();
    TESSERA_CUDA(cudaMemsetAsync(loss_.data(), 0, sizeof(double), stream()));
    TESSERA_CUDA(cudaStreamSynchronize(stream()));
    // bf16: each product keeps the fastest of cuBLASLt's first candidates (timed in its first run); fp32 and
    // --deterministic keep the heuristic's first (a timed choice could differ between runs).
    tessera::cuda::set_matmul_tuning(std::is_same_v<C, float> || o.deterministic ? 1 : 8);
  }

  [[nodiscard]] std::string attention_name() const { return attn_.name(); }
  [[nodiscard]] std::string products_used() const { return "cuBLASLt, no epilogues (Llama has no biases)"; }
  [[nodiscard]] static std::size_t workspace_bytes(const model_shape& s, int batch, net_options o = {}) {
    return workspace::cuda_bytes<C>(s, batch, o, trainer_kit::attention<C>::uses_flash(shape_of(s), o.attention));
  }
  [[nodiscard]] std::size_t runtime_workspace_bytes() const { return attn_.workspace_bytes(); }
  [[nodiscard]] static constexpr std::size_t blas_workspace_bytes() { return workspace::cublaslt_bytes; }

  void forward_backward(const token* seqs, int batch, double global_tokens) {
    stage(0, seqs, batch);
    forward_backward_staged(0, batch, global_tokens);
  }
  void stage(int slot, const token* seqs, int batch) {
    tokens_.stage(slot, seqs, std::size_t(batch), std::size_t(s_.seq), stream());
  }
  void forward_backward_slots(int count, int batch, double global_tokens) {
    for (int k = 0; k < count; ++k) {
      m_.begin_micro_batch(k, count);
      forward_backward_staged(k, batch, global_tokens);
    }
  }
  //! One staged micro-batch: forward, loss, backward (device work only, so a step graph can capture it).
  void forward_backward_staged(int slot, int batch, double global_tokens) {
    const std::size_t B = std::size_t(batch), T = std::size_t(s_.seq), n = B * T, D = std::size_t(s_.d),
                      V = std::size_t(s_.vocab), Vp = std::size_t(s_.padded_vocab());
    TESSERA_CHECK(n <= n_max_, "micro-batch of ", batch, " sequences over the planned ", n_max_ / T);
    tokens_.use(slot);
    auto se = m_.gather(ids_.embed);  // held to the end: lookup, head, embedding backward
    const C* E = se.weights().data();
    forward_blocks(E, B, T);
    // Fresh: the head's first chunk assigns its gradient (and, where tied, the table's).
    const grads ge = trainer_kit::write_grads(se, m_, ids_.tied ? std::initializer_list<tessera::param_id>{}
                                                                : std::initializer_list<tessera::param_id>{ids_.tok},
                                              stream());
    const C* head = E + m_.slot(ids_.head).offset;
    const float scale = float(1.0 / global_tokens);
    head_chunks(E, n, [&](std::size_t r0, std::size_t rows) {
      trainer_kit::kernels::cross_entropy<C>(z_.data(), tokens_.targets() + r0, int(V), int(Vp), scale, true,
                                             loss_.data(), rows, stream(), true, row_loss(r0));
      mm<float>({.trans_a = true, .m = int(Vp), .n = int(D), .k = int(rows), .a = z_.data(), .b = xf_.data() + r0 * D,
                 .d = ge(ids_.head), .beta = ge.fresh && r0 == 0 ? 0.0f : 1.0f});
      mm<float>({.m = int(rows), .n = int(D), .k = int(Vp), .a = z_.data(), .b = head, .d = dsmall_.data() + r0 * D});
    });
    if (o_.deterministic) trainer_kit::kernels::ordered_sum(row_loss_.data(), n, loss_.data(), stream());
    TESSERA_CUDA(cudaMemsetAsync(dx_.data(), 0, n * D * sizeof(float), stream()));
    trainer_kit::kernels::rmsnorm_backward<C>(dsmall_.data(), x(s_.layers), E + m_.slot(ids_.norm).offset,
                                              rstd_final(), dx_.data(), dx_c_.data(), ge(ids_.norm), ge.fresh,
                                              pbig_.data(), colscratch_, int(n), int(D), stream());
    for (int l = s_.layers - 1; l >= 0; --l) backward_block(l, B, T);
    if (o_.deterministic) tokens_.grouped_backward(dx_.data(), ge(ids_.tok), int(D), stream());
    else trainer_kit::kernels::embed_backward(dx_.data(), tokens_.inputs(), ge(ids_.tok), nullptr, n, int(T), int(D),
                                              stream());
    se.reduce_grads();
  }

  //! Forward only: the summed cross-entropy of `batch` sequences (waits for it).
  double forward_loss(const token* seqs, int batch) {
    const std::size_t B = std::size_t(batch), T = std::size_t(s_.seq), n = B * T;
    tokens_.stage(0, seqs, B, T, stream());
    tessera::cuda::buffer<double> loss(1);
    TESSERA_CUDA(cudaMemsetAsync(loss.data(), 0, sizeof(double), stream()));
    auto se = m_.gather(ids_.embed);
    const C* E = se.weights().data();
    forward_blocks(E, B, T);
    head_chunks(E, n, [&](std::size_t r0, std::size_t rows) {
      trainer_kit::kernels::cross_entropy<C>(z_.data(), tokens_.targets() + r0, s_.vocab, s_.padded_vocab(), 0.0f, false,
                                             loss.data(), rows, stream(), true, row_loss(r0));
    });
    if (o_.deterministic) trainer_kit::kernels::ordered_sum(row_loss_.data(), n, loss.data(), stream());
    double out = 0;
    TESSERA_CUDA(cudaMemcpyAsync(&out, loss.data(), sizeof(double), cudaMemcpyDeviceToHost, stream()));
    TESSERA_CUDA(cudaStreamSynchronize(stream()));
    return out;
  }

  //! The next-token logits (real vocabulary) after `len` <= seq tokens of one sequence.
  std::vector<float> next_logits(const token* tokens, int len) {
    TESSERA_CHECK(len >= 1 && len <= s_.seq, "a prompt of ", len, " tokens for a context of ", s_.seq);
    const std::size_t T = std::size_t(len), V = std::size_t(s_.vocab);
    tokens_.stage_prompt(tokens, T, stream());
    auto se = m_.gather(ids_.embed);
    const C* E = se.weights().data();
    forward_blocks(E, 1, T);
    std::vector<C> last(V);
    head_chunks(E, T, [&](std::size_t r0, std::size_t rows) {
      if (r0 + rows == T)
        TESSERA_CUDA(cudaMemcpyAsync(last.data(), z_.data() + (rows - 1) * std::size_t(s_.padded_vocab()),
                                     V * sizeof(C), cudaMemcpyDeviceToHost, stream()));
    });
    TESSERA_CUDA(cudaStreamSynchronize(stream()));
    return std::vector<float>(last.begin(), last.end());
  }

  void finish_loss() {
    TESSERA_CUDA(cudaMemcpyAsync(&finished_, loss_.data(), sizeof(double), cudaMemcpyDeviceToHost, stream()));
    TESSERA_CUDA(cudaMemsetAsync(loss_.data(), 0, sizeof(double), stream()));
    TESSERA_CUDA(cudaStreamSynchronize(stream()));
  }
  [[nodiscard]] double take_loss() const { return finished_; }

private:
  static cudaStream_t stream() { return tessera::cuda::current_stream(); }
  static trainer_kit::kernels::attention_shape shape_of(const model_shape& s) {
    return {s.heads, s.kv_heads, s.head_dim()};
  }
  template <class TD>
  static void mm(problem<TD> p) {
    p.tf32 = false;  // fp32 runs strict fp32, to match the host
    tessera::cuda::matmul(p);
  }
  double* row_loss(std::size_t r0) { return o_.deterministic ? row_loss_.data() + r0 : nullptr; }
  float* x(int l) { return x_.data() + std::size_t(l) * n_max_ * std::size_t(s_.d); }
  float* rstd_final() { return rstd_.data() + rstd_.size() - n_max_; }

  // One block's saved activations (slot 0 for every block under --recompute).
  struct slot {
    float *rstd1, *rstd2, *lse, *xmid;
    C *xn1, *qkv, *y, *xn2, *gu;
  };
  slot slot_of(int l) {
    const std::size_t n = n_max_, D = std::size_t(s_.d), k = std::size_t(o_.recompute ? 0 : l);
    return {.rstd1 = rstd_.data() + k * 2 * n, .rstd2 = rstd_.data() + k * 2 * n + n,
            .lse = lse_.data() + k * n * std::size_t(s_.heads), .xmid = xmid_.data() + k * n * D,
            .xn1 = xn1_.data() + k * n * D, .qkv = qkv_.data() + k * n * std::size_t(s_.qkv_dim()),
            .y = y_.data() + k * n * std::size_t(s_.q_dim()), .xn2 = xn2_.data() + k * n * D,
            .gu = gu_.data() + k * n * 2 * std::size_t(s_.ffn)};
  }

  void forward_blocks(const C* E, std::size_t B, std::size_t T) {
    trainer_kit::kernels::embed(tokens_.inputs(), E + m_.slot(ids_.tok).offset, static_cast<const C*>(nullptr), x(0),
                                B * T, int(T), s_.d, stream());
    for (int l = 0; l < s_.layers; ++l) {
      const auto& b = ids_.blocks[std::size_t(l)];
      auto sc = m_.gather(b.unit);
      forward_block(weights_of(m_, b, sc.weights().data()), l, B, T);
    }
  }

  void forward_block(const block_weights<C>& w, int l, std::size_t B, std::size_t T) {
    const int n = int(B * T), D = s_.d, R = s_.qkv_dim(), Q = s_.q_dim(), F = s_.ffn;
    const slot a = slot_of(l);
    namespace k = trainer_kit::kernels;
    k::rmsnorm<C>(x(l), w.attn_norm, a.xn1, a.rstd1, n, D, float(s_.norm_eps), stream());
    mm<C>({.trans_b = true, .m = n, .n = R, .k = D, .a = a.xn1, .b = w.qkv, .d = a.qkv});
    k::rope<C>(a.qkv, std::size_t(n), int(T), R, s_.heads + s_.kv_heads, s_.head_dim(), cos_, sin_, false, stream());
    attn_.forward(a.qkv, a.y, a.lse, int(B), int(T), stream());
    mm<float>({.trans_b = true, .m = n, .n = D, .k = Q, .a = a.y, .b = w.o, .d = a.xmid, .beta = 1, .c = x(l)});
    k::rmsnorm<C>(a.xmid, w.ffn_norm, a.xn2, a.rstd2, n, D, float(s_.norm_eps), stream());
    mm<C>({.trans_b = true, .m = n, .n = 2 * F, .k = D, .a = a.xn2, .b = w.gate_up, .d = a.gu});
    k::swiglu<C>(a.gu, a_.data(), std::size_t(n), F, stream());
    mm<float>({.trans_b = true, .m = n, .n = D, .k = F, .a = a_.data(), .b = w.down, .d = x(l + 1), .beta = 1,
               .c = a.xmid});
  }

  // dx_ holds d loss / d x_{l+1} (dx_c_ the same in C); leaves d loss / d x_l.
  void backward_block(int l, std::size_t B, std::size_t T) {
    const auto& b = ids_.blocks[std::size_t(l)];
    auto sc = m_.gather(b.unit);
    const block_weights<C> w = weights_of(m_, b, sc.weights().data());
    if (o_.recompute) forward_block(w, l, B, T);
    const int n = int(B * T), D = s_.d, R = s_.qkv_dim(), Q = s_.q_dim(), F = s_.ffn;
    const slot a = slot_of(l);
    namespace k = trainer_kit::kernels;
    const grads g = trainer_kit::write_grads(sc, m_, {}, stream());  // every gradient assigned where fresh
    const float beta = g.fresh ? 0.0f : 1.0f;
    C* dXc = dx_c_.data();
    // MLP: x_{l+1} = xmid + swiglu(xn2 Wgu^T) Wd^T
    k::swiglu<C>(a.gu, a_.data(), std::size_t(n), F, stream());  // the forward's output, again
    mm<float>({.trans_a = true, .m = D, .n = F, .k = n, .a = dXc, .b = a_.data(), .d = g(b.down), .beta = beta});
    mm<C>({.m = n, .n = F, .k = D, .a = dXc, .b = w.down, .d = da_.data()});
    C* dGU = dgu_.data();
    k::swiglu_backward<C, C>(da_.data(), a.gu, dGU, std::size_t(n), F, stream());
    mm<float>({.trans_a = true, .m = 2 * F, .n = D, .k = n, .a = dGU, .b = a.xn2, .d = g(b.gate_up), .beta = beta});
    float* dxn = dsmall_.data();
    mm<float>({.m = n, .n = D, .k = 2 * F, .a = dGU, .b = w.gate_up, .d = dxn});
    k::rmsnorm_backward<C>(dxn, a.xmid, w.ffn_norm, a.rstd2, dx_.data(), dXc, g(b.ffn_norm), g.fresh, pbig_.data(),
                           colscratch_, n, D, stream());
    // attention: xmid = x_l + attention(rope(xn1 Wqkv^T)) Wo^T
    mm<float>({.trans_a = true, .m = D, .n = Q, .k = n, .a = dXc, .b = a.y, .d = g(b.o), .beta = beta});
    C* dY = dy_c_.data();
    mm<C>({.m = n, .n = Q, .k = D, .a = dXc, .b = w.o, .d = dY});
    C* dQKV = dgu_.data();  // dgate_up is spent
    attn_.backward(dY, a.qkv, a.y, a.lse, dQKV, pbig_.data(), dvec_.data(), int(B), int(T), stream());
    k::rope<C>(dQKV, std::size_t(n), int(T), R, s_.heads + s_.kv_heads, s_.head_dim(), cos_, sin_, true, stream());
    mm<float>({.trans_a = true, .m = R, .n = D, .k = n, .a = dQKV, .b = a.xn1, .d = g(b.qkv), .beta = beta});
    mm<float>({.m = n, .n = D, .k = R, .a = dQKV, .b = w.qkv, .d = dxn});
    k::rmsnorm_backward<C>(dxn, x(l), w.attn_norm, a.rstd1, dx_.data(), dXc, g(b.attn_norm), g.fresh, pbig_.data(),
                           colscratch_, n, D, stream());
    sc.reduce_grads();
  }

  // The final norm and the head over n rows, chunk by chunk: f(first row,
  // rows) with the chunk's logits (in C) in z_, rows of the padded vocabulary
  // (the padded rows of the tables are zero: their logits are never read).
  template <class F>
  void head_chunks(const C* E, std::size_t n, F&& f) {
    const int D = s_.d, Vp = s_.padded_vocab();
    trainer_kit::kernels::rmsnorm<C>(x(s_.layers), E + m_.slot(ids_.norm).offset, xf_.data(), rstd_final(), int(n), D,
                                     float(s_.norm_eps), stream());
    const std::size_t step = z_.size() / std::size_t(Vp);
    for (std::size_t r0 = 0; r0 < n; r0 += step) {
      const std::size_t rows = std::min(step, n - r0);
      mm<C>({.trans_b = true, .m = int(rows), .n = Vp, .k = D, .a = xf_.data() + r0 * std::size_t(D),
             .b = E + m_.slot(ids_.head).offset, .d = z_.data()});
      f(r0, rows);
    }
  }

  Wrapper& m_;
  const model_ids& ids_;
  model_shape s_;
  net_options o_;
  std::size_t n_max_;
  trainer_kit::attention<C> attn_;
  double finished_ = 0;
  trainer_kit::buffer_block<tessera::cuda::buffer> block_;  // every span below (workspace::cuda_buffers)
  std::span<float> x_, rstd_, lse_, xmid_, dx_, dsmall_, pbig_, dvec_, colscratch_;
  std::span<C> xn1_, qkv_, y_, xn2_, gu_, xf_, a_, da_, dgu_, dx_c_, dy_c_, z_;
  std::span<double> loss_, row_loss_;
  const float *cos_ = nullptr, *sin_ = nullptr;
  trainer_kit::token_slots<token> tokens_;  // each input slot's tokens (--deterministic: grouped by token)
};

}  // namespace llama
