// CUDA backend pieces against references on fresh random data of awkward
// sizes: conversions, fill/copy, the for_each paths, the fused optimizer pass
// against float64, the norm reduction, comm::mpi_device at every world size,
// comm::nccl at world size 1 (blocking, with a timeout, through a rendezvous
// file), and the error path.
#define BOOST_TEST_MODULE tessera_kernels_cuda
#include "common/mpi_test_main.hpp"
#include "common/util.hpp"
#include "common/cuda_util.cuh"

#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "tessera/tessera.hpp"

using namespace tessera;
using ops = backend_ops<backend::cuda>;
template <class T> using dbuf = tessera::cuda::buffer<T>;

namespace {
using tessera_test::to_device;
using tessera_test::to_host;
struct widen_fn {
  const bf16* in;
  float* out;
  __device__ void operator()(std::size_t i) const { out[i] = float(in[i]); }
};
struct narrow_fn {
  const float* in;
  bf16* out;
  fp16* out16;
  __device__ void operator()(std::size_t i) const {
    out[i] = bf16(in[i]);
    out16[i] = fp16(in[i]);
  }
};
const std::size_t sizes[] = {1, 3, 7, 33, 1001, (1u << 20) + 3};
}  // namespace

BOOST_AUTO_TEST_CASE(conversions_on_device_match_host) {
  std::vector<bf16> all(1 << 16);
  for (std::size_t b = 0; b < all.size(); ++b) all[b] = bf16::from_bits(std::uint16_t(b));
  auto d_all = to_device(all);
  dbuf<float> d_wide(all.size());
  ops::for_each(all.size(), widen_fn{d_all.data(), d_wide.data()});
  const auto wide = to_host(d_wide);
  for (std::size_t b = 0; b < all.size(); ++b) {
    const float h = float(all[b]);
    BOOST_TEST((std::isnan(h) ? std::isnan(wide[b]) : wide[b] == h));
  }
  std::vector<float> xs(1 << 20);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    std::uint32_t u = std::uint32_t(tessera_test::mix(i + 99));
    std::memcpy(&xs[i], &u, 4);
    if (std::isnan(xs[i])) xs[i] = 0.5f;
  }
  auto d_x = to_device(xs);
  dbuf<bf16> d_b(xs.size());
  dbuf<fp16> d_h(xs.size());
  ops::for_each(xs.size(), narrow_fn{d_x.data(), d_b.data(), d_h.data()});
  const auto b = to_host(d_b);
  const auto h = to_host(d_h);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) bad += (b[i].bits != bf16(xs[i]).bits) + (h[i].bits != fp16(xs[i]).bits);
  BOOST_TEST(bad == 0u);
}

// The wire conversion (scale_convert) on the device, through its
// 8-wide path (aligned) and its element path (offset by one element), fp32 ->
// bf16 and in place, against the host's arithmetic bit for bit.
BOOST_AUTO_TEST_CASE(scale_convert_vector_and_element_paths_match_host) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd;
  for (std::size_t n : sizes)
    for (std::size_t off : {std::size_t(0), std::size_t(1)}) {
      std::vector<float> x(n + off);
      for (auto& v : x) v = nd(rng);
      auto dx = to_device(x);
      dbuf<bf16> dy(n + off);
      const tessera::scale_convert<bf16, float> f(dx.data() + off, dy.data() + off, 0.25);
      BOOST_TEST(f.vector_ok == (off == 0));
      ops::for_each(n, f);
      ops::for_each(n, tessera::scale_convert<float, float>(dx.data() + off, dx.data() + off, 0.5));  // in place
      const auto y = to_host(dy);
      const auto x2 = to_host(dx);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i)
        bad += (y[off + i].bits != bf16(x[off + i] * 0.25f).bits) + (x2[off + i] != x[off + i] * 0.5f);
      BOOST_TEST_CONTEXT("n " << n << " offset " << off) { BOOST_TEST(bad == 0u); }
    }
}

BOOST_AUTO_TEST_CASE(fill_copy_and_memory_accounting) {
  const std::size_t before = memory_of<backend::cuda>().current();
  for (std::size_t n : sizes) {
    dbuf<float> a(n), b(n);
    BOOST_TEST(memory_of<backend::cuda>().current() == before + 2 * n * sizeof(float));
    ops::fill(a.span(), 2.5f);
    ops::fill(b.span(), std::nanf(""));  // poison
    ops::copy(b.span(), std::span<const float>(a.span()));
    for (float x : to_host(b)) BOOST_TEST_REQUIRE(x == 2.5f);
  }
  BOOST_TEST(memory_of<backend::cuda>().current() == before);
}

