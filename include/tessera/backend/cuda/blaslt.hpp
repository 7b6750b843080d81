#pragma once
//! \file cuBLASLt matrix products with fused epilogues, row-major, on the
//! current stream.
//!
//! Why cuBLASLt and not cublasGemmEx: the epilogues. A training MLP needs
//! bias + GELU after the forward product (and the GELU input kept for the
//! backward), and GELU-gradient + bias-gradient after the backward product;
//! cuBLASLt does these while the tile is still in registers, which saves a
//! full read and write of the activation per product.
//!
//! Descriptors and the heuristic's choice are cached per thread by problem
//! (shapes, types, epilogue, pointer alignment), so a training step pays for
//! the search once. Each (device, stream) gets its own workspace.
//!
//! The heuristic's first kernel is not always the fastest at a shape; with
//! set_matmul_tuning(k), the first run of each problem times the heuristic's
//! first k candidates on its own operands and keeps the fastest (as cuBLAS's
//! own cublasLtMatmulAlgo benchmarks and PyTorch's TunableOp do).
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include "tessera/backend/cuda/blas.hpp"
#include "tessera/backend/cuda/buffer.hpp"
#include "tessera/backend/cuda/stream.hpp"

namespace tessera::cuda {

//! What a product does to its result before storing it.
enum class epilogue : int {
  none,           //!< D = alpha op(A) op(B) + beta C
  bias,           //!< D = ... + bias (bias over D's columns, broadcast over rows)
  gelu_aux_bias,  //!< D = gelu(... + bias); aux = ... + bias (the GELU input, for backward)
  dgelu_bgrad,    //!< D = (...) * gelu'(aux); bias_grad = column sums of D (n elements)
  dgelu,          //!< D = (...) * gelu'(aux)
  bgrad_a,        //!< D = ...; bias_grad[i] = sum_k op(A)[i, k] (m elements): a bias
                  //!< gradient for free in a weight-gradient product dW = dY^T X
};

//! One matrix product: D[m,n] = epilogue(alpha op(A)[m,k] op(B)[k,n] + beta C).
//! Row-major, leading dimensions in elements (0: packed). C is `c` if given,
//! else D (in place). A and B share a type; D (and C) may be that type or float.
template <class TA, class TD>
struct matmul_problem {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  const TA* a = nullptr;
  const TA* b = nullptr;
  TD* d = nullptr;
  int lda = 0, ldb = 0, ldd = 0;
  float alpha = 1, beta = 0;
  epilogue ep = epilogue::none;
  const void* bias = nullptr;  //!< bias / gelu_aux_bias: n elements of TD
  void* bias_grad = nullptr;   //!< dgelu_bgrad, bgrad_a: elements of TD written (not accumulated)
  const TD* c = nullptr;       //!< C, laid out like D, when it is not D itself
  TD* aux = nullptr;           //!< GELU input [m, n] row-major, ld = ldaux
  int ldaux = 0;
  bool tf32 = false;           //!< fp32 operands: allow TF32 tensor cores
  //! SMs the kernel is chosen and shaped for (0: all of them). Below the
  //! device's count when another stream (NCCL's) runs beside it, so the GEMM's
  //! waves do not wait for SMs the collective holds.
  int sm_count = 0;
};

namespace detail {

struct lt_handle {
  cublasLtHandle_t h = nullptr;
  lt_handle() { TESSERA_CUBLAS(cublasLtCreate(&h)); }
  lt_handle(const lt_handle&) = delete;
  lt_handle& operator=(const lt_handle&) = delete;
  ~lt_handle() {
    if (h) cublasLtDestroy(h);
  }
};

// 32 MiB: what cuBLASLt's Hopper kernels ask for at most in practice.
constexpr std::size_t lt_workspace_bytes = std::size_t(32) << 20;
// The most a tuned product that accumulates into D allocates for a scratch D while it is timed.
constexpr std::size_t tuning_scratch_bytes = std::size_t(64) << 20;

struct lt_plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool timed = false;                // the candidates were timed (set_matmul_tuning)
  float first_ms = 0, kept_ms = 0;   // then: the heuristic's first's time and the kept one's
  lt_plan() = default;
  lt_plan(const lt_plan&) = delete;
  lt_plan& operator=(const lt_plan&) = delete;
  ~lt_plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Everything the heuristic's answer may depend on.
using lt_key = std::tuple<int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int>;

inline int alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  int a = 256;
  while (a > 1 && v % std::uintptr_t(a) != 0) a /= 2;
  return a;
}

inline cublasLtEpilogue_t lt_epilogue(epilogue e) {
  switch (e) {
    case epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case epilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case epilogue::dgelu_bgrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case epilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    // cuBLASLt sees the swapped product D^T = op(B)^T op(A)^T: our A is its B.
    case epilogue::bgrad_a: return CUBLASLT_EPILOGUE_BGRADB;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

inline bool writes_bias_grad(epilogue e) { return e == epilogue::dgelu_bgrad || e == epilogue::bgrad_a; }
inline bool uses_bias(epilogue e) { return e == epilogue::bias || e == epilogue::gelu_aux_bias || writes_bias_grad(e); }
inline bool uses_aux(epilogue e) {
  return e == epilogue::gelu_aux_bias || e == epilogue::dgelu_bgrad || e == epilogue::dgelu;
}

inline const char* epilogue_name(epilogue e) {
  switch (e) {
    case epilogue::bias: return "bias";
    case epilogue::gelu_aux_bias: return "gelu_aux_bias";
    case epilogue::dgelu_bgrad: return "dgelu_bgrad";
    case epilogue::dgelu: return "dgelu";
    case epilogue::bgrad_a: return "bgrad_a";
    default: return "none";
  }
}

struct lt_state {
  lt_handle handle;
  std::map<lt_key, std::unique_ptr<lt_plan>> plans;
  std::map<std::pair<int, cudaStream_t>, buffer<std::byte>> workspaces;
  int tuning = 1;  // candidates timed per problem (1: the heuristic's first, untimed)
};
inline lt_state& lt_thread_state() {
  thread_local lt_state s;
  return s;
}
// The workspace of the current device and stream s, allocated at first use.
inline buffer<std::byte>& lt_workspace(lt_state& st, cudaStream_t s) {
  int dev = 0;
  TESSERA_CUDA(cudaGetDevice(&dev));
  auto& ws = st.workspaces[{dev, s}];
  if (ws.size() == 0) ws = buffer<std::byte>(lt_workspace_bytes);
  return ws;
}

// cuBLASLt's candidates for plan, best first, within the workspace we give it.
inline cublasStatus_t heuristic(lt_state& st, const lt_plan& plan, std::span<cublasLtMatmulHeuristicResult_t> out,
                                int& found) {
  cublasLtMatmulPreference_t pref = nullptr;
  TESSERA_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const std::size_t ws = lt_workspace_bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  found = 0;
  const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(st.handle.h, plan.op, plan.a, plan.b, plan.d, plan.d, pref,
                                                           int(out.size()), out.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  return rc;
}

// Puts the heuristic's first kernel into plan; false (rc says why) when there is none.
inline bool take_first_algo(lt_state& st, lt_plan& plan, cublasStatus_t& rc) {
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  rc = heuristic(st, plan, std::span(&result, 1), found);
  if (rc != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  plan.algo = result.algo;
  return true;
}

}  // namespace detail

namespace detail {

// D = epilogue(alpha A B + beta C) through one algorithm (our A and B swapped: see lt_plan_for).
template <class TA, class TD>
cublasStatus_t lt_run(lt_state& st, lt_plan& plan, const cublasLtMatmulAlgo_t& algo, const matmul_problem<TA, TD>& p,
                      const TD* c, TD* d, buffer<std::byte>& ws, cudaStream_t s) {
  return cublasLtMatmul(st.handle.h, plan.op, &p.alpha, p.b, plan.a, p.a, plan.b, &p.beta, c, plan.d, d, plan.d,
                        &algo, ws.data(), ws.size(), s);
}

// Times the heuristic's first st.tuning candidates for p and keeps the fastest
// in plan. The runs write p's outputs in place where the real run rewrites them
// all (beta 0, or C apart from D; the aux and bias gradient an epilogue writes);
// a product that accumulates into D runs on a zeroed scratch D instead, and is
// left with the heuristic's first if that would exceed tuning_scratch_bytes.
// A stream being captured into a graph is not timed (events cannot be waited on).
template <class TA, class TD>
void tune(lt_state& st, lt_plan& plan, const matmul_problem<TA, TD>& p, buffer<std::byte>& ws, cudaStream_t s) {
  plan.timed = true;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TESSERA_CUDA(cudaStreamIsCapturing(s, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return;
  std::vector<cublasLtMatmulHeuristicResult_t> cand(std::size_t(st.tuning));
  int found = 0;
  if (heuristic(st, plan, cand, found) != CUBLAS_STATUS_SUCCESS || found < 2) return;
  const bool accumulates = p.beta != 0 && p.c == nullptr;
  const std::size_t d_elems = std::size_t(p.ldd ? p.ldd : p.n) * std::size_t(p.m);
  if (accumulates && d_elems * sizeof(TD) > tuning_scratch_bytes) return;
  buffer<TD> scratch(accumulates ? d_elems : 0);
  if (accumulates) TESSERA_CUDA(cudaMemsetAsync(scratch.data(), 0, d_elems * sizeof(TD), s));
  TD* d = accumulates ? scratch.data() : p.d;
  const TD* c = accumulates ? scratch.data() : p.c ? p.c : p.d;
  event start(true), stop(true);
  constexpr int reps = 3;
  float best = 0;
  for (int i = 0; i < found; ++i) {
    const auto& algo = cand[std::size_t(i)].algo;
    if (cand[std::size_t(i)].state != CUBLAS_STATUS_SUCCESS || lt_run(st, plan, algo, p, c, d, ws, s) != CUBLAS_STATUS_SUCCESS)
      continue;  // warm-up; a candidate that cannot run this problem is skipped
    start.record(s);
    for (int r = 0; r < reps; ++r) TESSERA_CUBLAS(lt_run(st, plan, algo, p, c, d, ws, s));
    stop.record(s);
    stop.synchronize();
    float ms = 0;
    TESSERA_CUDA(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    ms /= reps;
    if (i == 0) plan.first_ms = ms;
    if (best == 0 || ms < best) best = ms, plan.algo = algo;
  }
  plan.kept_ms = best;
}

}  // namespace detail

//! Each new problem on this thread times the first `candidates` kernels of
//! cuBLASLt's heuristic in its first run and keeps the fastest (1, the
//! default: the heuristic's first, untimed). Timed choices can differ between
//! runs and machines and so can their rounding: a run that must repeat its
//! bits (--deterministic) keeps 1. Problems already timed keep their choice.
inline void set_matmul_tuning(int candidates) { detail::lt_thread_state().tuning = std::max(1, candidates); }

//! What tuning did on this thread: problems timed, how many kept a kernel other
//! than the heuristic's first, and one run of each, summed, in the heuristic's
//! first kernel and in the kept one (milliseconds).
struct matmul_tuning_summary {
  int timed = 0, changed = 0;
  double first_ms = 0, kept_ms = 0;
};
[[nodiscard]] inline matmul_tuning_summary matmul_tuning_result() {
  matmul_tuning_summary r;
  for (const auto& [key, plan] : detail::lt_thread_state().plans) {
    if (!plan || plan->kept_ms <= 0) continue;
    ++r.timed;
    r.changed += plan->kept_ms < plan->first_ms;
    r.first_ms += plan->first_ms;
    r.kept_ms += plan->kept_ms;
  }
  return r;
}

//! Whether this problem's shape, types and epilogue have a cuBLASLt kernel
//! (cached; false instead of an error, so a caller can fall back to plain
//! products and separate kernels).
template <class TA, class TD>
bool matmul_supported(const matmul_problem<TA, TD>& p);

//! Runs p on the current stream; a problem cuBLASLt cannot run is a tessera::error.
template <class TA, class TD>
void matmul(const matmul_problem<TA, TD>& p);

namespace detail {

template <class TA, class TD>
lt_plan* lt_plan_for(const matmul_problem<TA, TD>& p, bool throw_if_none) {
  using tessera::cuda::detail::cuda_type;
  TESSERA_CHECK(p.m >= 0 && p.n >= 0 && p.k >= 0, "matmul with a negative extent (", p.m, ", ", p.n, ", ", p.k, ")");
  const int lda = p.lda ? p.lda : (p.trans_a ? p.m : p.k);
  const int ldb = p.ldb ? p.ldb : (p.trans_b ? p.k : p.n);
  const int ldd = p.ldd ? p.ldd : p.n;
  const int ldaux = p.ldaux ? p.ldaux : p.n;
  int dev = 0;
  TESSERA_CUDA(cudaGetDevice(&dev));
  const lt_key key{dev, p.trans_a, p.trans_b, p.m, p.n, p.k, lda, ldb, ldd, ldaux, int(p.ep), p.beta != 0,
                   std::min({alignment_of(p.a), alignment_of(p.b), alignment_of(p.d), alignment_of(p.c ? p.c : p.d)}),
                   p.ep == epilogue::none ? 256 : std::min(alignment_of(p.aux ? p.aux : p.d),
                                                           alignment_of(p.bias ? p.bias : p.bias_grad ? p.bias_grad : p.d)),
                   int(cuda_type<TA>()) * 100 + int(cuda_type<TD>()), p.tf32, p.sm_count};
  auto& st = lt_thread_state();
  auto& slot = st.plans[key];
  if (slot) return slot.get();

  auto plan = std::make_unique<lt_plan>();
  const cublasComputeType_t compute =
      std::is_same_v<TA, float> && p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  TESSERA_CUBLAS(cublasLtMatmulDescCreate(&plan->op, compute, CUDA_R_32F));
  // Row-major D = op(A) op(B) is column-major D^T = op(B)^T op(A)^T: cuBLASLt's
  // "A" is our B and its "B" our A; D's rows (column-major) are our columns,
  // so its bias vector runs along our columns as the epilogues need.
  const cublasOperation_t ta = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  const cublasLtEpilogue_t ep = lt_epilogue(p.ep);
  TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
  if (p.sm_count > 0) {
    const std::int32_t sms = p.sm_count;
    TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof sms));
  }
  if (uses_bias(p.ep)) {
    // Pointers go in per call; the heuristic needs them (for alignment) now.
    const void* bp = writes_bias_grad(p.ep) ? p.bias_grad : p.bias;
    TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
    const cudaDataType_t bt = cuda_type<TD>();
    TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
  }
  if (uses_aux(p.ep)) {
    const void* ap = p.aux;
    const std::int64_t ld = ldaux;
    TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ap, sizeof ap));
    TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
  }
  // cuBLASLt's A: our B, stored (k x n) or, transposed, (n x k) column-major-wise.
  TESSERA_CUBLAS(cublasLtMatrixLayoutCreate(&plan->a, cuda_type<TA>(), p.trans_b ? p.k : p.n, p.trans_b ? p.n : p.k, ldb));
  TESSERA_CUBLAS(cublasLtMatrixLayoutCreate(&plan->b, cuda_type<TA>(), p.trans_a ? p.m : p.k, p.trans_a ? p.k : p.m, lda));
  TESSERA_CUBLAS(cublasLtMatrixLayoutCreate(&plan->d, cuda_type<TD>(), p.n, p.m, ldd));

  cublasStatus_t rc = CUBLAS_STATUS_SUCCESS;
  if (!take_first_algo(st, *plan, rc)) {
    st.plans.erase(key);
    if (!throw_if_none) return nullptr;
    tessera::detail::fail(tessera::detail::concat(
        "cuBLASLt has no kernel for ", p.trans_a ? "A^T" : "A", " x ", p.trans_b ? "B^T" : "B", " with m=", p.m,
        " n=", p.n, " k=", p.k, ", epilogue ", epilogue_name(p.ep), " (", cublasGetStatusString(rc), ")"));
  }
  slot = std::move(plan);
  return slot.get();
}

}  // namespace detail

template <class TA, class TD>
bool matmul_supported(const matmul_problem<TA, TD>& p) {
  return detail::lt_plan_for(p, false) != nullptr;
}

template <class TA, class TD>
void matmul(const matmul_problem<TA, TD>& p) {
  static_assert(std::is_same_v<TD, TA> || std::is_same_v<TD, float>, "tessera: matmul output is the operand type or float");
  if (p.m == 0 || p.n == 0) return;
  const cudaStream_t s = current_stream();
  if (p.k == 0) {  // an empty sum: D = beta D (cuBLASLt does not take k = 0)
    TESSERA_CHECK(p.ep == epilogue::none, "matmul with k = 0 and epilogue ", detail::epilogue_name(p.ep));
    TESSERA_CHECK(p.beta == 0 || p.beta == 1, "matmul with k = 0 and beta ", p.beta);
    TESSERA_CHECK(p.c == nullptr || p.beta == 0, "matmul with k = 0 from a separate C");
    if (p.beta == 0)
      TESSERA_CUDA(cudaMemset2DAsync(p.d, std::size_t(p.ldd ? p.ldd : p.n) * sizeof(TD), 0,
                                     std::size_t(p.n) * sizeof(TD), std::size_t(p.m), s));
    return;
  }
  detail::lt_plan* plan = detail::lt_plan_for(p, true);
  if (detail::uses_bias(p.ep)) {
    const void* bp = detail::writes_bias_grad(p.ep) ? p.bias_grad : p.bias;
    TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
  }
  if (detail::uses_aux(p.ep)) {
    const void* ap = p.aux;
    TESSERA_CUBLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ap, sizeof ap));
  }
  auto& st = detail::lt_thread_state();
  auto& ws = detail::lt_workspace(st, s);
  if (st.tuning > 1 && !plan->timed) detail::tune(st, *plan, p, ws, s);
  TESSERA_CUBLAS(detail::lt_run(st, *plan, plan->algo, p, p.c ? p.c : p.d, p.d, ws, s));
}

//! The most device memory a tuned product that accumulates into D
//! allocates for a scratch D while it is timed (freed after; a larger one
//! keeps the heuristic's first).
[[nodiscard]] constexpr std::size_t matmul_tuning_scratch_bytes() noexcept { return detail::tuning_scratch_bytes; }

//! Bytes of cuBLASLt workspace this thread holds on the device (counted in memory_of<backend::cuda>()).
[[nodiscard]] constexpr std::size_t matmul_workspace_bytes() noexcept { return detail::lt_workspace_bytes; }

}  // namespace tessera::cuda
