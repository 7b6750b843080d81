#pragma once
// Forward and backward of the MLP language model on the GPU.
//
// bf16 (mixed precision): every product is a cuBLASLt GEMM on bf16 operands
// with fp32 accumulation; the first layer of a block fuses bias + GELU and
// keeps the GELU input (aux) for backward, the backward product through W2
// fuses the GELU gradient, and each weight-gradient product dW = dY^T X also
// yields the bias gradient (sum over tokens of dY) in fp32. Weight gradients
// are written straight into the wrapper's fp32 gradient buffers (fp32 GEMM
// output, beta = 0 on the first micro-batch of a step, so gradients are never
// zeroed). The embedding gradient is a GEMM too: one-hot rows^T x dX.
// Activations, the residual stream and its gradient are bf16, as under
// PyTorch autocast except that the residual stream there is fp32.
//
// fp32: the same products in strict fp32 (no TF32) and the epilogues as
// separate kernels, so that the GPU matches the host backend. Where cuBLASLt
// lacks a fused form for a shape, the separate kernels run instead.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mlp_lm/cuda_kernels.cuh"
#include "mlp_lm/model.hpp"
#include "mlp_lm/workspace.hpp"
#include "tessera/optim/step_graph.cuh"
#include "tessera/backend/cuda/blaslt.hpp"
#include "tessera/backend/cuda/buffer.hpp"
#include "tessera/backend/cuda/stream.hpp"
#include "trainer_kit/kernels/blas_workspace.cuh"
#include "trainer_kit/buffers.hpp"
#include "trainer_kit/product_forms.cuh"

namespace mlp_lm {

template <class Wrapper>
class cuda_mlp {
  using C = typename Wrapper::compute_type;
  using G = typename Wrapper::grad_type;
  static_assert(std::is_same_v<G, float>, "the GPU trainer accumulates fp32 gradients");
  static_assert(std::is_same_v<C, float> || std::is_same_v<C, tessera::bf16>, "compute weights are fp32 or bf16");
  template <class T> using dbuf = tessera::cuda::buffer<T>;
  template <class T> using problem = tessera::cuda::matmul_problem<C, T>;
  using epilogue = tessera::cuda::epilogue;

  // The products with a fused and a separate form (trainer_kit::product_forms).
  enum product { up, down, gelu_grad, up_grad, down_grad, head_grad, products };

public:
  static constexpr const char* backend_name = "cuda";
  //! The trainer's steps as CUDA graphs (stage(), then forward_backward_staged() in the step).
  template <class Opt> using graph_runner = tessera::step_graph<Opt>;

  cuda_mlp(Wrapper& m, const model_ids& ids, const model_shape& s, std::size_t max_tokens, net_options o = {})
      : m_(m), ids_(ids), s_(s), n_max_(max_tokens), recompute_(o.recompute_gelu) {
    TESSERA_CHECK(o.input_slots >= 1, "cuda_mlp: input_slots ", o.input_slots);
    slots_ = o.input_slots;
    // Every buffer from one list (workspace.hpp), the one tessera-plan counts. The
    // residual stream and GELU inputs share one arena, block by block (see X, Pre);
    // with recomputation one block's GELU output at a time lives in dh_ (it is
    // consumed before dh_ is written in backward, and dh_ is idle in forward).
    const workspace::cuda_buffers<C> b(s, n_max_, o);
    block_ = trainer_kit::buffer_block<tessera::cuda::buffer>(b.list);
    arena_ = block_[b.arena], act_ = block_[b.act], z_ = block_[b.z], dx_ = block_[b.dx], dh_ = block_[b.dh];
    bgrad_ = block_[b.bgrad], one_hot_ = block_[b.one_hot], scratch_ = block_[b.scratch], loss_ = block_[b.loss];
    inputs_ = block_[b.inputs];
    for (auto& p : staged_) p = tessera::cuda::pinned_buffer<std::byte>(input_bytes());
    loss_host_ = tessera::cuda::pinned_buffer<unsigned long long>(1);
    TESSERA_CUDA(cudaMemsetAsync(loss_.data(), 0, sizeof(unsigned long long), tessera::cuda::current_stream()));
    // The fused epilogues where cuBLASLt has them for these shapes (bf16 only:
    // fp32 runs the separate kernels to match the host backend exactly).
    if constexpr (std::is_same_v<C, tessera::bf16>) fused_ = s.layers > 0 && epilogues_supported();
    bgrad_fused_ = std::is_same_v<C, tessera::bf16> && bias_grad_epilogue_supported();
    one_hot_gemm_ = one_hot_supported();
    for (int p : {up, down, gelu_grad}) forms_.allow(std::size_t(p), fused_);
    for (int p : {up_grad, down_grad, head_grad}) forms_.allow(std::size_t(p), bgrad_fused_);
  }

