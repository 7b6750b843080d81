#pragma once
// GPT-2's forward and backward on the CUDA backend, the same protocol and
// arithmetic as host_compute.hpp: cuBLASLt products on compute-type operands
// (fp32 or bf16), the kernel kit (trainer_kit/kernels/) for the rest. The residual stream, the
// products that feed it and LayerNorm statistics are fp32; the classifier
// runs in chunks of rows over the padded vocabulary (its logits in the
// compute type, as under PyTorch autocast, and their gradient written over
// them), so the logits of
// the whole batch are never in memory. Attention is the kit's
// (trainer_kit/attention.cuh: cuDNN's fused SDPA, flash on tensor cores, or
// the exact kernels, which fp32 runs), so are the embedding, the token slots
// and the element-wise forms.
//
// bf16: each product with a cuBLASLt epilogue (bias, bias + GELU keeping the
// GELU input, GELU gradient, bias gradient) runs fused where cuBLASLt has the
// form and it measures faster (trainer_kit::product_forms, timed in the first
// step); the GELU input is kept in bf16, as under PyTorch autocast. fp32: the
// separate forms only, so that the GPU matches the host backend.
//
// --deterministic (net_options): every sum that the default kernels take
// with atomics takes a fixed order instead (the kit's column sums, the ordered
// LayerNorm backward, attention's dq or dk and dv without atomics, cuDNN's
// deterministic backward), and the products run fused wherever cuBLASLt can,
// with no timing.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nvtx3/nvToolsExt.h>

#include "gpt/cuda_layernorm.cuh"
#include "trainer_kit/attention.cuh"
#include "trainer_kit/embedding.cuh"
#include "trainer_kit/grads.cuh"
#include "gpt/cuda_products.cuh"
#include "gpt/data.hpp"
#include "gpt/host_compute.hpp"
#include "gpt/model.hpp"
#include "gpt/workspace.hpp"
#include "tessera/backend/cuda/blaslt.hpp"
#include "tessera/backend/cuda/buffer.hpp"
#include "tessera/backend/cuda/stream.hpp"
#include "tessera/optim/step_graph.cuh"
#include "trainer_kit/buffers.hpp"

namespace gpt {

template <class Wrapper>
class cuda_gpt {
  using C = typename Wrapper::compute_type;
  static_assert(std::is_same_v<typename Wrapper::grad_type, float>, "the GPU trainer accumulates fp32 gradients");
  template <class T> using dbuf = tessera::cuda::buffer<T>;
  // Rows of logits the classifier holds at once (rows x padded vocabulary, in C).
  static constexpr std::size_t chunk_rows = workspace::chunk_rows;
  using products = cuda_products<C>;
  using product = typename products::product;
  using epilogue = tessera::cuda::epilogue;
  template <class TD> using problem = typename products::template problem<TD>;

public:
  static constexpr const char* backend_name = "cuda";
  //! The trainer's steps as CUDA graphs: stage() each micro-batch's tokens,
  //! then forward_backward_slots() inside the step.
  template <class Opt> using graph_runner = tessera::step_graph<Opt>;

