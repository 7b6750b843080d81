#pragma once
//! \file Row-major single-precision GEMM on the host through CBLAS (OpenBLAS).
//! Users of this header link a CBLAS (the build's `cblas_dep`).
#include <cblas.h>

#include "tessera/core/error.hpp"

namespace tessera::host {

//! C[m,n] = alpha * op(A) * op(B) + beta * C, row-major, op = transpose where asked.
inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                 const float* b, float beta, float* c) {
  TESSERA_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm with negative extent");
  if (m == 0 || n == 0) return;
  const int lda = trans_a ? m : k, ldb = trans_b ? k : n;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, n);
}

}  // namespace tessera::host