  //! Forces every product's form: fused where cuBLASLt can (true) or separate (false).
  void force_fusion(bool on) {
    for (int p : {up, down, gelu_grad}) forms_.force(std::size_t(p), on, fused_);
    for (int p : {up_grad, down_grad, head_grad}) forms_.force(std::size_t(p), on, bgrad_fused_);
  }
  //! The form each product runs in, with the timings that chose it (after the first step).
  [[nodiscard]] std::string choices() const { return forms_.describe(); }

  //! SMs every GEMM is shaped for (0: all): fewer when collectives run beside
  //! the GEMMs, so a GEMM's waves do not wait on the SMs NCCL holds.
  void set_gemm_sms(int sms) noexcept { gemm_sms_ = sms; }

  [[nodiscard]] bool fused() const noexcept { return fused_; }
  //! What runs fused, in words (for the banner).
  [[nodiscard]] std::string fusion() const {
    std::string f = fused_ ? "bias+GELU and GELU-gradient epilogues" : "separate bias and GELU kernels";
    f += bgrad_fused_ ? ", bias gradients in the weight-gradient GEMMs" : ", bias gradients by column sums";
    if (fused_ || bgrad_fused_) f += " (each fused form kept where it measures faster)";
    f += one_hot_gemm_ ? ", embedding gradient as a one-hot GEMM" : ", embedding gradient by grouped sums";
    if (recompute_) f += ", GELU outputs recomputed in backward";
    return f;
  }
  //! Device bytes this class holds (activations, staging, scratch), for the memory estimate.
  [[nodiscard]] static std::size_t workspace_bytes(const model_shape& s, std::size_t max_tokens, net_options o = {}) {
    return workspace::cuda_bytes<C>(s, max_tokens, o);  // what the constructor allocates
  }

  //! cuBLASLt's workspace on this net's stream (the library's memory counts it).
  [[nodiscard]] static constexpr std::size_t blas_workspace_bytes() { return workspace::cublaslt_bytes; }

