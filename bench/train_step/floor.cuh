#pragma once
// tessera-bench-train's ceilings, measured in the same run as the steps:
// the floor of a step (every GEMM timed alone, and back to back, plus the
// optimizer's bytes at copy speed) and, with offload, the host-memory and
// PCIe bandwidths the offloaded update is bounded by.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "../common.cuh"
#include "trainer_kit/configs.hpp"
#include "mlp_lm/model.hpp"
#include "tessera/tessera.hpp"

namespace tessera_bench::train_step {
using tessera::bf16;
using mlp_lm::model_shape;

inline std::size_t device_in_use() {
  std::size_t f = 0, t = 0;
  TESSERA_CUDA(cudaMemGetInfo(&f, &t));
  return t - f;
}

// The floor: each GEMM of one step timed alone, summed.
struct floor_parts {
  double gemm_ms = 0, optimizer_ms = 0, copy_gbs = 0, gemm_tflops = 0;
  double sustained_gemm_ms = 0;  // the same GEMMs back to back, as a step runs them (clocks under sustained load)
};

template <class TD>
inline double time_gemm(bool ta, bool tb, int m, int n, int k, int iters) {
  const std::size_t ea = std::size_t(m) * std::size_t(k), eb = std::size_t(k) * std::size_t(n);
  auto a = random_buffer<bf16>(ea, 1, 0.1f, -0.05f), b = random_buffer<bf16>(eb, 2, 0.1f, -0.05f);
  auto d = random_buffer<TD>(std::size_t(m) * std::size_t(n), 3);
  return time_ms([&] {
    tessera::cuda::matmul(tessera::cuda::matmul_problem<bf16, TD>{.trans_a = ta, .trans_b = tb, .m = m, .n = n, .k = k,
                                                                  .a = a.data(), .b = b.data(), .d = d.data()});
  }, 3, iters);
}

inline floor_parts measure_floor(const model_shape& s, long tokens_per_rank, int iters) {
  floor_parts f;
  const int T = int(tokens_per_rank), d = s.d, h = s.hidden(), V = mlp_lm::vocab;
  // Per block: forward X W1^T, A W2^T; backward dW2 = dY^T A, dA = dY W2, dW1 = dH^T X, dX = dH W1.
  const double block = time_gemm<bf16>(false, true, T, h, d, iters) + time_gemm<bf16>(false, true, T, d, h, iters) +
                       time_gemm<float>(true, false, d, h, T, iters) + time_gemm<bf16>(false, false, T, h, d, iters) +
                       time_gemm<float>(true, false, h, d, T, iters) + time_gemm<bf16>(false, false, T, d, h, iters);
  const double head = time_gemm<bf16>(false, true, T, V, d, iters) + time_gemm<float>(true, false, V, d, T, iters) +
                      time_gemm<bf16>(false, false, T, d, V, iters);
  f.gemm_ms = s.layers * block + head;
  {
    // One step's GEMMs back to back on shared operands (plain forms).
    const std::size_t TD = std::size_t(T) * std::size_t(d), TH = std::size_t(T) * std::size_t(h), HD = std::size_t(h) * std::size_t(d);
    auto x = random_buffer<bf16>(TD, 5, 0.1f, -0.05f), a = random_buffer<bf16>(TH, 6, 0.1f, -0.05f);
    auto w1 = random_buffer<bf16>(HD, 7, 0.1f, -0.05f), w2 = random_buffer<bf16>(HD, 8, 0.1f, -0.05f);
    auto hh = random_buffer<bf16>(TH, 9), y = random_buffer<bf16>(TD, 10);
    auto dw = random_buffer<float>(HD, 11);
    auto wh = random_buffer<bf16>(std::size_t(V) * std::size_t(d), 12, 0.1f, -0.05f), z = random_buffer<bf16>(std::size_t(T) * V, 13);
    auto dwh = random_buffer<float>(std::size_t(V) * std::size_t(d), 14);
    using tessera::cuda::matmul;
    using P16 = tessera::cuda::matmul_problem<bf16, bf16>;
    using P32 = tessera::cuda::matmul_problem<bf16, float>;
    f.sustained_gemm_ms = time_ms([&] {
      for (int l = 0; l < s.layers; ++l) {
        matmul(P16{.trans_b = true, .m = T, .n = h, .k = d, .a = x.data(), .b = w1.data(), .d = hh.data()});
        matmul(P16{.trans_b = true, .m = T, .n = d, .k = h, .a = a.data(), .b = w2.data(), .d = y.data()});
      }
      matmul(P16{.trans_b = true, .m = T, .n = V, .k = d, .a = x.data(), .b = wh.data(), .d = z.data()});
      matmul(P32{.trans_a = true, .m = V, .n = d, .k = T, .a = z.data(), .b = x.data(), .d = dwh.data()});
      matmul(P16{.m = T, .n = d, .k = V, .a = z.data(), .b = wh.data(), .d = y.data()});
      for (int l = 0; l < s.layers; ++l) {
        matmul(P32{.trans_a = true, .m = d, .n = h, .k = T, .a = y.data(), .b = a.data(), .d = dw.data()});
        matmul(P16{.m = T, .n = h, .k = d, .a = y.data(), .b = w2.data(), .d = hh.data()});
        matmul(P32{.trans_a = true, .m = h, .n = d, .k = T, .a = hh.data(), .b = x.data(), .d = dw.data()});
        matmul(P16{.m = T, .n = d, .k = h, .a = hh.data(), .b = w1.data(), .d = y.data()});
      }
    }, 2, std::max(3, iters / 3));
  }
  {
    const std::size_t n = std::size_t(1) << 28;
    auto a = random_buffer<float>(n, 4);
    dbuf<float> b(n);
    const double ms = time_ms([&] { backend_ops<backend::cuda>::copy(b.span(), std::span<const float>(a.span())); }, 3, iters);
    f.copy_gbs = 2.0 * double(n) * sizeof(float) / (ms * 1e6);
  }
  f.optimizer_ms = 28.0 * double(s.params()) / (f.copy_gbs * 1e6);
  {
    const int g = 8192;
    const double ms = time_gemm<bf16>(false, true, g, g, g, iters);
    f.gemm_tflops = 2.0 * double(g) * g * g / (ms * 1e9);
  }
  return f;
}

//! The offload's ceilings on this machine, measured in the same run: the
//! host's memory bandwidth (read + write, every core, host::pool) and the
//! PCIe bandwidth each way between pinned memory and the device.
struct offload_ceilings {
  double host_gbs = 0, h2d_gbs = 0, d2h_gbs = 0;
};
inline offload_ceilings measure_offload_ceilings() {
  offload_ceilings c;
  const std::size_t n = std::size_t(1) << 28;  // 1 GiB of float
  tessera::cuda::buffer<float> h1(n, tessera::placement::host), h2(n, tessera::placement::host), d(n);
  auto& pool = tessera::host::pool::shared();
  auto host_copy = [&] {
    pool.parallel_for(n, 4096, [&](std::size_t b, std::size_t e) {
      std::memcpy(h2.data() + b, h1.data() + b, (e - b) * sizeof(float));
    });
  };
  pool.parallel_for(n, 4096, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) h1.data()[i] = float(i & 1023), h2.data()[i] = 0.f;
  });
  host_copy();
  double best = 1e30;
  for (int k = 0; k < 5; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    host_copy();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  c.host_gbs = 2.0 * double(n * sizeof(float)) / best / 1e9;
  const cudaStream_t st = tessera::cuda::current_stream();
  tessera::cuda::event a(true), b(true);
  auto time_copy = [&](void* dst, const void* src) {
    double ms = 1e30;
    for (int k = 0; k < 4; ++k) {
      a.record(st);
      TESSERA_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDefault, st));
      b.record(st);
      b.synchronize();
      float t = 0;
      TESSERA_CUDA(cudaEventElapsedTime(&t, a.get(), b.get()));
      ms = std::min<double>(ms, t);
    }
    return double(n * sizeof(float)) / (ms * 1e-3) / 1e9;
  };
  c.h2d_gbs = time_copy(d.data(), h1.data());
  c.d2h_gbs = time_copy(h2.data(), d.data());
  return c;
}

}  // namespace tessera_bench::train_step
