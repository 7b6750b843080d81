#pragma once
// Causal attention for a CUDA net, on the fastest kernels that run its shape:
// cuDNN's fused SDPA (bf16, where the build has cuDNN and it takes the shape:
// trainer_kit/cudnn_attention.hpp), the flash kernels (bf16, head dimension
// 64, as many kv heads as heads, sm_80 or newer: kernels/flash.cuh), else the
// exact kernels (fp32 arithmetic, grouped kv heads: kernels/attention.cuh),
// which fp32 always runs (the host's arithmetic). `mode` auto picks in that
// order; cudnn, flash and exact insist (an error where they cannot run).
// cuDNN's graphs are built for the training shape (batch x seq); other shapes
// (sampling) run flash or exact. --deterministic: cuDNN's deterministic
// backward, or dk and dv in a fixed order in ours.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <type_traits>

#include "tessera/core/error.hpp"
#include "trainer_kit/cudnn_attention.hpp"
#include "trainer_kit/kernels/attention.cuh"
#include "trainer_kit/kernels/elementwise.cuh"
#include "trainer_kit/kernels/flash.cuh"

namespace trainer_kit {

template <class C>
class attention {
  static constexpr bool fp32 = std::is_same_v<C, float>;

public:
  //! Whether the flash kernels run `a` in `mode` here (what a net's buffer list needs to know: their row dots).
  [[nodiscard]] static bool uses_flash(kernels::attention_shape a, const std::string& mode) {
    return !fp32 && mode != "exact" && a.hd == flash::head_dim && a.KV == a.H && flash::supported();
  }

  attention(int batch, int seq, kernels::attention_shape a, const std::string& mode, bool deterministic)
      : a_(a), deterministic_(deterministic), flash_(uses_flash(a, mode)) {
    TESSERA_CHECK(mode != "flash" || flash_, "--attention flash runs bf16 at head dimension ", flash::head_dim,
                  " with as many kv heads as heads, on sm_80 or newer; this run has ", fp32 ? "fp32" : "bf16",
                  ", head dimension ", a.hd, " and ", a.KV, " kv heads of ", a.H);
    TESSERA_CHECK(mode != "cudnn" || !fp32, "--attention cudnn runs bf16 (--precision bf16)");
    if (!fp32 && (mode == "auto" || mode == "cudnn")) {
      try {
        cudnn_ = std::make_unique<cudnn_attention>(batch, seq, a.H, a.KV, a.hd, deterministic);
      } catch (const tessera::error& e) {
        if (mode == "cudnn") throw;
        cudnn_why_ = e.what();
      }
    }
    TESSERA_CHECK(cudnn_ || flash_ || seq <= 8192,
                  "the exact CUDA attention keeps a row of scores in shared memory: --seq at most 8192");
  }

  //! Which kernels run, in words (the banner and the summary).
  [[nodiscard]] std::string name() const {
    if (cudnn_)
      return "cudnn (fused SDPA" + std::string(deterministic_ ? ", deterministic backward" : "") + ", " +
             cudnn_attention::version() + ")";
    const std::string why = cudnn_why_.empty() ? "" : "; cuDNN not used: " + cudnn_why_;
    return (flash_ ? "flash (bf16 tensor cores" : "exact (fp32 arithmetic, a query row per block") +
           std::string(deterministic_ ? "; gradients in a fixed order" : "") + why + ")";
  }
  //! cuDNN's workspace (device bytes, known once built).
  [[nodiscard]] std::size_t workspace_bytes() const { return cudnn_ ? cudnn_->workspace_bytes() : 0; }
  [[nodiscard]] bool flash() const noexcept { return flash_; }

  //! y (B T, H hd) and lse (B T H) from qkv rows (B T, (H + 2 KV) hd).
  void forward(const C* qkv, C* y, float* lse, int B, int T, cudaStream_t s) const {
    if (on_cudnn(B, T)) return cudnn_->forward(qkv, y, lse, s);
    if (flash_) {
      flash::forward<C>(qkv, y, lse, B, T, a_.H, s);
      return kernels::check_launch();
    }
    kernels::exact_attention(qkv, y, lse, B, T, a_, s);
  }
  //! dqkv in C (written whole) from dy and the forward's qkv, y, lse. Our
  //! kernels add into `f32` (B T x row floats) first, and `dvec` (B T H floats)
  //! holds their row dots (flash, or the ordered backward); returns whether
  //! `f32` holds the fp32 gradient (a caller may sum its bias from it).
  bool backward(const C* dy, const C* qkv, const C* y, const float* lse, C* dqkv, float* f32, float* dvec, int B, int T,
                cudaStream_t s) const {
    if (on_cudnn(B, T)) {
      cudnn_->backward(dy, qkv, y, lse, dqkv, s);
      return false;
    }
    const std::size_t total = std::size_t(B) * std::size_t(T) * std::size_t(a_.row());
    TESSERA_CUDA(cudaMemsetAsync(f32, 0, total * sizeof(float), s));
    if (flash_) {
      flash::backward<C>(dy, qkv, y, lse, dvec, f32, B, T, a_.H, s, deterministic_);
      kernels::check_launch();
    } else {
      kernels::exact_attention_backward(dy, qkv, y, lse, f32, B, T, a_, deterministic_ ? dvec : nullptr, s);
    }
    kernels::convert_into(f32, dqkv, total, s);
    return true;
  }

private:
  [[nodiscard]] bool on_cudnn(int B, int T) const { return cudnn_ && B == cudnn_->batch() && T == cudnn_->seq(); }
  kernels::attention_shape a_;
  bool deterministic_, flash_;
  std::unique_ptr<cudnn_attention> cudnn_;  // the training shape's graphs, where cuDNN runs
  std::string cudnn_why_;                   // why not, in auto
};

}  // namespace trainer_kit