  //! One micro-batch on the current stream: forward, loss, backward with
  //! gradients written into the wrapper (scaled by 1 / global_tokens), each
  //! unit's reduction started when its gradients are complete. The summed
  //! loss of these tokens accumulates on the device (see take_loss).
  void forward_backward(const std::uint8_t* ctx, const std::uint8_t* target, std::size_t n, double global_tokens) {
    stage(0, ctx, target, n);
    forward_backward_staged(0, n, global_tokens);
  }
  //! Copies one micro-batch's inputs into input slot `slot` (of
  //! net_options::input_slots) on the current stream, for
  //! forward_backward_staged. The host prepares them while the device works
  //! on what came before.
  void stage(int slot, const std::uint8_t* ctx, const std::uint8_t* target, std::size_t n) {
    TESSERA_CHECK(n <= n_max_, "micro-batch of ", n, " tokens over the planned ", n_max_);
    TESSERA_CHECK(slot >= 0 && slot < slots_, "input slot ", slot, " of ", slots_);
    stage_into(slot, ctx, target, n);
  }
  //! A step's `count` micro-batches of n tokens each, staged in slots 0 ..
  //! count - 1: begin_micro_batch and forward_backward_staged for each (what
  //! the trainer's and the benchmark's step graphs capture).
  void forward_backward_slots(int count, std::size_t n, double global_tokens) {
    for (int mb = 0; mb < count; ++mb) {
      m_.begin_micro_batch(mb, count);
      forward_backward_staged(mb, n, global_tokens);
    }
  }
  //! forward_backward on the inputs stage() put in `slot`: only device work
  //! with the same arguments every step, so a step graph can capture it.
  void forward_backward_staged(int slot, std::size_t n, double global_tokens) {
    TESSERA_CHECK(n <= n_max_, "micro-batch of ", n, " tokens over the planned ", n_max_);
    TESSERA_CHECK(slot >= 0 && slot < slots_, "input slot ", slot, " of ", slots_);
    const int N = int(n), d = s_.d, e = s_.e(), hd = s_.hidden(), L = s_.layers;
    const std::size_t H = std::size_t(hd);
    const auto [dctx, dtgt, order, starts] = staged(slot);
    auto off = [&](tessera::param_id p) { return m_.slot(p).offset; };

    // ---- forward ----
    {
      auto sc = m_.gather(ids_.embed);
      gpu::embed_forward(sc.weight(ids_.table).data(), dctx, N, s_.ctx, e, X(0));
    }
    for (int l = 0; l < L; ++l) {
      const auto& b = ids_.blocks[std::size_t(l)];
      auto sc = m_.gather(b.unit);
      const C* w = sc.weights().data();
      const C *W1 = w + off(b.w1), *B1 = w + off(b.b1), *W2 = w + off(b.w2), *B2 = w + off(b.b2);
      // A = gelu(X W1^T + b1), aux = X W1^T + b1
      forms_.run(up, [&](bool fuse) {
        if (fuse) {
          gemm<C>({.trans_b = true, .m = N, .n = hd, .k = d, .a = X(l), .b = W1, .d = act(l),
                   .ep = epilogue::gelu_aux_bias, .bias = B1, .aux = Pre(l)});
        } else {
          gemm<C>({.trans_b = true, .m = N, .n = hd, .k = d, .a = X(l), .b = W1, .d = Pre(l)});
          gpu::bias_gelu(Pre(l), B1, act(l), std::size_t(N), hd);
        }
      });
      // X_{l+1} = X_l + A W2^T + b2
      forms_.run(down, [&](bool fuse) {
        gemm<C>({.trans_b = true, .m = N, .n = d, .k = hd, .a = act(l), .b = W2, .d = X(l + 1), .beta = 1,
                 .ep = fuse ? epilogue::bias : epilogue::none, .bias = B2, .c = X(l)});
        if (!fuse) gpu::add_bias(X(l + 1), B2, std::size_t(N), d);
      });
    }
    // ---- head, loss, and the head's backward ----
    {
      auto sc = m_.gather(ids_.head);
      const C* w = sc.weights().data();
      const C *Wh = w + off(ids_.hw), *Bh = w + off(ids_.hb);
      const bool fuse_bias = forms_.state(down) != 0;
      gemm<C>({.trans_b = true, .m = N, .n = vocab, .k = d, .a = X(L), .b = Wh, .d = z_.data(),
               .ep = fuse_bias ? epilogue::bias : epilogue::none, .bias = Bh});
      if (!fuse_bias) gpu::add_bias(z_.data(), Bh, std::size_t(N), vocab);
      gpu::softmax_xent<vocab>(z_.data(), dtgt, N, float(1.0 / global_tokens), loss_.data());  // z_ becomes dZ
      auto [g, fresh] = sc.grads_for_write();
      // dWh (+)= dZ^T X, dbh (+)= sum over tokens of dZ
      weight_grad(head_grad, z_.data(), X(L), vocab, d, N, g.data() + off(ids_.hw), g.data() + off(ids_.hb),
                  fresh);
      gemm<C>({.m = N, .n = d, .k = vocab, .a = z_.data(), .b = Wh, .d = dx_.data()});  // dX = dZ Wh
      sc.reduce_grads();
    }
    // ---- blocks, last first ----
    for (int l = L - 1; l >= 0; --l) {
      const auto& b = ids_.blocks[std::size_t(l)];
      auto sc = m_.gather(b.unit);
      const C* w = sc.weights().data();
      const C *W1 = w + off(b.w1), *W2 = w + off(b.w2);
      auto [g, fresh] = sc.grads_for_write();
      C* dX = dx_.data();
      C* dH = dh_.data();
      if (recompute_) gpu::gelu(Pre(l), act(l), std::size_t(N) * H);  // into dh_, read by dW2 before dH lands
      // dW2 (+)= dY^T A, db2 (+)= sum over tokens of dY
      weight_grad(down_grad, dX, act(l), d, hd, N, g.data() + off(b.w2), g.data() + off(b.b2), fresh);
      forms_.run(gelu_grad, [&](bool fuse) {  // dH = (dY W2) * gelu'(pre)
        if (fuse) {
          gemm<C>({.m = N, .n = hd, .k = d, .a = dX, .b = W2, .d = dH, .ep = epilogue::dgelu, .aux = Pre(l)});
        } else {
          gemm<C>({.m = N, .n = hd, .k = d, .a = dX, .b = W2, .d = dH});
          gpu::gelu_backward(dH, Pre(l), dH, std::size_t(N) * H);
        }
      });
      // dW1 (+)= dH^T X, db1 (+)= sum over tokens of dH
      weight_grad(up_grad, dH, X(l), hd, d, N, g.data() + off(b.w1), g.data() + off(b.b1), fresh);
      gemm<C>({.m = N, .n = d, .k = hd, .a = dH, .b = W1, .d = dX, .beta = 1});            // dX += dH W1
      sc.reduce_grads();
    }
    {
      auto sc = m_.gather(ids_.embed);
      auto [g, fresh] = sc.grads_for_write();
      if (one_hot_gemm_) {  // gE (+)= onehot(bytes)^T dX, with dX as [n ctx, e]
        gpu::one_hot(dctx, std::size_t(N) * std::size_t(s_.ctx), one_hot_.data());
        gemm<float>({.trans_a = true, .m = vocab, .n = e, .k = N * s_.ctx, .a = one_hot_.data(), .b = dx_.data(),
                     .d = g.data() + off(ids_.table), .beta = fresh ? 0.0f : 1.0f});
      } else {
        gpu::embed_backward(dx_.data(), order, starts, e, g.data() + off(ids_.table), fresh);
      }
      sc.reduce_grads();
    }
  }

