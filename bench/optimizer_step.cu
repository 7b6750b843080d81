// tessera-bench-optim: the optimizer step's kernels on one GPU, each beside
// the device-copy bandwidth measured in the same run.
//
//   fused AdamW, fp32 grads:               reads w g m v, writes w m v          28 B/element
//   fused AdamW, bf16 grads + bf16 shard:   reads w g m v, writes w m v + bf16   28 B/element
//   the same over 2048 tensors (1024 without weight decay: the no-decay table)
//   SGD with momentum:                     reads w g b, writes w b               20 B/element
//   cast fp32 -> bf16:                                                          6 B/element
//   sum of squares (the norm), fp32:                                           4 B/element
//
// The copy is cudaMemcpyAsync device to device; its bandwidth counts bytes
// read plus bytes written, like the kernels'. Times are medians of CUDA-event
// timings after warm-up, on random data.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <type_traits>
#include <string>
#include <vector>

#include "common.cuh"
#include "tessera/tessera.hpp"

using namespace tessera;
using ops = backend_ops<backend::cuda>;

using namespace tessera_bench;
namespace {
struct cast_fn {
  const float* in;
  bf16* out;
  bool vector_ok = true;
  static constexpr int vector_width = 8;
  __device__ void operator()(std::size_t i) const { out[i] = bf16(in[i]); }
  template <int V, bool Stream> __device__ void run(std::size_t base) const {
    const auto x = load_vec<V, Stream>(in + base);
    vec<bf16, V> y;
    TESSERA_UNROLL
    for (int l = 0; l < V; ++l) y.v[l] = bf16(x.v[l]);
    store_vec<V>(out + base, y);
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera-bench-optim: optimizer-step kernels against the device copy bandwidth"};
  int log2n = 30, warmup = 3, iters = 20;
  std::string json;
  double min_ratio = 0;
  bool variants = false;
  app.add_option("--log2-elements", log2n, "elements in the shard, as a power of two")->check(CLI::Range(10, 32));
  app.add_option("-w,--warmup", warmup, "warm-up runs");
  app.add_option("-n,--iters", iters, "timed runs (the median is reported)")->check(CLI::Range(1, 100000));
  app.add_option("--json", json, "write the results as JSON to this file");
  app.add_flag("--variants", variants, "also time every vector width, spread and cache policy of the AdamW pass");
  app.add_option("--min-ratio", min_ratio, "exit 1 when fused AdamW (fp32, one tensor) falls under this fraction of copy");
  CLI11_PARSE(app, argc, argv);
  try {
    const std::size_t n = std::size_t(1) << log2n;
    cudaDeviceProp prop{};
    TESSERA_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::printf("# tessera-bench-optim on %s, %zu elements (2^%d), median of %d runs\n", prop.name, n, log2n, iters);

    nlohmann::json out{{"device", prop.name}, {"elements", n}, {"iters", iters}, {"results", nlohmann::json::array()}};
    // The ceiling: a device-to-device copy of 8 bytes per element.
    double copy_gbs = 0;
    {
      dbuf<float> a = random_buffer<float>(2 * n, 1), b(2 * n);
      const double ms = time_ms([&] { ops::copy(b.span(), std::span<const float>(a.span())); }, warmup, iters);
      copy_gbs = 2.0 * 2 * n * sizeof(float) / (ms * 1e6);
      std::printf("%-44s %9.3f ms %9.1f GB/s\n", "copy (device to device, read + write)", ms, copy_gbs);
      out["copy_gbs"] = copy_gbs;
    }
    std::printf("%-44s %12s %14s %8s\n", "kernel", "time", "bandwidth", "of copy");
    double adamw_ratio = 0;
    auto report = [&](const std::string& name, double ms, double bytes_per_elem) {
      const double gbs = bytes_per_elem * double(n) / (ms * 1e6);
      std::printf("%-44s %9.3f ms %9.1f GB/s %7.1f%%\n", name.c_str(), ms, gbs, 100 * gbs / copy_gbs);
      out["results"].push_back({{"name", name}, {"ms", ms}, {"gbs", gbs}, {"ratio", gbs / copy_gbs},
                                {"bytes_per_element", bytes_per_elem}});
      return gbs / copy_gbs;
    };
    // Every launch shape of the vector for_each, to choose the default from data.
    using tessera::cuda::spread;
    auto sweep = [&](const std::string& prefix, const auto& k) {
      auto one = [&](auto v_tag, auto mode_tag, auto stream_tag, const char* mname) {
        constexpr int V = decltype(v_tag)::value;
        constexpr spread M = decltype(mode_tag)::value;
        constexpr bool S = decltype(stream_tag)::value;
        report(prefix + " V=" + std::to_string(V) + " " + mname + (S ? " stream" : ""),
               time_ms([&] { ops::for_each_vector<V, M, S>(n, k); }, warmup, iters), 28);
      };
      using gs = std::integral_constant<spread, spread::grid_stride>;
      using op = std::integral_constant<spread, spread::one_per_thread>;
      using un = std::integral_constant<spread, spread::unrolled>;
      using v4 = std::integral_constant<int, 4>;
      using v8 = std::integral_constant<int, 8>;
      using yes = std::true_type;
      using no = std::false_type;
      one(v4{}, gs{}, no{}, "grid-stride"); one(v4{}, gs{}, yes{}, "grid-stride");
      one(v4{}, op{}, no{}, "one-per-thread"); one(v4{}, op{}, yes{}, "one-per-thread");
      one(v4{}, un{}, no{}, "unrolled"); one(v4{}, un{}, yes{}, "unrolled");
      one(v8{}, gs{}, no{}, "grid-stride"); one(v8{}, op{}, no{}, "one-per-thread"); one(v8{}, op{}, yes{}, "one-per-thread");
    };
    auto w = random_buffer<float>(n, 2), m = random_buffer<float>(n, 3, 0.2f, -0.1f), v = random_buffer<float>(n, 4, 0.01f, 0.0f);
    dbuf<float> unit_scale(1);  // the clip factor the kernels read from device memory
    ops::fill(unit_scale.span(), 1.0f);
    {
      auto g = random_buffer<float>(n, 5);
      adamw_kernel<float, float, float> k{w.data(), g.data(), m.data(), v.data(), nullptr, {}, unit_scale.data(),
                                          1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.1f, 1.05f};
      k.vector_ok = true;
      adamw_ratio = report("fused AdamW, fp32 grads, 1 tensor", time_ms([&] { ops::for_each(n, k); }, warmup, iters), 28);
      if (variants) sweep("  AdamW fp32", k);
      sgd_kernel<float, float, float> s{w.data(), g.data(), m.data(), nullptr, {}, unit_scale.data(), 1e-3f, 0.9f, 1e-4f, true};
      s.vector_ok = true;
      report("SGD, momentum + Nesterov, fp32", time_ms([&] { ops::for_each(n, s); }, warmup, iters), 20);
      dbuf<double> acc(2);
      report("sum of squares (global norm), fp32",
             time_ms([&] { ops::sum_squares_into(std::span<const float>(g.span()), acc.data()); }, warmup, iters), 4);
    }
    {
      auto g = random_buffer<bf16>(n, 6);
      dbuf<bf16> shard(n);
      adamw_kernel<float, bf16, bf16> k{w.data(), g.data(), m.data(), v.data(), shard.data(), {}, unit_scale.data(),
                                        1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.1f, 1.05f};
      k.vector_ok = true;
      report("fused AdamW, bf16 grads -> bf16 shard", time_ms([&] { ops::for_each(n, k); }, warmup, iters), 28);
      if (variants) sweep("  AdamW bf16", k);
      // 2048 equal tensors, every other one without weight decay: the decay
      // mask with one bit per 16-element granule (the default alignment).
      const std::size_t per = n / 2048, granules = n / 16;
      std::vector<std::uint32_t> bits((granules + 31) / 32, ~0u);
      for (std::size_t t = 1; t < 2048; t += 2)
        for (std::size_t gi = t * per / 16; gi < (t + 1) * per / 16; ++gi) bits[gi / 32] &= ~(1u << (gi % 32));
      dbuf<std::uint32_t> dt(bits.size());
      ops::copy_from_host(dt.span(), std::span<const std::uint32_t>(bits));
      k.decay = {dt.data(), 4};
      report("fused AdamW, bf16 -> bf16, 2048 tensors", time_ms([&] { ops::for_each(n, k); }, warmup, iters), 28);
      cast_fn c{w.data(), shard.data()};
      report("cast fp32 -> bf16", time_ms([&] { ops::for_each(n, c); }, warmup, iters), 6);
    }
    if (!json.empty()) std::ofstream(json) << out.dump(2) << "\n";
    if (min_ratio > 0 && adamw_ratio < min_ratio) {
      std::printf("tessera: fused AdamW at %.1f%% of copy, under the floor %.1f%%\n", 100 * adamw_ratio, 100 * min_ratio);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
