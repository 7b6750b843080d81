#pragma once
// GPT-2's forward and backward on the CUDA backend, the same protocol and
// arithmetic as host_compute.hpp: cuBLASLt products on compute-type operands
// (fp32 or bf16), cuda_kernels.cuh for the rest. The residual stream, the
// products that feed it and LayerNorm statistics are fp32; the classifier
// runs in chunks of rows over the padded vocabulary (its logits in the
// compute type, as under PyTorch autocast, and their gradient written over
// them), so the logits of
// the whole batch are never in memory. Attention is cuda_flash.cuh's
// tensor-core kernels in bf16 and the exact kernels of cuda_kernels.cuh in
// fp32.
//
// bf16: each product with a cuBLASLt epilogue (bias, bias + GELU keeping the
// GELU input, GELU gradient, bias gradient) runs fused where cuBLASLt has the
// form and it measures faster (trainer_kit::product_forms, timed in the first
// step); the GELU input is kept in bf16, as under PyTorch autocast. fp32: the
// separate forms only, so that the GPU matches the host backend.
//
// --deterministic (net_options): every sum that the default kernels take
// with atomics takes a fixed order instead (cuda_ordered.cuh, the ordered
// LayerNorm backward, attention's dq or dk and dv without atomics, cuDNN's
// deterministic backward), and the products run fused wherever cuBLASLt can,
// with no timing.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nvtx3/nvToolsExt.h>