  //! Lends each unit's reduced gradient shard the memory of that unit's own
  //! activations (wrapper_options::lend_grad_shards): block l's GELU input and
  //! output stream (dead once block l's backward ran, which comes before its
  //! reduction), the head's logits, the embedding's output. A unit whose
  //! activations are smaller than its shard gets a buffer of its own; returns
  //! the bytes of those, for the memory estimate.
  std::size_t lend_grad_shards() {
    const workspace::lend_regions cap = workspace::lend_capacity(s_, n_max_);  // tessera-plan counts the same
    std::size_t own = 0;
    auto lend = [&](tessera::unit_id u, C* region, std::size_t elems) {
      const std::size_t need = m_.layout(u).shard_numel();
      std::span<float> mem(reinterpret_cast<float*>(region), elems * sizeof(C) / sizeof(float));
      if (mem.size() < need) {
        own_shards_.emplace_back(need);
        own += need * sizeof(float);
        mem = own_shards_.back().span();
      }
      m_.lend_grad_shard(u, mem);
    };
    for (int l = 0; l < s_.layers; ++l) lend(ids_.blocks[std::size_t(l)].unit, Pre(l), cap.block);
    lend(ids_.head, z_.data(), cap.head);
    lend(ids_.embed, X(0), cap.embed);
    return own;
  }

  //! Starts copying the loss summed since the last take_loss to the host (call before the optimizer step).
  void finish_loss() {
    const cudaStream_t s = tessera::cuda::current_stream();
    TESSERA_CUDA(cudaMemcpyAsync(loss_host_.data(), loss_.data(), sizeof(unsigned long long), cudaMemcpyDeviceToHost, s));
    TESSERA_CUDA(cudaMemsetAsync(loss_.data(), 0, sizeof(unsigned long long), s));
    loss_ready_.record(s);
  }
  //! The loss finish_loss copied (waits for the copy only).
  double take_loss() {
    loss_ready_.synchronize();
    return double(static_cast<long long>(*loss_host_.data())) / gpu::loss_unit;  // fixed point (softmax_xent)
  }

private:
  struct staged_inputs {
    const std::uint8_t* ctx;
    const std::uint8_t* target;
    const int* order;
    const int* starts;
  };
  // One device block (and one copy) per micro-batch: context bytes, targets,
  // the (token, position) rows grouped by byte for the embedding gradient, and
  // the group starts. Offsets keep the int arrays 4-byte aligned.
  static std::size_t round4(std::size_t b) { return workspace::round4(b); }
  static std::size_t scratch_floats(const model_shape& s) { return workspace::scratch_floats(s); }
  static std::size_t input_bytes_for(const model_shape& s, std::size_t n) { return workspace::input_bytes(s, n); }
  [[nodiscard]] std::size_t input_bytes() const { return input_bytes_for(s_, n_max_); }