BOOST_AUTO_TEST_CASE(sum_squares_against_float64) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> nd;
  for (std::size_t n : sizes) {
    std::vector<float> x(n);
    double ref = 0;
    for (auto& v : x) {
      v = nd(rng);
      ref += double(v) * v;
    }
    auto d = to_device(x);
    dbuf<double> acc(2);
    ops::fill(acc.span(), 0.0);
    ops::sum_squares_into(std::span<const float>(d.span()), acc.data());
    ops::sum_squares_into(std::span<const float>(d.span()), acc.data());  // accumulates
    auto a = to_host(acc);
    BOOST_TEST(std::abs(a[0] - 2 * ref) <= 1e-12 * 2 * ref);
    BOOST_TEST(a[1] == 0.0);
    x[n / 2] = std::numeric_limits<float>::infinity();
    auto d2 = to_device(x);
    ops::fill(acc.span(), 0.0);
    ops::sum_squares_into(std::span<const float>(d2.span()), acc.data());
    BOOST_TEST(to_host(acc)[1] == 1.0);
  }
}

// Many spans in one pass (the global norm's every unit): more spans than one
// launch takes, empty ones, odd sizes and starts off the 16-byte grid (the
// element path beside the vector one), on fresh random values with a NaN in
// one span of five where `nan` is set.
template <class T>
struct span_list {
  std::vector<T> x;  // on the host
  std::vector<std::size_t> offset, len;
  explicit span_list(bool nan) {
    std::mt19937_64 rng(std::random_device{}());
    std::normal_distribution<float> nd;
    const std::size_t count = 2 * tessera::cuda::detail::span_batch_size + 5;
    offset.resize(count);
    len.resize(count);
    for (std::size_t k = 0; k < count; ++k) len[k] = k % 17 == 0 ? 0 : (k * 7919) % 40000 + k;  // some empty
    len[count / 2] = (std::size_t(1) << 21) + 1;  // one long span: the grid's size
    std::size_t total = 0;
    for (std::size_t k = 0; k < count; ++k) {
      offset[k] = total + (k % 3);  // one span in three starts where the last ended, which may be off the grid
      total = offset[k] + len[k];
    }
    x.resize(total);
    for (auto& v : x) v = T(nd(rng) * 3.0f);
    if (nan)
      for (std::size_t k = 0; k < count; ++k)
        if (len[k] > 2 && k % 5 == 1) x[offset[k] + len[k] / 2] = T(std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<std::span<const T>> spans(const T* base) const {  // the same spans of a copy at base
    std::vector<std::span<const T>> r;
    for (std::size_t k = 0; k < len.size(); ++k) r.emplace_back(base + offset[k], len[k]);
    return r;
  }
};

// The float norm's sum against float64 of the same values, the non-finite
// ones counted and left out; fp32 and bf16.
template <class T>
void check_span_list_sum() {
  const span_list<T> l(true);
  double ref = 0, bad = 0;
  for (std::size_t k = 0; k < l.len.size(); ++k)
    for (std::size_t i = l.offset[k]; i < l.offset[k] + l.len[k]; ++i) {
      const double d = convert<double>(l.x[i]);
      if (std::isfinite(d)) ref += d * d;
      else bad += 1;
    }
  auto d = to_device(l.x);
  const auto spans = l.spans(d.data());
  dbuf<double> acc(2);
  ops::fill(acc.span(), 0.0);
  ops::sum_squares_into(std::span<const std::span<const T>>(spans), acc.data());
  const auto a = to_host(acc);
  BOOST_TEST(std::abs(a[0] - ref) <= 1e-12 * ref);
  BOOST_TEST(a[1] == bad);
  BOOST_TEST(bad > 0.0);
}
BOOST_AUTO_TEST_CASE(sum_squares_over_a_list_of_spans_against_float64) {
  check_span_list_sum<float>();
  check_span_list_sum<bf16>();
}

// exact_reduction's two passes over a list of spans give the host backend's
// integers bit for bit (the largest magnitude, the three limbs of the squares
// on its grid), and a norm within float64 rounding of the plain sum; with a
// NaN anywhere the max is +inf and the squares pass adds nothing.
template <class T>
void check_span_list_exact(bool nan) {
  using host = backend_ops<backend::host>;
  const span_list<T> l(nan);
  const auto hs = l.spans(l.x.data());
  double hmax = 0;
  std::uint64_t hl[fixed::norm_limbs] = {};
  host::max_abs_into(std::span<const std::span<const T>>(hs), &hmax);
  host::sum_squares_fixed_into(std::span<const std::span<const T>>(hs), &hmax, hl);
  auto d = to_device(l.x);
  const auto ds = l.spans(d.data());
  dbuf<double> max(1);
  dbuf<std::uint64_t> limbs(fixed::norm_limbs);
  ops::fill(max.span(), 0.0);
  ops::fill(limbs.span(), std::uint64_t(0));
  ops::max_abs_into(std::span<const std::span<const T>>(ds), max.data());
  ops::sum_squares_fixed_into(std::span<const std::span<const T>>(ds), max.data(), limbs.data());
  const auto m = to_host(max)[0];
  auto dl = to_host(limbs);
  BOOST_TEST(m == hmax);
  for (std::size_t k = 0; k < fixed::norm_limbs; ++k) BOOST_TEST(dl[k] == hl[k]);
  if (nan) {
    BOOST_TEST(std::isinf(m));
    for (std::size_t k = 0; k < fixed::norm_limbs; ++k) BOOST_TEST(dl[k] == 0u);
    return;
  }
  double ref = 0, top = 0;  // over the spans only, not the gaps between them
  for (const auto& x : hs)
    for (const T& v : x) {
      const double f = convert<double>(v);
      ref += f * f;
      top = std::max(top, std::abs(f));
    }
  BOOST_TEST(m == top);
  fixed::carry(dl.data());
  const double sum = fixed::square_sum(dl.data(), fixed::square_shift(m));
  BOOST_TEST(std::abs(sum - ref) <= 1e-9 * ref);
}
BOOST_AUTO_TEST_CASE(exact_norm_passes_over_a_list_of_spans_match_the_host) {
  for (bool nan : {false, true}) {
    check_span_list_exact<float>(nan);
    check_span_list_exact<bf16>(nan);
  }
}

// The fused AdamW pass on the device (vector and scalar paths) against float64.
BOOST_AUTO_TEST_CASE(adamw_pass_against_float64) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> nd;
  for (std::size_t n : sizes)
    for (int path = 0; path < 2; ++path) {
      std::vector<float> w(n), m(n), v(n);
      std::vector<bf16> g(n);
      for (std::size_t i = 0; i < n; ++i) {
        w[i] = float(nd(rng)); m[i] = float(0.1 * nd(rng)); v[i] = float(std::abs(0.01 * nd(rng)));
        g[i] = bf16(float(nd(rng)));
      }
      auto dw = to_device(w), dm = to_device(m), dv = to_device(v);
      auto dg = to_device(g);
      dbuf<bf16> dout(n);
      ops::fill(dout.span(), bf16(std::nanf("")));
      // No decay on [n/3, n/3 + n/4): a bit per element (granule 1).
      std::vector<std::uint32_t> bits((n + 31) / 32, ~0u);
      for (std::size_t i = n / 3; i < n / 3 + n / 4; ++i) bits[i / 32] &= ~(1u << (i % 32));
      auto dt = to_device(bits);
      const double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, decay = 0.1, scale = 0.7;
      const double bc1 = 1 - std::pow(b1, 7), bc2 = 1 - std::pow(b2, 7);
      const auto dscale = to_device(std::vector<float>{float(scale)});  // the clip factor lives in device memory
      adamw_kernel<float, bf16, bf16> k{dw.data(), dg.data(), dm.data(), dv.data(), dout.data(),
                                        {dt.data(), 0}, dscale.data(), float(lr), float(b1), float(b2),
                                        float(eps), float(decay), float(1 / bc1), float(1 / std::sqrt(bc2))};
      k.vector_ok = path == 0;
      ops::for_each(n, k);
      const auto W = to_host(dw), M = to_host(dm), V = to_host(dv);
      const auto O = to_host(dout);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double gi = double(float(g[i])) * scale;
        double wd = w[i];
        if (!(i >= n / 3 && i < n / 3 + n / 4)) wd -= lr * decay * wd;
        const double md = b1 * m[i] + (1 - b1) * gi, vd = b2 * v[i] + (1 - b2) * gi * gi;
        wd -= lr * (md / bc1) / (std::sqrt(vd / bc2) + eps);
        wrong += !(std::abs(W[i] - wd) <= 4e-7 * std::max(1.0, std::abs(wd))) +
                 !(std::abs(M[i] - md) <= 4e-7 * std::max(1.0, std::abs(md))) +
                 !(std::abs(V[i] - vd) <= 4e-7 * std::max(1e-3, std::abs(vd))) + (O[i].bits != bf16(W[i]).bits);
      }
      BOOST_TEST_CONTEXT("n " << n << (path == 0 ? " vector" : " scalar") << " path") { BOOST_TEST(wrong == 0u); }
    }
}

