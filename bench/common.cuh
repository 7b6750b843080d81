#pragma once
// What the GPU benchmarks share: random device data (never time on zeros)
// and CUDA-event timing.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "tessera/tessera.hpp"

namespace tessera_bench {
using namespace tessera;
template <class T> using dbuf = tessera::cuda::buffer<T>;

template <class T>
struct random_fill {
  T* p;
  std::uint64_t seed;
  float scale, offset;
  __device__ void operator()(std::size_t i) const {
    const std::uint64_t x = splitmix64((i + 1) * 0x9e3779b97f4a7c15ull ^ seed);
    p[i] = convert<T>(float(double(x >> 40) * 0x1p-24) * scale + offset);
  }
};
template <class T> dbuf<T> random_buffer(std::size_t n, std::uint64_t seed, float scale = 2, float offset = -1) {
  dbuf<T> b(n);
  backend_ops<backend::cuda>::for_each(n, random_fill<T>{b.data(), seed, scale, offset});
  return b;
}
// Median milliseconds of `iters` runs of f after `warmup` runs.
inline double time_ms(const std::function<void()>& f, int warmup, int iters) {
  tessera::cuda::event a(true), b(true);
  for (int i = 0; i < warmup; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    a.record(tessera::cuda::current_stream());
    f();
    b.record(tessera::cuda::current_stream());
    b.synchronize();
    float ms = 0;
    TESSERA_CUDA(cudaEventElapsedTime(&ms, a.get(), b.get()));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace tessera_bench