  struct input_offsets {
    std::size_t tgt, order, starts;
  };
  input_offsets offsets() const {
    const std::size_t o_tgt = round4(n_max_ * std::size_t(s_.ctx)), o_order = o_tgt + round4(n_max_),
                      o_starts = o_order + n_max_ * std::size_t(s_.ctx) * sizeof(int);
    return {o_tgt, o_order, o_starts};
  }
  void stage_into(int slot, const std::uint8_t* ctx, const std::uint8_t* target, std::size_t n) {
    const std::size_t rows = n * std::size_t(s_.ctx);
    const input_offsets o = offsets();
    // Double-buffered pinned staging: wait until the copy that last used this half is done.
    const int k = flip_ ^= 1;
    staged_done_[k].synchronize();
    std::byte* h = staged_[k].data();
    std::copy_n(reinterpret_cast<const std::byte*>(ctx), rows, h);
    std::copy_n(reinterpret_cast<const std::byte*>(target), n, h + o.tgt);
    // Counting sort of the rows by byte value (stable: rows stay in order within a byte).
    std::array<int, vocab + 1> start{};
    for (std::size_t r = 0; r < rows; ++r) start[std::size_t(ctx[r]) + 1]++;
    for (int v = 0; v < vocab; ++v) start[std::size_t(v) + 1] += start[std::size_t(v)];
    std::copy(start.begin(), start.end(), reinterpret_cast<int*>(h + o.starts));
    int* order = reinterpret_cast<int*>(h + o.order);
    for (std::size_t r = 0; r < rows; ++r) order[start[ctx[r]]++] = int(r);
    const cudaStream_t s = tessera::cuda::current_stream();
    TESSERA_CUDA(cudaMemcpyAsync(inputs_.data() + std::size_t(slot) * input_bytes(), h, input_bytes(),
                                 cudaMemcpyHostToDevice, s));
    staged_done_[k].record(s);
  }
  staged_inputs staged(int slot) const {
    const input_offsets o = offsets();
    const std::byte* dv = inputs_.data() + std::size_t(slot) * input_bytes();
    return {reinterpret_cast<const std::uint8_t*>(dv), reinterpret_cast<const std::uint8_t*>(dv + o.tgt),
            reinterpret_cast<const int*>(dv + o.order), reinterpret_cast<const int*>(dv + o.starts)};
  }

  // dW[m, n] (+)= dY^T X over k tokens, and db[m] (+)= sum over tokens of dY:
  // one GEMM where cuBLASLt folds the bias gradient in, else GEMM + column sums.
  // Tuned only on a fresh write (assigning twice gives the same result).
  void weight_grad(product p, const C* dY, const C* X, int m, int n, int k, float* dW, float* db, bool fresh) {
    const float beta = fresh ? 0.0f : 1.0f;
    auto go = [&](bool fuse) {
      if (fuse && k > 0) {
        // The epilogue writes the bias gradient; accumulate through scratch when not fresh.
        float* out = fresh ? db : scratch_.data();
        gemm<float>({.trans_a = true, .m = m, .n = n, .k = k, .a = dY, .b = X, .d = dW, .beta = beta,
                     .ep = epilogue::bgrad_a, .bias_grad = out});
        if (!fresh) gpu::add_into(scratch_.data(), db, m);
      } else {
        gemm<float>({.trans_a = true, .m = m, .n = n, .k = k, .a = dY, .b = X, .d = dW, .beta = beta});
        gpu::column_sums(dY, k, m, db, fresh, scratch_);
      }
    };
    if (forms_.state(p) == forms_.unmeasured && !fresh) go(true);
    else forms_.run(p, go);
  }