  cuda_gpt(Wrapper& m, const model_ids& ids, const model_shape& s, int batch, net_options o = {})
      : m_(m), ids_(ids), s_(s), o_(o), n_max_(std::size_t(batch) * std::size_t(s.seq)) {
    TESSERA_CHECK(s.d <= kernels::layernorm_backward_max_d, "the CUDA LayerNorm backward holds 2 d floats in shared "
                  "memory: --d at most ", kernels::layernorm_backward_max_d);
    TESSERA_CHECK(!o.deterministic || workspace::layernorm_ordered_fits(s.d), workspace::layernorm_ordered_refusal(s.d));
    TESSERA_CHECK(o.input_slots >= 1, "cuda_gpt: input_slots ", o.input_slots, " (at least 1)");
    // --deterministic's token groups (the embedding's ordered backward) are one
    // micro-batch's: a step graph of it holds one micro-batch.
    TESSERA_CHECK(!o.deterministic || o.input_slots == 1, "cuda_gpt: --deterministic holds one micro-batch's tokens "
                  "(input_slots 1; it has ", o.input_slots, ")");
    // Every buffer from one list (workspace.hpp), the one tessera-plan counts.
    const workspace::cuda_buffers<C> b(s, batch, o, attn_.flash());
    block_ = trainer_kit::buffer_block<tessera::cuda::buffer>(b.list);
    x_ = block_[b.x], stats_ = block_[b.stats], lse_ = block_[b.lse], xmid_ = block_[b.xmid], big_ = block_[b.big];
    dx_ = block_[b.dx], dsmall_ = block_[b.dsmall], dvec_ = block_[b.dvec], ln_partial_ = block_[b.ln_partial];
    resid_db_ = block_[b.resid_db];
    qkv_ = block_[b.qkv], h_ = block_[b.h], xn1_ = block_[b.xn1], y_ = block_[b.y], xn2_ = block_[b.xn2];
    xf_ = block_[b.xf], act_ = block_[b.act], big_c_ = block_[b.big_c], dx_c_ = block_[b.dx_c], dy_c_ = block_[b.dy_c];
    z_ = block_[b.z], loss_ = block_[b.loss], row_loss_ = block_[b.row_loss];
    tokens_ = trainer_kit::token_slots<std::uint16_t>(block_[b.tok], n_max_, block_[b.groups], s.padded_vocab());
    prod_.emplace(block_[b.bias32], block_[b.partial], o.deterministic);
    TESSERA_CUDA(cudaMemsetAsync(loss_.data(), 0, sizeof(double), stream()));
    prod_->decide(n_max_, s.d, act_.data(), big_.data());
  }

  //! Which attention kernels run (trainer_kit/attention.cuh: cuDNN, flash or exact).
  [[nodiscard]] std::string attention_name() const { return attn_.name(); }
  //! The form each product with a cuBLASLt epilogue runs in (after the first step: the timings that chose it).
  [[nodiscard]] std::string products_used() const {
    return prod_->describe() + (ln_sums_bias() ? "; proj and fc_proj bias gradients: column sums in the LayerNorm "
                                                "backward (their dW products plain)" : "");
  }
  //! Device bytes this class holds, for the memory estimate.
  [[nodiscard]] static std::size_t workspace_bytes(const model_shape& s, int batch, net_options o = {}) {
    return workspace::cuda_bytes<C>(s, batch, o, trainer_kit::attention<C>::uses_flash(shape_of(s), o.attention));
  }
  //! Device bytes known once the net is built: cuDNN's attention workspace.
  [[nodiscard]] std::size_t runtime_workspace_bytes() const { return attn_.workspace_bytes(); }
  //! cuBLASLt's workspace on this net's stream (the library's memory counts it).
  [[nodiscard]] static constexpr std::size_t blas_workspace_bytes() { return workspace::cublaslt_bytes; }