BOOST_AUTO_TEST_CASE(mpi_device_collectives) {
  comm::mpi_device c;
  const int N = c.size(), r = c.rank();
  for (std::size_t n : {std::size_t(1), std::size_t(1001)}) {
    std::vector<float> mine(n * std::size_t(N));
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = float((r + 1) * int(i % 7));
    auto d = to_device(mine);
    dbuf<float> out(n), all(n * std::size_t(N));
    comm::reduce_scatter(c, std::span<const float>(d.span()), out.span());
    const auto o = to_host(out);
    const float ranks = float(N * (N + 1) / 2);
    for (std::size_t i = 0; i < n; ++i) BOOST_TEST(o[i] == ranks * float((std::size_t(r) * n + i) % 7));
    c.all_gather(d.data(), all.data(), n, dtype::f32);
    const auto a = to_host(all);
    for (int q = 0; q < N; ++q)
      for (std::size_t i = 0; i < n; ++i) BOOST_TEST(a[std::size_t(q) * n + i] == float((q + 1) * int(i % 7)));
  }
}

BOOST_AUTO_TEST_CASE(nccl_at_world_size_one) {
  comm::mpi_device world;
  if (world.size() != 1) return;  // NCCL refuses two ranks on one GPU
  for (double timeout : {0.0, 30.0}) {
    comm::nccl c(comm::nccl_options{.timeout_s = timeout});
    BOOST_TEST(c.size() == 1);
    std::vector<float> x{1, 2, 3, 4, 5};
    auto d = to_device(x);
    dbuf<float> y(5);
    comm::all_reduce(c, d.span(), comm::reduce_op::avg);
    c.all_gather(d.data(), y.data(), 5, dtype::f32);
    auto q = c.ireduce_scatter(y.data(), d.data(), 5, dtype::f32, comm::reduce_op::sum);
    q.wait();
    c.broadcast(d.data(), 5, dtype::f32, 0);
    c.barrier();
    BOOST_TEST(to_host(d) == x);
  }
  // Through a rendezvous file, as without MPI.
  const auto path = std::filesystem::temp_directory_path() / ("tessera-nccl-id-" + std::to_string(::getpid()));
  {
    comm::nccl c(0, 1, path.string());
    BOOST_TEST(c.rank() == 0);
  }
  std::filesystem::remove(path);
  BOOST_CHECK_THROW(comm::nccl(1, 2, "/nonexistent/dir/id", comm::nccl_options{.rendezvous_timeout_s = 0.05}),
                    tessera::error);
}

