#pragma once
//! \file fp8 matrix products through cuBLASLt on Hopper: D = alpha (sa A)(sb B)^T
//! (+ beta C) with A[m,k] and B[n,k] row-major fp8 codes, sa and sb the
//! operands' dequantising scales (device floats: the inverse of the scale each
//! was cast with), fp32 accumulation, D in bf16 or fp32, and optionally the
//! largest |D| written to device memory (the amax a recipe scales D's next
//! cast with).
//!
//! Why only this form: Hopper's fp8 tensor cores take both operands with k
//! contiguous (cuBLASLt's "TN"). The linear layer's forward y = x W^T is that
//! form as it stands; its two backward products (dx = dy W, dW = dy^T x) need
//! the transposed copies a cast-and-transpose kernel writes, as Transformer
//! Engine's do. Any other layout is refused with a tessera: error rather than
//! left to cuBLASLt's status code.
//!
//! Plans (descriptors and the heuristic's first kernel) share blaslt.hpp's
//! per-thread cache and workspace; fp8 products are not tuned (set_matmul_tuning
//! applies to the others).
#include "tessera/backend/cuda/blaslt.hpp"
#include "tessera/core/fp8.hpp"

namespace tessera::cuda {

//! One fp8 product D[m,n] = alpha sa sb A[m,k] B[n,k]^T + beta C. Leading
//! dimensions in elements (0: packed). e5m2 x e5m2 has no Hopper kernel.
template <fp8_format TA, fp8_format TB, class TD>
struct fp8_matmul_problem {
  int m = 0, n = 0, k = 0;
  const TA* a = nullptr;
  const TB* b = nullptr;
  TD* d = nullptr;
  int lda = 0, ldb = 0, ldd = 0;
  const float* a_scale_inv = nullptr;  //!< device: A's dequantising scale (required)
  const float* b_scale_inv = nullptr;  //!< device: B's dequantising scale (required)
  float alpha = 1, beta = 0;
  const TD* c = nullptr;               //!< C laid out like D when it is not D itself
  const TD* bias = nullptr;            //!< n elements added to every row, or none
  float* amax_d = nullptr;             //!< device: set to max |D| (before D is rounded), or none
  //! Hopper's fast accumulation (fewer promotions of the partial sums to fp32):
  //! the anchors use it in the forward product only, where its error is smallest.
  bool fast_accum = false;
};

namespace detail {
template <class TA, class TB, class TD>
lt_plan* fp8_plan_for(const fp8_matmul_problem<TA, TB, TD>& p, bool throw_if_none) {
  TESSERA_CHECK(p.m >= 0 && p.n >= 0 && p.k > 0, "fp8 matmul with extents (", p.m, ", ", p.n, ", ", p.k,
                "); k must be positive");
  TESSERA_CHECK(p.k % 16 == 0 && p.n % 16 == 0,
                "fp8 matmul: Hopper's fp8 kernels need k and n to be multiples of 16 (m=", p.m, " n=", p.n, " k=", p.k, ")");
  const int lda = p.lda ? p.lda : p.k, ldb = p.ldb ? p.ldb : p.k, ldd = p.ldd ? p.ldd : p.n;
  int dev = 0;
  TESSERA_CUDA(cudaGetDevice(&dev));
  const int types = int(cuda_type<TA>()) * 10000 + int(cuda_type<TB>()) * 100 + int(cuda_type<TD>());
  const lt_key key{dev, 0, 1, p.m, p.n, p.k, lda, ldb, ldd, 0, p.bias ? 1 : 0, p.beta != 0,
                   std::min({alignment_of(p.a), alignment_of(p.b), alignment_of(p.d), alignment_of(p.c ? p.c : p.d)}),
                   p.amax_d ? 1 : 0, types, p.fast_accum, 0};
  auto& st = lt_thread_state();
  auto& slot = st.plans[key];
  if (slot) return slot.get();
  auto plan = std::make_unique<lt_plan>();
  TESSERA_CUBLAS(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Row-major D = A B^T is column-major D^T = B A^T: cuBLASLt's A is our B,
  // transposed (k contiguous), its B our A, not transposed: the TN form.
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  const std::int8_t fast = p.fast_accum ? 1 : 0;
  TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  // The scale and amax pointers go in per call; the heuristic wants to know they exist.
  TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p.b_scale_inv,
                                                sizeof p.b_scale_inv));
  TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p.a_scale_inv,
                                                sizeof p.a_scale_inv));
  if (p.amax_d)
    TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &p.amax_d,
                                                  sizeof p.amax_d));
  if (p.bias) {
    const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
    TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof p.bias));
    const cudaDataType_t bt = cuda_type<TD>();
    TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
  }
  TESSERA_CUBLAS(cublasLtMatrixLayoutCreate(&plan->a, cuda_type<TB>(), p.k, p.n, ldb));
  TESSERA_CUBLAS(cublasLtMatrixLayoutCreate(&plan->b, cuda_type<TA>(), p.k, p.m, lda));
  TESSERA_CUBLAS(cublasLtMatrixLayoutCreate(&plan->d, cuda_type<TD>(), p.n, p.m, ldd));
  cublasStatus_t rc = CUBLAS_STATUS_SUCCESS;
  if (!take_first_algo(st, *plan, rc)) {
    st.plans.erase(key);
    if (!throw_if_none) return nullptr;
    tessera::detail::fail(tessera::detail::concat("cuBLASLt has no fp8 kernel for m=", p.m, " n=", p.n, " k=", p.k,
                                                  " (", cublasGetStatusString(rc), ")"));
  }
  slot = std::move(plan);
  return slot.get();
}
}  // namespace detail

//! Whether cuBLASLt has a kernel for p on this device (false instead of an
//! error: a caller can fall back to bf16).
template <class TA, class TB, class TD>
bool fp8_matmul_supported(const fp8_matmul_problem<TA, TB, TD>& p) {
  if constexpr (std::is_same_v<TA, e5m2> && std::is_same_v<TB, e5m2>) return false;
  else return detail::fp8_plan_for(p, false) != nullptr;
}

//! Runs p on the current stream.
template <class TA, class TB, class TD>
void fp8_matmul(const fp8_matmul_problem<TA, TB, TD>& p) {
  static_assert(!(std::is_same_v<TA, e5m2> && std::is_same_v<TB, e5m2>),
                "tessera: fp8 matmul of two e5m2 operands has no Hopper kernel; cast one of them to e4m3");
  static_assert(std::is_same_v<TD, bf16> || std::is_same_v<TD, float>, "tessera: fp8 matmul writes bf16 or float");
  TESSERA_CHECK(p.a_scale_inv && p.b_scale_inv, "fp8 matmul without the operands' scale pointers");
  if (p.m == 0 || p.n == 0) return;
  detail::lt_plan* plan = detail::fp8_plan_for(p, true);
  auto set = [&](cublasLtMatmulDescAttributes_t a, const void* v) {
    TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, a, &v, sizeof v));
  };
  set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.b_scale_inv);
  set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.a_scale_inv);
  if (p.amax_d) set(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, p.amax_d);
  if (p.bias) set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias);
  const cudaStream_t s = current_stream();
  auto& st = detail::lt_thread_state();
  auto& ws = detail::lt_workspace(st, s);
  const TD* c = p.c ? p.c : p.d;
  TESSERA_CUBLAS(cublasLtMatmul(st.handle.h, plan->op, &p.alpha, p.b, plan->a, p.a, plan->b, &p.beta, c, plan->d, p.d,
                                plan->d, &plan->algo, ws.data(), ws.size(), s));
}

}  // namespace tessera::cuda