  bool bias_grad_epilogue_supported() {
    const int N = int(n_max_), d = s_.d, hd = s_.hidden();
    float* any = scratch_.data();
    auto ok = [&](int m, int n) {
      return tessera::cuda::matmul_supported(tessera::cuda::matmul_problem<C, float>{
          .trans_a = true, .m = m, .n = n, .k = N, .a = dh_.data(), .b = X(0), .d = any, .ep = epilogue::bgrad_a,
          .bias_grad = any});
    };
    return ok(d, hd) && ok(hd, d) && ok(vocab, d);
  }
  bool one_hot_supported() {
    return tessera::cuda::matmul_supported(tessera::cuda::matmul_problem<C, float>{
        .trans_a = true, .m = vocab, .n = s_.e(), .k = int(n_max_) * s_.ctx, .a = one_hot_.data(), .b = dx_.data(),
        .d = scratch_.data()});
  }

  // Checks once that cuBLASLt runs both fused epilogues at this model's shapes.
  bool epilogues_supported() {
    const int N = int(n_max_), d = s_.d, hd = s_.hidden();
    C* any = Pre(0);
    return tessera::cuda::matmul_supported(problem<C>{.trans_b = true, .m = N, .n = hd, .k = d, .a = X(0),
                                                      .b = any, .d = act(0), .ep = epilogue::gelu_aux_bias,
                                                      .bias = bgrad_.data(), .aux = Pre(0)}) &&
           tessera::cuda::matmul_supported(problem<C>{.m = N, .n = hd, .k = d, .a = dx_.data(), .b = any,
                                                      .d = dh_.data(), .ep = epilogue::dgelu, .aux = Pre(0)}) &&
           tessera::cuda::matmul_supported(problem<C>{.trans_b = true, .m = N, .n = d, .k = hd, .a = act(0),
                                                      .b = any, .d = X(0), .beta = 1, .ep = epilogue::bias,
                                                      .bias = bgrad_.data()});
  }

  // Arena layout: X(0), then per block l its GELU input Pre(l) followed by its
  // output stream X(l+1). Both are dead once block l's backward ran (X(l+1)
  // was last read by block l+1's), so the block's region can hold its gradient
  // shard from its reduction to the next forward. Offsets in multiples of 8
  // elements keep every matrix 16-byte aligned.
  static std::size_t round8(std::size_t n) { return workspace::round8(n); }
  static std::size_t block_stride(const model_shape& s, std::size_t n) { return workspace::block_stride(s, n); }
  C* Pre(int l) { return arena_.data() + round8(n_max_ * std::size_t(s_.d)) + std::size_t(l) * block_stride(s_, n_max_); }
  C* X(int l) { return l == 0 ? arena_.data() : Pre(l - 1) + round8(n_max_ * std::size_t(s_.hidden())); }

  // Block l's GELU output: kept per block, or (recomputed) one at a time in dh_.
  C* act(int l) { return recompute_ ? dh_.data() : act_.data() + std::size_t(l) * n_max_ * std::size_t(s_.hidden()); }

  template <class TD>
  void gemm(problem<TD> p) const {
    p.tf32 = false;  // fp32 runs in strict fp32, to match the host
    p.sm_count = gemm_sms_;
    tessera::cuda::matmul(p);
  }

  Wrapper& m_;
  const model_ids& ids_;
  model_shape s_;
  std::size_t n_max_;
  trainer_kit::product_forms<products> forms_{{"X W1^T + b1, GELU", "A W2^T + b2 + X", "GELU gradient", "dW1 and db1",
                                               "dW2 and db2", "dWh and dbh"}};
  bool fused_ = false, bgrad_fused_ = false, one_hot_gemm_ = false;
  trainer_kit::buffer_block<tessera::cuda::buffer> block_;  // every span below (workspace::cuda_buffers)
  std::span<C> arena_, act_, z_, dx_, dh_, bgrad_, one_hot_;
  std::vector<dbuf<float>> own_shards_;  // gradient shards of units whose activations are too small to lend
  std::span<float> scratch_;
  std::span<unsigned long long> loss_;
  std::span<std::byte> inputs_;
  std::array<tessera::cuda::pinned_buffer<std::byte>, 2> staged_;
  std::array<tessera::cuda::event, 2> staged_done_;
  tessera::cuda::pinned_buffer<unsigned long long> loss_host_;
  tessera::cuda::event loss_ready_;
  int flip_ = 0;
  int slots_ = 1;
  int gemm_sms_ = 0;
  bool recompute_ = false;
};

}  // namespace mlp_lm