// Row-major GEMM through the per-stream cuBLAS handle against float64, every
// transpose combination, awkward sizes; fp32 (TF32 allowed) and bf16 operands.
template <class T>
void check_gemm(double tol) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> nd;
  const int m = 33, n = 17, k = 65;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      std::vector<T> a(std::size_t(m) * k), b(std::size_t(k) * n);
      for (auto& x : a) x = convert<T>(nd(rng));
      for (auto& x : b) x = convert<T>(nd(rng));
      std::vector<float> c0(std::size_t(m) * n);
      for (auto& x : c0) x = nd(rng);
      auto da = to_device(a), db = to_device(b);
      auto dc = to_device(c0);
      tessera::cuda::gemm(ta, tb, m, n, k, 0.5f, da.data(), db.data(), 2.0f, dc.data());
      const auto c = to_host(dc);
      double err = 0, ref_norm = 0;
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double s = 0;
          for (int p = 0; p < k; ++p) {
            const double av = convert<double>(ta ? a[std::size_t(p) * m + i] : a[std::size_t(i) * k + p]);
            const double bv = convert<double>(tb ? b[std::size_t(j) * k + p] : b[std::size_t(p) * n + j]);
            s += av * bv;
          }
          const double ref = 0.5 * s + 2.0 * c0[std::size_t(i) * n + j];
          err += (c[std::size_t(i) * n + j] - ref) * (c[std::size_t(i) * n + j] - ref);
          ref_norm += ref * ref;
        }
      BOOST_TEST_CONTEXT("trans_a " << ta << " trans_b " << tb) { BOOST_TEST(std::sqrt(err / ref_norm) <= tol); }
    }
}
BOOST_AUTO_TEST_CASE(gemm_against_float64) {
  check_gemm<float>(1e-3);  // TF32 tensor cores: 10-bit mantissa products, fp32 sums
  check_gemm<bf16>(1e-5);   // exact bf16 products, fp32 sums: only the accumulation rounds
  BOOST_TEST(tessera::cuda::blas_for() == tessera::cuda::blas_for());  // one handle per stream, reused
}

BOOST_AUTO_TEST_CASE(failed_cuda_call_is_a_tessera_error) {
  try {
    TESSERA_CUDA(cudaSetDevice(1 << 20));
    BOOST_FAIL("no throw");
  } catch (const tessera::error& e) {
    const std::string w = e.what();
    BOOST_TEST(w.rfind("tessera: CUDA call failed: cudaErrorInvalidDevice", 0) == 0u);
    BOOST_TEST(w.find("cudaSetDevice") != std::string::npos);
  }
  BOOST_TEST(cudaGetLastError() == cudaSuccess);  // the sticky state was cleared
  BOOST_CHECK_THROW(dbuf<float>(std::size_t(1) << 50), tessera::error);  // 4 PiB: out of memory, reported
}
