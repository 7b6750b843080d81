#pragma once
// tessera-gpt's matrix products on cuBLASLt (cuda_compute.cuh runs the net
// with them). Every product accumulates in fp32, and fp32 operands run strict
// fp32 (no TF32), so that the GPU matches the host backend. The products with
// a cuBLASLt epilogue (bias; bias + GELU keeping the GELU input; GELU
// gradient; bias gradient) have a fused and a separate form: under bf16 the
// forward ones and the GELU gradient keep whichever times faster in the first
// step (trainer_kit::product_forms); the weight gradients accumulate, so they
// cannot run twice to be timed, and run fused wherever cuBLASLt has the form.
// fp32 runs the separate forms only: the host's arithmetic. --deterministic:
// no timing (two runs could time differently and pick different
// arithmetic): fused wherever cuBLASLt has the form. The separate bias
// gradients are the kit's fixed-order column sums either way.
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <type_traits>

#include "gpt/cuda_layernorm.cuh"
#include "gpt/workspace.hpp"
#include "tessera/backend/cuda/blaslt.hpp"
#include "tessera/backend/cuda/buffer.hpp"
#include "tessera/backend/cuda/stream.hpp"
#include "trainer_kit/kernels/blas_workspace.cuh"
#include "trainer_kit/product_forms.cuh"

static_assert(gpt::workspace::matmul_tuning_limit == tessera::cuda::matmul_tuning_scratch_bytes(),
              "tessera-plan counts the scratch the library's kernel tuning allocates");

namespace gpt {

template <class C>
class cuda_products {
public:
  enum product : std::size_t { qkv_fwd, proj_fwd, fc_fwd, fcproj_fwd, fc_dgelu, fcproj_wgrad, fc_wgrad, proj_wgrad,
                               qkv_wgrad, count };
  template <class TD> using problem = tessera::cuda::matmul_problem<C, TD>;
  using epilogue = tessera::cuda::epilogue;

  //! Products of width d, their scratch in the net's buffers (workspace::cuda_buffers):
  //! bias32 of 4 d floats, partial of workspace::products_partial_floats(d).
  cuda_products(std::span<float> bias32, std::span<float> partial, bool deterministic)
      : deterministic_(deterministic), bias32_(bias32), partial_(partial) {
    // bf16 without --deterministic: each product keeps the fastest of
    // cuBLASLt's first candidate kernels, timed in its first run (the
    // heuristic's first is not always the fastest at GPT-2's shapes). fp32
    // keeps the heuristic's (the host's arithmetic), --deterministic too (a
    // timed choice could differ between runs).
    tessera::cuda::set_matmul_tuning(std::is_same_v<C, float> || deterministic ? 1 : candidates());
  }

  //! Which products may run fused, at up to n rows of width d (any_c, any_f:
  //! device memory cuBLASLt's heuristic may look at for alignment).
  void decide(std::size_t n, int d, C* any_c, float* any_f) {
    const bool fp32 = std::is_same_v<C, float>;
    for (std::size_t p = 0; p < count; ++p) {
      const bool can = !fp32 && fusable(product(p), int(n), d, any_c, any_f);
      if (p >= fcproj_wgrad || deterministic_) forms_.force(p, true, can);
      else forms_.allow(p, can);
    }
  }
  [[nodiscard]] std::string describe() const {
    const auto t = tessera::cuda::matmul_tuning_result();
    if (t.timed == 0) return forms_.describe();
    char line[200];
    std::snprintf(line, sizeof line, "; cuBLASLt kernels timed for %d products, %d kept one other than the "
                  "heuristic's first: one run of each %.3f ms, was %.3f ms", t.timed, t.changed, t.kept_ms, t.first_ms);
    return forms_.describe() + line;
  }

  template <class TD>
  static void mm(problem<TD> p) {
    p.tf32 = false;
    tessera::cuda::matmul(p);
  }
  template <class T, class TC>
  static void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const T* a, const T* b, float beta, TC* c) {
    mm<TC>({.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k, .a = a, .b = b, .d = c, .alpha = alpha, .beta = beta});
  }

  //! Product p through go(bool fused), in the form it was given or timed to.
  template <class F>
  void run(product p, F&& go) {
    forms_.run(p, go);
  }

  //! d (fp32) = c + a w^T + b over n rows: a residual branch (c: the stream it joins, or null).
  void linear(product p, const C* a, const C* w, const C* b, const float* c, float* d, std::size_t n, std::size_t out,
              std::size_t in) {
    forms_.run(p, [&](bool fuse) {
      mm<float>({.trans_b = true, .m = int(n), .n = int(out), .k = int(in), .a = a, .b = w, .d = d,
                 .beta = c ? 1.0f : 0.0f, .ep = fuse ? epilogue::bias : epilogue::none,
                 .bias = fuse ? widen(b, out) : nullptr, .c = c});
      if (fuse) return;
      kernels::add_bias(d, b, n, int(out), stream());
    });
  }

