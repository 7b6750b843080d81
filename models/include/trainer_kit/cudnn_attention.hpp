#pragma once
// Causal attention in bf16 through cuDNN's fused SDPA (its flash attention
// forward and backward), where the build found cuDNN and its frontend
// headers (meson: TESSERA_HAVE_CUDNN; scripts/setup installs the headers with
// pip's nvidia-cudnn-frontend). The frontend is host C++ that takes long to
// compile, so it lives in one translation unit of its own
// (examples/kit/cudnn_attention.cpp, compiled by the C++ compiler); the CUDA
// nets see this interface only. Without cuDNN a trainer runs its own kernels
// and says so.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <string>

namespace trainer_kit {

class cudnn_attention {
public:
  //! Whether this build has cuDNN (else the constructor throws).
  [[nodiscard]] static bool compiled() noexcept;
  //! "cuDNN 9.x.y, frontend 1.y.z" (or why there is none).
  [[nodiscard]] static std::string version();
  //! The forward and backward graphs of causal attention over B sequences of
  //! T tokens, H heads of dimension hd reading KV key and value heads (grouped-
  //! query attention; KV = H for multi-head), bf16 in and out, fp32 softmax
  //! statistics; qkv rows are [q (H heads) | k (KV) | v (KV)], each head's hd
  //! columns together, the output (B, T, H, hd). Throws tessera::error with
  //! cuDNN's reason where it cannot run them (an old cuDNN, a GPU before sm_80,
  //! a head dimension it does not take). deterministic: cuDNN's deterministic
  //! backward (no atomics in dq), or a tessera::error where this cuDNN has none.
  cudnn_attention(int B, int T, int H, int KV, int hd, bool deterministic = false);
  ~cudnn_attention();
  cudnn_attention(const cudnn_attention&) = delete;
  cudnn_attention& operator=(const cudnn_attention&) = delete;

  [[nodiscard]] int batch() const noexcept;
  [[nodiscard]] int seq() const noexcept;
  //! y = softmax(q k^T / sqrt(hd), causal) v; stats (B, H, T) fp32 for backward.
  void forward(const void* qkv, void* y, float* stats, cudaStream_t s) const;
  //! dqkv (the layout of qkv, bf16, overwritten) from dy, the forward's qkv, y and stats.
  void backward(const void* dy, const void* qkv, const void* y, const float* stats, void* dqkv, cudaStream_t s) const;
  //! Device bytes of the graphs' workspace (counted in the library's memory).
  [[nodiscard]] std::size_t workspace_bytes() const noexcept;

private:
  struct impl;
  std::unique_ptr<impl> p_;
};

}  // namespace trainer_kit