  //! One micro-batch of `batch` sequences (seq + 1 tokens each): forward,
  //! loss, backward, with gradients written into the wrapper (scaled by
  //! 1 / global_tokens). The summed loss accumulates on the device (finish_loss).
  void forward_backward(const std::uint16_t* seqs, int batch, double global_tokens) {
    stage(0, seqs, batch);
    forward_backward_staged(0, batch, global_tokens);
  }
  //! Puts one micro-batch's tokens in input slot `slot` (of
  //! net_options::input_slots), for forward_backward_staged. Waits for the
  //! copy: call it before the step, never inside one being captured.
  void stage(int slot, const std::uint16_t* seqs, int batch) {
    tokens_.stage(slot, seqs, std::size_t(batch), std::size_t(s_.seq), stream());
  }
  //! A step's `count` micro-batches, staged in slots 0 .. count - 1:
  //! begin_micro_batch and forward_backward_staged for each (what the
  //! trainer's step graph captures).
  void forward_backward_slots(int count, int batch, double global_tokens) {
    for (int k = 0; k < count; ++k) {
      m_.begin_micro_batch(k, count);
      forward_backward_staged(k, batch, global_tokens);
    }
  }
  //! forward_backward on the tokens stage() put in `slot`: device work only,
  //! the same every step, so a step graph can capture it.
  void forward_backward_staged(int slot, int batch, double global_tokens) {
    const std::size_t B = std::size_t(batch), T = std::size_t(s_.seq), n = B * T, D = std::size_t(s_.d),
                      V = std::size_t(s_.vocab), Vp = std::size_t(s_.padded_vocab());
    TESSERA_CHECK(n <= n_max_, "micro-batch of ", batch, " sequences over the planned ", n_max_ / T);
    tokens_.use(slot);
    auto se = m_.gather(ids_.embed);  // held to the end: lookup, head, embedding backward
    const C* E = se.weights().data();
    forward_blocks(E, B, T);
    const C* wte = E + m_.slot(ids_.wte).offset;
    // Fresh: the head's first chunk assigns all of wte's gradient.
    const grads ge = write_grads(se, {ids_.wpe, ids_.lnf_w, ids_.lnf_b});
    const bool fresh = ge.fresh;
    float* g_wte = ge(ids_.wte);
    const float scale = float(1.0 / global_tokens);
    head(E, n, [&](std::size_t r0, std::size_t rows) {
      kernels::cross_entropy<C>(z_.data(), targets() + r0, int(V), int(Vp), scale, true, loss_.data(), rows, stream(),
                                true, row_loss(r0));
      // Over the padded vocabulary: dz is zero there, so the padded rows of wte get no gradient.
      gemm(true, false, int(Vp), int(D), int(rows), 1.0f, z_.data(), xf_.data() + r0 * D, fresh && r0 == 0 ? 0.0f : 1.0f,
           g_wte);
      gemm(false, false, int(rows), int(D), int(Vp), 1.0f, z_.data(), wte, 0.0f, dsmall_.data() + r0 * D);
    });
    if (o_.deterministic) kernels::ordered_sum(row_loss_.data(), n, loss_.data(), stream());
    TESSERA_CUDA(cudaMemsetAsync(dx_.data(), 0, n * D * sizeof(float), stream()));
    if (resid_db()) TESSERA_CUDA(cudaMemsetAsync(resid_db(), 0, D * sizeof(float), stream()));
    float* st = stats_.data() + stats_.size() - 2 * n_max_;
    kernels::layernorm_backward<C>(dsmall_.data(), x_.data() + std::size_t(s_.layers) * n_max_ * D,
                                   E + m_.slot(ids_.lnf_w).offset, st, st + n_max_, dx_.data(), dx_c_.data(),
                                   ge(ids_.lnf_w), ge(ids_.lnf_b), int(n), int(D), stream(), 0,
                                   ln_partial(), resid_db());
    check_launch();
    for (int l = s_.layers - 1; l >= 0; --l) backward_block(l, B, T);
    if (o_.deterministic) {  // positions in sequence order, tokens grouped (stage() built the groups)
      trainer_kit::kernels::position_backward_kernel<float><<<grid(T * D), 256, 0, stream()>>>(dx_.data(), ge(ids_.wpe),
                                                                                               int(B), int(T), int(D));
      check_launch();
      tokens_.grouped_backward(dx_.data(), g_wte, int(D), stream());
    } else {
      trainer_kit::kernels::embed_backward(dx_.data(), inputs(), g_wte, ge(ids_.wpe), n, int(T), int(D), stream());
    }
    se.reduce_grads();
  }