  //! dW (+)= dY^T X over n rows (fp32; `fresh`: dW holds nothing yet, so =),
  //! and db += the column sums of dY: in the product's epilogue (cuBLASLt
  //! writes them into scratch, added to db), or summed apart from dY32 (fp32,
  //! where the caller has it) or dY. Without db, dW alone (the caller has the
  //! bias gradient from elsewhere).
  void weight_grad(product p, const C* dY, const float* dY32, const C* X, std::size_t n, std::size_t out,
                   std::size_t in, float* dW, float* db, bool fresh = false) {
    const bool fuse = db && forms_.state(p) == 1;
    mm<float>({.trans_a = true, .m = int(out), .n = int(in), .k = int(n), .a = dY, .b = X, .d = dW,
               .beta = fresh ? 0.0f : 1.0f,
               .ep = fuse ? epilogue::bgrad_a : epilogue::none, .bias_grad = fuse ? bias32_.data() : nullptr});
    if (!db) return;
    if (fuse) {
      kernels::add_into(bias32_.data(), db, int(out), false, stream());
      return;
    }
    // Fixed-order column sums (the kit's), deterministic or not: no atomics to save.
    if (dY32) kernels::column_sums(dY32, int(n), int(out), db, false, partial_, stream());
    else kernels::column_sums(dY, int(n), int(out), db, false, partial_, stream());
  }

private:
  static cudaStream_t stream() { return tessera::cuda::current_stream(); }
  // Candidates timed per product: 8, or TESSERA_MATMUL_CANDIDATES (1: the heuristic's first, untimed).
  static int candidates() {
    const char* e = std::getenv("TESSERA_MATMUL_CANDIDATES");
    if (!e) return 8;
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    TESSERA_CHECK(*e && !*end && v >= 1 && v <= 64, "TESSERA_MATMUL_CANDIDATES=", e, " is not a count from 1 to 64");
    return int(v);
  }

  // A bias in C as fp32 (bias32_), for an epilogue whose output is fp32.
  const float* widen(const C* b, std::size_t n) {
    if constexpr (std::is_same_v<C, float>) {
      return b;
    } else {
      kernels::convert_into(b, bias32_.data(), n, stream());
      return bias32_.data();
    }
  }

  // Whether cuBLASLt has product p's fused form at n rows of width D.
  static bool fusable(product p, int n, int D, C* anyc, float* anyf) {
    const int H4 = 4 * D;
    auto fwd = [&](int out, int in) {
      return tessera::cuda::matmul_supported(problem<float>{.trans_b = true, .m = n, .n = out, .k = in, .a = anyc,
                                                            .b = anyc, .d = anyf, .beta = 1, .ep = epilogue::bias,
                                                            .bias = anyf, .c = anyf});
    };
    auto wgrad = [&](int out, int in) {
      return tessera::cuda::matmul_supported(problem<float>{.trans_a = true, .m = out, .n = in, .k = n, .a = anyc,
                                                            .b = anyc, .d = anyf, .beta = 1, .ep = epilogue::bgrad_a,
                                                            .bias_grad = anyf});
    };
    switch (p) {
      case qkv_fwd:
        return tessera::cuda::matmul_supported(problem<C>{.trans_b = true, .m = n, .n = 3 * D, .k = D, .a = anyc,
                                                          .b = anyc, .d = anyc, .ep = epilogue::bias, .bias = anyc});
      case proj_fwd: return fwd(D, D);
      case fcproj_fwd: return fwd(D, H4);
      case fc_fwd:
        return tessera::cuda::matmul_supported(problem<C>{.trans_b = true, .m = n, .n = H4, .k = D, .a = anyc,
                                                          .b = anyc, .d = anyc, .ep = epilogue::gelu_aux_bias,
                                                          .bias = anyc, .aux = anyc});
      case fc_dgelu:
        return tessera::cuda::matmul_supported(problem<C>{.m = n, .n = H4, .k = D, .a = anyc, .b = anyc, .d = anyc,
                                                          .ep = epilogue::dgelu, .aux = anyc});
      case fcproj_wgrad: return wgrad(D, H4);
      case fc_wgrad: return wgrad(H4, D);
      case proj_wgrad: return wgrad(D, D);
      case qkv_wgrad: return wgrad(3 * D, D);
      default: return false;
    }
  }

  bool deterministic_;
  std::span<float> bias32_;   // a bias widened to fp32, or an epilogue's bias gradient
  std::span<float> partial_;  // the separate bias gradients' partial sums (column_sums' scratch)
  trainer_kit::product_forms<count> forms_{{"qkv + bias", "proj + bias + residual", "fc + bias, GELU",
                                            "fc_proj + bias + residual", "GELU gradient", "dW fc_proj, db", "dW fc, db",
                                            "dW proj, db", "dW qkv, db"}};
};

}  // namespace gpt
