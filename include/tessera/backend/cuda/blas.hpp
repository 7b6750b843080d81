#pragma once
//! \file cuBLAS on the CUDA backend: handles owned per stream (cuBLAS handles
//! are not free to create and carry a stream and workspace, so one per
//! (thread, device, stream) is made on first use and kept), and a row-major
//! GEMM with fp32 accumulation for fp32 or bf16 operands.
#include <cublas_v2.h>

#include <map>
#include <memory>
#include <tuple>

#include "tessera/backend/cuda/stream.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/fp8.hpp"

namespace tessera::detail {
[[noreturn]] inline void throw_cublas_error(cublasStatus_t rc, const char* call, ::tessera::source_location where) {
  throw error(std::string("cuBLAS call failed: ") + cublasGetStatusName(rc) + ": " + cublasGetStatusString(rc), call,
              static_cast<long long>(rc), where);
}
}  // namespace tessera::detail

//! Wraps a cuBLAS call: a failure becomes a tessera::error.
#define TESSERA_CUBLAS(call)                                                                  \
  do {                                                                                        \
    const cublasStatus_t tessera_rc_ = (call);                                                \
    if (tessera_rc_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                    \
      ::tessera::detail::throw_cublas_error(tessera_rc_, #call, ::tessera::source_location::current()); \
  } while (0)

namespace tessera::cuda {

//! An owned cuBLAS handle bound to one stream.
class blas_handle {
public:
  explicit blas_handle(cudaStream_t s) {
    TESSERA_CUBLAS(cublasCreate(&h_));
    TESSERA_CUBLAS(cublasSetStream(h_, s));
  }
  blas_handle(const blas_handle&) = delete;
  blas_handle& operator=(const blas_handle&) = delete;
  ~blas_handle() {
    if (h_) cublasDestroy(h_);
  }
  [[nodiscard]] cublasHandle_t get() const noexcept { return h_; }

private:
  cublasHandle_t h_ = nullptr;
};

//! The calling thread's handle for (current device, stream s).
[[nodiscard]] inline cublasHandle_t blas_for(cudaStream_t s = current_stream()) {
  thread_local std::map<std::pair<int, cudaStream_t>, std::unique_ptr<blas_handle>> handles;
  int dev = 0;
  TESSERA_CUDA(cudaGetDevice(&dev));
  auto& h = handles[{dev, s}];
  if (!h) h = std::make_unique<blas_handle>(s);
  return h->get();
}

namespace detail {
template <class T> constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, bf16>) return CUDA_R_16BF;
  else if constexpr (std::is_same_v<T, fp16>) return CUDA_R_16F;
  else if constexpr (std::is_same_v<T, e4m3>) return CUDA_R_8F_E4M3;
  else if constexpr (std::is_same_v<T, e5m2>) return CUDA_R_8F_E5M2;
  else return CUDA_R_64F;
}
}  // namespace detail

//! Row-major C[m,n] = alpha op(A) op(B) + beta C with fp32 accumulation, on the
//! current stream. A and B are fp32, bf16 or fp16 (the same type); C is float
//! or the operand type. op transposes where asked. fp32 operands multiply as
//! TF32 unless `tf32` is false (strict fp32: what a host reference matches).
template <class T, class TC>
void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const T* a, const T* b, float beta, TC* c,
          bool tf32 = true) {
  TESSERA_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm with negative extent");
  if (m == 0 || n == 0) return;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  const int lda = trans_a ? m : k, ldb = trans_b ? k : n;
  const cublasComputeType_t compute =
      std::is_same_v<T, float> && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  TESSERA_CUBLAS(cublasGemmEx(blas_for(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                              k, &alpha, b, detail::cuda_type<T>(), ldb, a, detail::cuda_type<T>(), lda, &beta, c,
                              detail::cuda_type<TC>(), n, compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace tessera::cuda