#include "gpt/cuda_flash.cuh"
#include "gpt/cuda_kernels.cuh"
#include "gpt/cuda_layernorm.cuh"
#include "gpt/cuda_ordered.cuh"
#include "gpt/cudnn_attention.hpp"
#include "gpt/cuda_products.cuh"
#include "gpt/data.hpp"
#include "gpt/host_compute.hpp"
#include "gpt/model.hpp"
#include "gpt/workspace.hpp"
#include "tessera/backend/cuda/blaslt.hpp"
#include "tessera/backend/cuda/buffer.hpp"
#include "tessera/backend/cuda/stream.hpp"
#include "tessera/optim/step_graph.cuh"

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
    constexpr bool fp32 = std::is_same_v<C, float>;
    TESSERA_CHECK(o.attention != "flash" || uses_flash(s), "--attention flash runs bf16 at head dimension ",
                  flash::head_dim, " on sm_80 or newer; this run has ", fp32 ? "fp32" : "bf16", " and head dimension ",
                  s.head_dim());
    TESSERA_CHECK(o.attention != "cudnn" || !fp32, "--attention cudnn runs bf16 (--precision bf16)");
    TESSERA_CHECK(!o.deterministic || workspace::layernorm_ordered_fits(s.d), workspace::layernorm_ordered_refusal(s.d));
    TESSERA_CHECK(o.input_slots >= 1, "cuda_gpt: input_slots ", o.input_slots, " (at least 1)");
    // --deterministic's token groups (the embedding's ordered backward) are one
    // micro-batch's: a step graph of it holds one micro-batch.
    TESSERA_CHECK(!o.deterministic || o.input_slots == 1, "cuda_gpt: --deterministic holds one micro-batch's tokens "
                  "(input_slots 1; it has ", o.input_slots, ")");
    // cuDNN's fused attention for the training shape (batch x seq); other
    // shapes (sampling) run flash or exact. In auto, a cuDNN that cannot run
    // this shape leaves flash, and the banner says why.
    if (!fp32 && (o.attention == "auto" || o.attention == "cudnn")) {
      try {
        cudnn_ = std::make_unique<cudnn_attention>(batch, s.seq, s.heads, s.head_dim(), o.deterministic);
      } catch (const tessera::error& e) {
        if (o.attention == "cudnn") throw;
        cudnn_why_ = e.what();
      }
    }
    TESSERA_CHECK(flash_ || s.seq <= 8192, "the exact CUDA attention keeps a row of scores in shared memory: --seq at most 8192");
    const std::size_t n = n_max_, D = std::size_t(s.d), L = std::size_t(s.layers), slots = o.recompute ? 1 : L;
    x_ = dbuf<float>((L + 1) * n * D);
    stats_ = dbuf<float>(slots * 4 * n + 2 * n);  // per block: mean, rstd of both LayerNorms; then the final one's
    lse_ = dbuf<float>(slots * n * std::size_t(s.heads));
    qkv_ = dbuf<C>(slots * 3 * n * D);
    xmid_ = dbuf<float>(slots * n * D);
    h_ = dbuf<C>(slots * 4 * n * D);
    xn1_ = dbuf<C>(slots * n * D), y_ = dbuf<C>(slots * n * D), xn2_ = dbuf<C>(slots * n * D);
    xf_ = dbuf<C>(n * D);
    // GELU output (forward and backward; every block's with keep_gelu), then dH
    act_ = dbuf<C>((o.keep_gelu ? slots : 1) * 4 * n * D);
    big_ = dbuf<float>(4 * n * D);  // dA, dqkv
    big_c_ = dbuf<C>(3 * n * D);    // dqkv in C
    dx_ = dbuf<float>(n * D), dsmall_ = dbuf<float>(n * D), dx_c_ = dbuf<C>(n * D), dy_c_ = dbuf<C>(n * D);
    const std::size_t rows = std::min(chunk_rows, n);
    z_ = dbuf<C>(rows * std::size_t(s.padded_vocab()));  // logits, then their gradient in place
    tok_ = dbuf<std::uint16_t>(std::size_t(o.input_slots) * 2 * n);  // per slot: inputs, then targets
    loss_ = dbuf<double>(1);
    if (flash_ || o.deterministic) dvec_ = dbuf<float>(n * std::size_t(s.heads));
    if (o.deterministic) {
      row_loss_ = dbuf<double>(n);
      ln_partial_ = dbuf<float>(workspace::layernorm_partial_floats(s.d));
      groups_dev_ = dbuf<int>(workspace::token_group_ints(n));
    } else {
      resid_db_ = dbuf<float>(D);
    }
    TESSERA_CUDA(cudaMemsetAsync(loss_.data(), 0, sizeof(double), stream()));
    prod_.decide(n_max_, s.d, act_.data(), big_.data());
  }

  //! Which attention kernels run: the flash kernels on tensor cores (bf16 compute, head
  //! dimension 64, sm_80 or newer), else the exact ones (cuda_kernels.cuh; fp32 arithmetic, in
  //! the compute type's inputs and outputs: fp32, or bf16 where flash does not apply).
  [[nodiscard]] std::string attention_name() const {
    if (cudnn_) return "cudnn (fused SDPA" + std::string(o_.deterministic ? ", deterministic backward" : "") + ", " +
                       cudnn_attention::version() + ")";
    std::string why = cudnn_why_.empty() ? "" : "; cuDNN not used: " + cudnn_why_;
    return (flash_ ? "flash (bf16 tensor cores" : "exact (fp32 arithmetic, a query row per block") +
           std::string(o_.deterministic ? "; gradients in a fixed order" : "") + why + ")";
  }
  //! The form each product with a cuBLASLt epilogue runs in (after the first step: the timings that chose it).
  [[nodiscard]] std::string products_used() const {
    return prod_.describe() + (ln_sums_bias() ? "; proj and fc_proj bias gradients: column sums in the LayerNorm "
                                                "backward (their dW products plain)" : "");
  }
  [[nodiscard]] static bool uses_flash(const model_shape& s) {
    return !std::is_same_v<C, float> && s.head_dim() == flash::head_dim && flash::supported();
  }

  //! Device bytes this class holds, for the memory estimate.
  [[nodiscard]] static std::size_t workspace_bytes(const model_shape& s, int batch, net_options o = {}) {
    return workspace::cuda_bytes<C>(s, batch, o.recompute, uses_flash(s), o.deterministic, o.input_slots, o.keep_gelu);
  }
  //! Device bytes known once the net is built: cuDNN's attention workspace.
  [[nodiscard]] std::size_t runtime_workspace_bytes() const { return cudnn_ ? cudnn_->workspace_bytes() : 0; }
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
    TESSERA_CHECK(slot >= 0 && std::size_t(slot) < slots(), "input slot ", slot, " of ", slots());
    TESSERA_CHECK(std::size_t(batch) * std::size_t(s_.seq) <= n_max_, "micro-batch of ", batch,
                  " sequences over the planned ", n_max_ / std::size_t(s_.seq));
    upload(seqs, std::size_t(batch), std::size_t(s_.seq), true, slot);
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
    TESSERA_CHECK(slot >= 0 && std::size_t(slot) < slots(), "input slot ", slot, " of ", slots());
    in_slot_ = std::size_t(slot);
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
    if (o_.deterministic) {  // positions in sequence order, tokens grouped (upload built the groups)
      kernels::position_backward_kernel<float><<<grid(T * D), 256, 0, stream()>>>(dx_.data(), ge(ids_.wpe),
                                                                                  int(B), int(T), int(D));
      check_launch();
      groups_.backward(dx_.data(), groups_dev_.data(), g_wte, int(D), stream());
    } else {
      kernels::embed_backward_kernel<float><<<grid(n * D), 256, 0, stream()>>>(
          dx_.data(), inputs(), g_wte, ge(ids_.wpe), n, int(T), int(D));
      check_launch();
    }
    se.reduce_grads();
  }

  //! Forward only: the summed cross-entropy of `batch` sequences (waits for it).
  double forward_loss(const std::uint16_t* seqs, int batch) {
    const std::size_t B = std::size_t(batch), T = std::size_t(s_.seq), n = B * T, V = std::size_t(s_.vocab);
    upload(seqs, B, T);
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
    std::vector<std::uint16_t> both(2 * T, 0);
    std::copy_n(tokens, T, both.begin());
    in_slot_ = 0;
    TESSERA_CUDA(cudaMemcpyAsync(tok_.data(), both.data(), T * sizeof(std::uint16_t), cudaMemcpyHostToDevice, stream()));
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
  // The tokens the micro-batch being issued reads (slot in_slot_).
  const std::uint16_t* inputs() const { return tok_.data() + in_slot_ * 2 * n_max_; }
  const std::uint16_t* targets() const { return inputs() + n_max_; }
  std::size_t slots() const { return tok_.size() / (2 * n_max_); }
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

  // Inputs and next-token targets of B sequences of T + 1 tokens, to the
  // device; with `groups` under --deterministic, the inputs' rows grouped by
  // token too (the embedding's backward in a fixed order).
  void upload(const std::uint16_t* seqs, std::size_t B, std::size_t T, bool groups = false, int slot = 0) {
    host_tok_.assign(2 * n_max_, 0);
    split_sequences(seqs, B, T, host_tok_.data(), host_tok_.data() + n_max_);
    in_slot_ = std::size_t(slot);
    TESSERA_CUDA(cudaMemcpyAsync(tok_.data() + in_slot_ * 2 * n_max_, host_tok_.data(), host_tok_.size() * sizeof(std::uint16_t),
                                 cudaMemcpyHostToDevice, stream()));
    if (groups && o_.deterministic) {
      groups_.build(host_tok_.data(), B * T, s_.padded_vocab());
      TESSERA_CUDA(cudaMemcpyAsync(groups_dev_.data(), groups_.ints.data(), groups_.ints.size() * sizeof(int),
                                   cudaMemcpyHostToDevice, stream()));
    }
    TESSERA_CUDA(cudaStreamSynchronize(stream()));  // host_tok_ and the groups are reused by the next call
  }

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

  // A unit's gradients as the backward writes them: g(p) is parameter p's.
  struct grads {
    float* data;
    const Wrapper* m;
    bool fresh;  // the step's first micro-batch: nothing to add to
    float* operator()(tessera::param_id p) const { return data + m->slot(p).offset; }
  };
  // The library does not zero fresh gradients (grads_for_write): the products
  // that assign write with beta = 0, and `added`, the parameters whose
  // gradients kernels add into, are zeroed here in one launch.
  template <class Scope>
  grads write_grads(Scope& scope, std::initializer_list<tessera::param_id> added) {
    const auto target = scope.grads_for_write();
    const grads g{target.grads.data(), &m_, target.fresh};
    if (g.fresh) {
      kernels::float_spans vs;
      for (const tessera::param_id p : added) vs.add(g(p), m_.slot(p).numel);
      kernels::zero_spans(vs, stream());
    }
    return g;
  }

  void forward_blocks(const C* E, std::size_t B, std::size_t T) {
    const std::size_t n = B * T, D = std::size_t(s_.d);
    kernels::embed_kernel<C><<<grid(n * D), 256, 0, stream()>>>(inputs(), E + m_.slot(ids_.wte).offset,
                                                                 E + m_.slot(ids_.wpe).offset, x_.data(), n, int(T), int(D));
    check_launch();
    for (int l = 0; l < s_.layers; ++l) {
      const auto& b = ids_.blocks[std::size_t(l)];
      auto sc = m_.gather(b.unit);
      forward_block(weights_of(b, sc.weights().data()), l, B, T);
    }
  }

  //! Whether cuDNN runs attention at this shape (the training batch x seq).
  [[nodiscard]] bool on_cudnn(std::size_t B, std::size_t T) const {
    return cudnn_ && int(B) == cudnn_->batch() && int(T) == cudnn_->seq();
  }

  void attention(const slot& a, std::size_t B, std::size_t T) {
    if (on_cudnn(B, T)) {
      cudnn_->forward(a.qkv, a.y, a.lse, stream());
      return;
    }
    if (flash_) {
      flash::forward<C>(a.qkv, a.y, a.lse, int(B), int(T), s_.heads, stream());
      check_launch();
      return;
    }
    const dim3 g(unsigned(T), unsigned(B * std::size_t(s_.heads)));
    const std::size_t smem = (T + 32) * sizeof(float);
    kernels::attention_kernel<C><<<g, 128, smem, stream()>>>(a.qkv, a.y, a.lse, int(T), s_.heads, s_.head_dim());
    check_launch();
  }

  void forward_block(const block_weights& w, int l, std::size_t B, std::size_t T) {
    const std::size_t n = B * T, D = std::size_t(s_.d), H4 = 4 * D;
    const float* xin = x_.data() + std::size_t(l) * n_max_ * D;
    float* xout = x_.data() + std::size_t(l + 1) * n_max_ * D;
    const slot a = slot_of(l);
    kernels::layernorm<C>(xin, w.ln1_w, w.ln1_b, a.xn1, a.mean1, a.rstd1, int(n), int(D), stream());
    check_launch();
    prod_.run(products::qkv_fwd, [&](bool fuse) {  // qkv = xn1 Wqkv^T + bqkv, in C
      mm<C>({.trans_b = true, .m = int(n), .n = int(3 * D), .k = int(D), .a = a.xn1, .b = w.qkv_w, .d = a.qkv,
             .ep = fuse ? epilogue::bias : epilogue::none, .bias = fuse ? w.qkv_b : nullptr});
      if (fuse) return;
      kernels::bias_kernel<C, C><<<grid(n * 3 * D), 256, 0, stream()>>>(a.qkv, w.qkv_b, n, int(3 * D));
      check_launch();
    });
    attention(a, B, T);
    prod_.linear(products::proj_fwd, a.y, w.proj_w, w.proj_b, xin, a.xmid, n, D, D);  // xmid = x + y Wp^T + bp
    kernels::layernorm<C>(a.xmid, w.ln2_w, w.ln2_b, a.xn2, a.mean2, a.rstd2, int(n), int(D), stream());
    check_launch();
    // act = gelu(h), h = xn2 Wfc^T + bfc kept for backward
    prod_.run(products::fc_fwd, [&](bool fuse) {
      if (fuse) {
        mm<C>({.trans_b = true, .m = int(n), .n = int(H4), .k = int(D), .a = a.xn2, .b = w.fc_w, .d = a.act,
               .ep = epilogue::gelu_aux_bias, .bias = w.fc_b, .aux = a.h});
      } else {
        mm<C>({.trans_b = true, .m = int(n), .n = int(H4), .k = int(D), .a = a.xn2, .b = w.fc_w, .d = a.h});
        kernels::bias_gelu_kernel<C, C><<<grid(n * H4), 256, 0, stream()>>>(a.h, w.fc_b, a.act, n, int(H4));
        check_launch();
      }
    });
    prod_.linear(products::fcproj_fwd, a.act, w.fc_proj_w, w.fc_proj_b, a.xmid, xout, n, D, H4);  // x' = xmid + act Wp^T + bp
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
      kernels::gelu_kernel<C, C><<<grid(n * H4), 256, 0, stream()>>>(a.h, a.act, n * H4);
      check_launch();
    }
    prod_.weight_grad(products::fcproj_wgrad, dXc, dX, a.act, n, D, H4, g(b.fc_proj_w),
                      resid_db() ? nullptr : g(b.fc_proj_b), fresh);
    if (resid_db()) {  // the LayerNorm backward above summed dX's columns into it
      kernels::drain_kernel<<<grid(D), 256, 0, stream()>>>(resid_db(), g(b.fc_proj_b), int(D));
      check_launch();
    }
    C* dH = a.act;  // act is dead now (the next forward writes it again)
    prod_.run(products::fc_dgelu, [&](bool fuse) {  // dH = (dX Wp) gelu'(h)
      if (fuse) {
        mm<C>({.m = int(n), .n = int(H4), .k = int(D), .a = dXc, .b = w.fc_proj_w, .d = dH, .ep = epilogue::dgelu,
               .aux = a.h});
      } else {
        float* dA = big_.data();
        gemm(false, false, int(n), int(H4), int(D), 1.0f, dXc, w.fc_proj_w, 0.0f, dA);
        kernels::gelu_backward_kernel<C, C><<<grid(n * H4), 256, 0, stream()>>>(dA, a.h, dH, n * H4);
        check_launch();
      }
    });
    prod_.weight_grad(products::fc_wgrad, dH, nullptr, a.xn2, n, H4, D, g(b.fc_w), g(b.fc_b), fresh);
    float* dxn = dsmall_.data();
    gemm(false, false, int(n), int(D), int(H4), 1.0f, dH, w.fc_w, 0.0f, dxn);
    float* proj_db = ln_sums_bias() ? g(b.proj_b) : nullptr;  // summed by this LayerNorm backward
    kernels::layernorm_backward<C>(dxn, a.xmid, w.ln2_w, a.mean2, a.rstd2, dX, dXc, g(b.ln2_w), g(b.ln2_b), int(n),
                                   int(D), stream(), 0, ln_partial(), proj_db);
    check_launch();
    // attention: xmid = x_l + y Wproj^T + bproj
    prod_.weight_grad(products::proj_wgrad, dXc, dX, a.y, n, D, D, g(b.proj_w), proj_db ? nullptr : g(b.proj_b),
                      fresh);
    C* dY = dy_c_.data();
    gemm(false, false, int(n), int(D), int(D), 1.0f, dXc, w.proj_w, 0.0f, dY);
    C* dQKVc = big_c_.data();
    if (on_cudnn(B, T)) {  // dqkv in C, written whole
      cudnn_->backward(dY, a.qkv, a.y, a.lse, dQKVc, stream());
      prod_.weight_grad(products::qkv_wgrad, dQKVc, nullptr, a.xn1, n, 3 * D, D, g(b.qkv_w), g(b.qkv_b), fresh);
    } else {  // our kernels add into fp32 (dQ with atomics), then the C copy for the GEMMs
      float* dQKV = big_.data();
      TESSERA_CUDA(cudaMemsetAsync(dQKV, 0, n * 3 * D * sizeof(float), stream()));
      if (flash_) {
        flash::backward<C>(dY, a.qkv, a.y, a.lse, dvec_.data(), dQKV, int(B), int(T), s_.heads, stream(),
                           o_.deterministic);
        check_launch();
      } else {
        const dim3 gr(unsigned(T), unsigned(B * std::size_t(s_.heads)));
        // --deterministic: dq and each row's D here, then dk and dv in a fixed order.
        float* Dvec = o_.deterministic ? dvec_.data() : nullptr;
        kernels::attention_backward_kernel<C><<<gr, 128, (T + 32) * sizeof(float), stream()>>>(
            dY, a.qkv, a.y, a.lse, dQKV, int(T), s_.heads, s_.head_dim(), Dvec);
        if (Dvec)
          kernels::attention_backward_kv_kernel<C><<<gr, 128, 0, stream()>>>(dY, a.qkv, a.lse, Dvec, dQKV, int(T),
                                                                            s_.heads, s_.head_dim());
        check_launch();
      }
      kernels::convert_kernel<C><<<grid(n * 3 * D), 256, 0, stream()>>>(dQKV, dQKVc, n * 3 * D);
      check_launch();
      prod_.weight_grad(products::qkv_wgrad, dQKVc, dQKV, a.xn1, n, 3 * D, D, g(b.qkv_w), g(b.qkv_b), fresh);
    }
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
  bool flash_ = uses_flash(s_) && o_.attention != "exact";
  std::unique_ptr<cudnn_attention> cudnn_;  // the training shape's graphs, where cuDNN runs
  std::string cudnn_why_;                   // why not, in auto
  std::size_t n_max_;
  double finished_ = 0;
  std::size_t in_slot_ = 0;  // the input slot being read (upload, forward_backward_staged)
  dbuf<float> x_, stats_, lse_, xmid_, big_, dx_, dsmall_, dvec_, ln_partial_;
  dbuf<float> resid_db_;  // a fc_proj bias gradient, summed by the LayerNorm backward above it (ln_sums_bias)
  dbuf<C> qkv_, h_, xn1_, y_, xn2_, xf_, act_, big_c_, dx_c_, dy_c_, z_;
  products prod_{s_.d, n_max_, o_.deterministic};
  dbuf<std::uint16_t> tok_;
  dbuf<double> loss_, row_loss_;
  kernels::token_groups groups_;  // --deterministic: the micro-batch's rows by token, and their device copy
  dbuf<int> groups_dev_;
  std::vector<std::uint16_t> host_tok_;
};

}  // namespace gpt
