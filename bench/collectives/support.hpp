#pragma once
// tessera-collectives' pieces around the benchmark (collectives.hpp): its
// options, one result row, the fill and cast functors that make every value
// exact in bf16 and in sums over a few ranks, the timer, and the bus factor
// nccl-tests reports bandwidth with.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tessera/tessera.hpp"

namespace collectives {
using namespace tessera;

struct options {
  std::size_t min_bytes = 8, max_bytes = std::size_t(64) << 20;
  double factor = 2;
  std::string dtype = "float";
  int warmup = 5, iters = 20;
  std::vector<std::string> ops = {"all_gather", "reduce_scatter", "all_reduce", "broadcast"};
  std::vector<std::string> impls = {"raw", "sharded", "unit", "unit2", "units", "mixed", "fp8"};
  std::string json;
  double min_busbw = 0;  // GB/s, applies to every row with an nonzero bus factor
  bool check = true;
};

struct row {
  std::string op, impl, placement, type;
  std::size_t bytes, count;
  double us, algbw, busbw;
  long wrong;
};

// ---- small device/host helpers ---------------------------------------------------

template <class T>
struct iota_fn {  // p[i] = small integer from (rank, i): exact in bf16 and in sums over a few ranks
  T* p;
  int rank;
  std::size_t offset;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const {
    p[i] = convert<T>(float(int((std::size_t(rank) * 7 + (offset + i) * 3) % 13) - 6));
  }
};
template <class T>
inline float iota_value(int rank, std::size_t i) {
  return float(int((std::size_t(rank) * 7 + i * 3) % 13) - 6);
}
template <class To, class From>
struct cast_fn {
  const From* in;
  To* out;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const { out[i] = convert<To>(in[i]); }
};

template <class B>
struct timer {
  // Seconds per run of f, after `warmup` untimed runs and a barrier (so rank
  // skew and lazy set-up stay out of the figure). Without a setup step the
  // runs go back to back between two stamps, as nccl-tests times them; with
  // one, every run is set up, the ranks meet at a barrier, and only f is
  // timed. CUDA: events on the compute stream, where the collectives complete.
  template <class Setup, class F, class Barrier>
  static double run(int warmup, int iters, Setup&& setup, F&& f, Barrier&& barrier, bool has_setup) {
    for (int i = 0; i < warmup; ++i) {
      setup();
      f();
    }
    barrier();
    double total = 0;
    const int batches = has_setup ? iters : 1, per_batch = has_setup ? 1 : iters;
    for (int b = 0; b < batches; ++b) {
      if (has_setup) {
        setup();
        barrier();
      }
#if TESSERA_CUDA_COMPILER
      if constexpr (std::is_same_v<B, backend::cuda>) {
        tessera::cuda::event e0(true), e1(true);
        e0.record(tessera::cuda::current_stream());
        for (int i = 0; i < per_batch; ++i) f();
        e1.record(tessera::cuda::current_stream());
        e1.synchronize();
        float ms = 0;
        TESSERA_CUDA(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
        total += ms * 1e-3;
      } else
#endif
      {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < per_batch; ++i) f();
        total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
    }
    return total / std::max(iters, 1);
  }
};

inline double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return double(n - 1) / n;
}

}  // namespace collectives