  //! Forward only: the summed cross-entropy of `batch` sequences (waits for it).
  double forward_loss(const std::uint16_t* seqs, int batch) {
    const std::size_t B = std::size_t(batch), T = std::size_t(s_.seq), n = B * T, V = std::size_t(s_.vocab);
    tokens_.stage(0, seqs, B, T, stream());
    dbuf<double> loss(1);
    TESSERA_CUDA(cudaMemsetAsync(loss.data(), 0, sizeof(double), stream()));
    auto se = m_.gather(ids_.embed);
    const C* E = se.weights().data();
    forward_blocks(E, B, T);
    head(E, n, [&](std::size_t r0, std::size_t rows) {
      kernels::cross_entropy<C>(z_.data(), targets() + r0, int(V), s_.padded_vocab(), 0.0f, false, loss.data(), rows,
                                stream(), true, row_loss(r0));
    });
    if (o_.deterministic) kernels::ordered_sum(row_loss_.data(), n, loss.data(), stream());
    double out = 0;
    TESSERA_CUDA(cudaMemcpyAsync(&out, loss.data(), sizeof(double), cudaMemcpyDeviceToHost, stream()));
    TESSERA_CUDA(cudaStreamSynchronize(stream()));
    return out;
  }

  //! The next-token logits (real vocabulary) after `len` <= seq tokens of one sequence.
  std::vector<float> next_logits(const std::uint16_t* tokens, int len) {
    TESSERA_CHECK(len >= 1 && len <= s_.seq, "a prompt of ", len, " tokens for a context of ", s_.seq);
    const std::size_t T = std::size_t(len), V = std::size_t(s_.vocab);
    tokens_.stage_prompt(tokens, T, stream());
    auto se = m_.gather(ids_.embed);
    const C* E = se.weights().data();
    forward_blocks(E, 1, T);
    std::vector<C> last(V);
    head(E, T, [&](std::size_t r0, std::size_t rows) {
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

  //! One step as the NVTX range "tessera-step": ncu --nvtx --nvtx-include "tessera-step/".
  void begin_range() { nvtxRangePushA("tessera-step"); }
  void end_range() { nvtxRangePop(); }

private:
  static cudaStream_t stream() { return tessera::cuda::current_stream(); }
  static void check_launch() { kernels::check_launch(); }
  static unsigned grid(std::size_t total) { return kernels::grid(total); }
  template <class TD>
  static void mm(problem<TD> p) { products::mm(p); }
  template <class T, class TC>
  static void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const T* a, const T* b, float beta, TC* c) {
    products::gemm(ta, tb, m, n, k, alpha, a, b, beta, c);
  }
  // The tokens the micro-batch being issued reads.
  const std::uint16_t* inputs() const { return tokens_.inputs(); }
  const std::uint16_t* targets() const { return tokens_.targets(); }
  // --deterministic's buffers (null otherwise): each row's loss, LayerNorm's partial sums.
  double* row_loss(std::size_t r0) { return o_.deterministic ? row_loss_.data() + r0 : nullptr; }
  float* ln_partial() { return o_.deterministic ? ln_partial_.data() : nullptr; }
  // Without --deterministic each LayerNorm backward also sums the columns of
  // the residual gradient it leaves (layernorm_backward's dsum): the bias
  // gradient of the product below it that joined the stream, attention's proj
  // in the same block, or the block below's fc_proj (through resid_db_: that
  // unit is not gathered yet, its gradients not handed out). This saves
  // cuBLASLt's bias-gradient pass over dY (a read of n x d bf16 each).
  // --deterministic keeps the products' ordered sums.
  [[nodiscard]] bool ln_sums_bias() const { return !o_.deterministic; }
  float* resid_db() { return ln_sums_bias() ? resid_db_.data() : nullptr; }

  struct slot {
    float *mean1 = nullptr, *rstd1 = nullptr, *mean2 = nullptr, *rstd2 = nullptr, *lse = nullptr, *xmid = nullptr;
    C *qkv = nullptr, *h = nullptr, *xn1 = nullptr, *y = nullptr, *xn2 = nullptr;  // qkv: what attention reads; h: the GELU input
    C* act = nullptr;  // the GELU output: the block's own with keep_gelu, else one shared by every block
  };
  slot slot_of(int l) {
    const std::size_t n = n_max_, D = std::size_t(s_.d), k = std::size_t(o_.recompute ? 0 : l);
    float* st = stats_.data() + k * 4 * n;
    return {.mean1 = st, .rstd1 = st + n, .mean2 = st + 2 * n, .rstd2 = st + 3 * n,
            .lse = lse_.data() + k * n * std::size_t(s_.heads), .xmid = xmid_.data() + k * n * D,
            .qkv = qkv_.data() + k * 3 * n * D, .h = h_.data() + k * 4 * n * D, .xn1 = xn1_.data() + k * n * D,
            .y = y_.data() + k * n * D, .xn2 = xn2_.data() + k * n * D,
            .act = act_.data() + (o_.keep_gelu ? k : 0) * 4 * n * D};
  }
  using block_weights = gpt::block_weights<C>;
  block_weights weights_of(const block_ids& b, const C* w) const { return gpt::weights_of(m_, b, w); }

  // A unit's gradients as the backward writes them (trainer_kit/grads.cuh): g(p) is parameter p's.
  using grads = trainer_kit::unit_grads<Wrapper>;
  template <class Scope>
  grads write_grads(Scope& scope, std::initializer_list<tessera::param_id> added) {
    return trainer_kit::write_grads(scope, m_, added, stream());
  }

  void forward_blocks(const C* E, std::size_t B, std::size_t T) {
    const std::size_t n = B * T, D = std::size_t(s_.d);
    trainer_kit::kernels::embed(inputs(), E + m_.slot(ids_.wte).offset, E + m_.slot(ids_.wpe).offset, x_.data(), n, int(T),
                                int(D), stream());
    for (int l = 0; l < s_.layers; ++l) {
      const auto& b = ids_.blocks[std::size_t(l)];
      auto sc = m_.gather(b.unit);
      forward_block(weights_of(b, sc.weights().data()), l, B, T);
    }
  }

  // Attention's heads as the kit's kernels read them (as many kv heads as heads).
  static trainer_kit::kernels::attention_shape shape_of(const model_shape& s) {
    return {s.heads, s.heads, s.head_dim()};
  }

  void forward_block(const block_weights& w, int l, std::size_t B, std::size_t T) {
    const std::size_t n = B * T, D = std::size_t(s_.d), H4 = 4 * D;
    const float* xin = x_.data() + std::size_t(l) * n_max_ * D;
    float* xout = x_.data() + std::size_t(l + 1) * n_max_ * D;
    const slot a = slot_of(l);
    kernels::layernorm<C>(xin, w.ln1_w, w.ln1_b, a.xn1, a.mean1, a.rstd1, int(n), int(D), stream());
    check_launch();
    prod_->run(products::qkv_fwd, [&](bool fuse) {  // qkv = xn1 Wqkv^T + bqkv, in C
      mm<C>({.trans_b = true, .m = int(n), .n = int(3 * D), .k = int(D), .a = a.xn1, .b = w.qkv_w, .d = a.qkv,
             .ep = fuse ? epilogue::bias : epilogue::none, .bias = fuse ? w.qkv_b : nullptr});
      if (fuse) return;
      kernels::add_bias(a.qkv, w.qkv_b, n, int(3 * D), stream());
    });
    attn_.forward(a.qkv, a.y, a.lse, int(B), int(T), stream());
    prod_->linear(products::proj_fwd, a.y, w.proj_w, w.proj_b, xin, a.xmid, n, D, D);  // xmid = x + y Wp^T + bp
    kernels::layernorm<C>(a.xmid, w.ln2_w, w.ln2_b, a.xn2, a.mean2, a.rstd2, int(n), int(D), stream());
    check_launch();
    // act = gelu(h), h = xn2 Wfc^T + bfc kept for backward
    prod_->run(products::fc_fwd, [&](bool fuse) {
      if (fuse) {
        mm<C>({.trans_b = true, .m = int(n), .n = int(H4), .k = int(D), .a = a.xn2, .b = w.fc_w, .d = a.act,
               .ep = epilogue::gelu_aux_bias, .bias = w.fc_b, .aux = a.h});
      } else {
        mm<C>({.trans_b = true, .m = int(n), .n = int(H4), .k = int(D), .a = a.xn2, .b = w.fc_w, .d = a.h});
        kernels::bias_gelu(a.h, w.fc_b, a.act, n, int(H4), stream());
      }
    });
    prod_->linear(products::fcproj_fwd, a.act, w.fc_proj_w, w.fc_proj_b, a.xmid, xout, n, D, H4);  // x' = xmid + act Wp^T + bp
  }

  // dx_ holds d loss / d x_{l+1} (and dx_c_ the same in C); leaves d loss / d x_l.
  void backward_block(int l, std::size_t B, std::size_t T) {
    const auto& b = ids_.blocks[std::size_t(l)];
    auto sc = m_.gather(b.unit);
    const block_weights w = weights_of(b, sc.weights().data());
    if (o_.recompute) forward_block(w, l, B, T);
    const std::size_t n = B * T, D = std::size_t(s_.d), H4 = 4 * D;
    const float* xin = x_.data() + std::size_t(l) * n_max_ * D;
    const slot a = slot_of(l);
    float* dX = dx_.data();
    C* dXc = dx_c_.data();
    // Fresh: the four dW products assign their gradients.
    const grads g = write_grads(sc, {b.ln1_w, b.ln1_b, b.qkv_b, b.proj_b, b.ln2_w, b.ln2_b, b.fc_b, b.fc_proj_b});
    const bool fresh = g.fresh;
    // MLP: x_{l+1} = xmid + gelu(xn2 Wfc^T + bfc) Wp^T + bp
    // act again, unless this block's forward left it: keep_gelu, or --recompute's forward just now.
    if (!o_.keep_gelu && !o_.recompute) {
      kernels::gelu(a.h, a.act, n * H4, stream());
    }
    prod_->weight_grad(products::fcproj_wgrad, dXc, dX, a.act, n, D, H4, g(b.fc_proj_w),
                      resid_db() ? nullptr : g(b.fc_proj_b), fresh);
    if (resid_db()) {  // the LayerNorm backward above summed dX's columns into it
      kernels::drain(resid_db(), g(b.fc_proj_b), int(D), stream());
    }
    C* dH = a.act;  // act is dead now (the next forward writes it again)
    prod_->run(products::fc_dgelu, [&](bool fuse) {  // dH = (dX Wp) gelu'(h)
      if (fuse) {
        mm<C>({.m = int(n), .n = int(H4), .k = int(D), .a = dXc, .b = w.fc_proj_w, .d = dH, .ep = epilogue::dgelu,
               .aux = a.h});
      } else {
        float* dA = big_.data();
        gemm(false, false, int(n), int(H4), int(D), 1.0f, dXc, w.fc_proj_w, 0.0f, dA);
        kernels::gelu_backward(dA, a.h, dH, n * H4, stream());
      }
    });
    prod_->weight_grad(products::fc_wgrad, dH, nullptr, a.xn2, n, H4, D, g(b.fc_w), g(b.fc_b), fresh);
    float* dxn = dsmall_.data();
    gemm(false, false, int(n), int(D), int(H4), 1.0f, dH, w.fc_w, 0.0f, dxn);
    float* proj_db = ln_sums_bias() ? g(b.proj_b) : nullptr;  // summed by this LayerNorm backward
    kernels::layernorm_backward<C>(dxn, a.xmid, w.ln2_w, a.mean2, a.rstd2, dX, dXc, g(b.ln2_w), g(b.ln2_b), int(n),
                                   int(D), stream(), 0, ln_partial(), proj_db);
    check_launch();
    // attention: xmid = x_l + y Wproj^T + bproj
    prod_->weight_grad(products::proj_wgrad, dXc, dX, a.y, n, D, D, g(b.proj_w), proj_db ? nullptr : g(b.proj_b),
                      fresh);
    C* dY = dy_c_.data();
    gemm(false, false, int(n), int(D), int(D), 1.0f, dXc, w.proj_w, 0.0f, dY);
    // dqkv in C; where our kernels ran, in fp32 too (the bias gradient's column sums read it).
    C* dQKVc = big_c_.data();
    float* dQKV = big_.data();
    const bool f32 = attn_.backward(dY, a.qkv, a.y, a.lse, dQKVc, dQKV, dvec_.data(), int(B), int(T), stream());
    prod_->weight_grad(products::qkv_wgrad, dQKVc, f32 ? dQKV : nullptr, a.xn1, n, 3 * D, D, g(b.qkv_w), g(b.qkv_b),
                       fresh);
    gemm(false, false, int(n), int(D), int(3 * D), 1.0f, dQKVc, w.qkv_w, 0.0f, dxn);
    // dX's column sums here are block l-1's fc_proj bias gradient (block 0's feed the embeddings: none)
    kernels::layernorm_backward<C>(dxn, xin, w.ln1_w, a.mean1, a.rstd1, dX, dXc, g(b.ln1_w), g(b.ln1_b), int(n),
                                   int(D), stream(), 0, ln_partial(), l > 0 ? resid_db() : nullptr);
    check_launch();
    sc.reduce_grads();
  }

  // The final LayerNorm and the tied classifier over n rows, chunk by chunk:
  // f(first row, rows) with the chunk's logits (in C) in z_, rows of the padded
  // vocabulary (the padded rows of wte are zero: their logits are never read).
  // The padding keeps every row of the classifier's GEMMs 16-byte aligned:
  // over GPT-2's odd 50257 cuBLAS falls back to kernels three times slower.
  template <class F>
  void head(const C* E, std::size_t n, F&& f) {
    const std::size_t D = std::size_t(s_.d), V = std::size_t(s_.padded_vocab());
    float* st = stats_.data() + stats_.size() - 2 * n_max_;
    kernels::layernorm<C>(x_.data() + std::size_t(s_.layers) * n_max_ * D, E + m_.slot(ids_.lnf_w).offset,
                          E + m_.slot(ids_.lnf_b).offset, xf_.data(), st, st + n_max_, int(n), int(D), stream());
    check_launch();
    const std::size_t step = std::min(chunk_rows, n_max_);
    for (std::size_t r0 = 0; r0 < n; r0 += step) {
      const std::size_t rows = std::min(step, n - r0);
      gemm(false, true, int(rows), int(V), int(D), 1.0f, xf_.data() + r0 * D, E + m_.slot(ids_.wte).offset,
                          0.0f, z_.data());
      f(r0, rows);
    }
  }

  Wrapper& m_;
  const model_ids& ids_;
  model_shape s_;
  net_options o_;
  std::size_t n_max_;
  trainer_kit::attention<C> attn_{int(n_max_ / std::size_t(s_.seq)), s_.seq, shape_of(s_), o_.attention, o_.deterministic};
  double finished_ = 0;
  trainer_kit::buffer_block<tessera::cuda::buffer> block_;  // every buffer below (workspace::cuda_buffers)
  std::span<float> x_, stats_, lse_, xmid_, big_, dx_, dsmall_, dvec_, ln_partial_;
  std::span<float> resid_db_;  // a fc_proj bias gradient, summed by the LayerNorm backward above it (ln_sums_bias)
  std::span<C> qkv_, h_, xn1_, y_, xn2_, xf_, act_, big_c_, dx_c_, dy_c_, z_;
  std::optional<products> prod_;
  std::span<double> loss_, row_loss_;
  trainer_kit::token_slots<std::uint16_t> tokens_;  // each input slot's tokens (--deterministic: grouped by token)
};

}  // namespace gpt
