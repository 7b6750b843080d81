// fp8 on the GPU: the library's conversions against the hardware's (every
// float, both formats), fp8_gather over comm::mpi_device at every world size
// equal bit for bit to the host's cast of the gathered tensor, the kernel
// kit's amax, cast and cast-transpose against the host, and cuBLASLt's fp8
// products against float64 of the same quantized operands.
#define BOOST_TEST_MODULE tessera_fp8_cuda
#include "common/mpi_test_main.hpp"
#include "common/util.hpp"
#include "common/cuda_util.cuh"

#include <cuda_fp8.h>

#include <cmath>
#include <vector>

#include "tessera/backend/cuda/blaslt_fp8.hpp"
#include "tessera/tessera.hpp"
#include "trainer_kit/kernels/fp8.cuh"

using namespace tessera;
using ops = backend_ops<backend::cuda>;
template <class T> using dbuf = tessera::cuda::buffer<T>;
using tessera_test::expect_error;
using tessera_test::to_device;
using tessera_test::to_host;
using tessera_test::uniform;

namespace {
// Counts the floats whose library cast differs from the hardware's
// (cvt.rn.satfinite), over the bit patterns [begin, begin + n).
template <class F>
__global__ void compare_with_hardware(std::uint64_t begin, std::uint64_t n, unsigned long long* wrong,
                                      std::uint32_t* first) {
  constexpr __nv_fp8_interpretation_t kind = std::is_same_v<F, e4m3> ? __NV_E4M3 : __NV_E5M2;
  for (std::uint64_t i = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::uint64_t(gridDim.x) * blockDim.x) {
    const std::uint32_t u = std::uint32_t(begin + i);
    const float x = __uint_as_float(u);
    const std::uint8_t hw = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind);
    const std::uint8_t ours = F::from_float(x);
    // NaN: any NaN code is a NaN (the hardware may keep the sign)
    const bool same = hw == ours || (isnan(x) && (ours & 0x7f) == 0x7f && (hw & 0x7f) >= (kind == __NV_E4M3 ? 0x7f : 0x7d));
    if (!same) {
      atomicAdd(wrong, 1ull);
      atomicMin(first, u);
    }
  }
}
template <class F>
__global__ void decode_with_hardware(float* ours, float* hw) {
  constexpr __nv_fp8_interpretation_t kind = std::is_same_v<F, e4m3> ? __NV_E4M3 : __NV_E5M2;
  const int c = threadIdx.x;
  ours[c] = float(F::from_bits(std::uint8_t(c)));
  hw[c] = __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), kind)));
}
using formats = std::tuple<e4m3, e5m2>;
}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(every_float_casts_like_the_hardware, F, formats) {
  dbuf<unsigned long long> wrong(1);
  dbuf<std::uint32_t> first(1);
  ops::fill(wrong.span(), 0ull);
  ops::fill(first.span(), 0xffffffffu);
  compare_with_hardware<F><<<4096, 256>>>(0, std::uint64_t(1) << 32, wrong.data(), first.data());
  TESSERA_CUDA(cudaGetLastError());
  const auto w = to_host(wrong);
  const auto f = to_host(first);
  BOOST_TEST_CONTEXT("first differing float bits 0x" << std::hex << f[0]) { BOOST_TEST(w[0] == 0ull); }

  dbuf<float> ours(256), hw(256);
  decode_with_hardware<F><<<1, 256>>>(ours.data(), hw.data());
  const auto o = to_host(ours), h = to_host(hw);
  for (int c = 0; c < 256; ++c) {
    const float host = float(F::from_bits(std::uint8_t(c)));
    BOOST_TEST_CONTEXT("code " << c) {
      if (std::isnan(h[std::size_t(c)])) {
        BOOST_TEST(std::isnan(o[std::size_t(c)]));
      } else {
        BOOST_TEST(o[std::size_t(c)] == h[std::size_t(c)]);
        BOOST_TEST(host == h[std::size_t(c)]);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(gathers_equal_the_host_cast_of_the_gathered_tensor) {
  comm::mpi_device c;
  for (std::size_t numel : {std::size_t(5), std::size_t(1000), std::size_t((1u << 20) + 3)}) {
    for (auto kind : {fp8::recipe::current, fp8::recipe::delayed}) {
      ShardedTensor<bf16, backend::cuda> w(c, tessera::shape{std::int64_t(numel)});
      fp8_gather<e4m3, backend::cuda> g(c, w.shard().size(), {kind, 2, 0});
      std::vector<bf16> full(numel);
      std::vector<float> amaxes;
      float ref = 1.0f;
      for (int k = 0; k < 4; ++k) {
        float amax = 0;
        for (std::size_t i = 0; i < numel; ++i) {
          full[i] = bf16(float(uniform(i, k, 5) * (i == std::size_t(k) * 31 % numel ? 50.0 : 1.0)));
          amax = std::max(amax, std::fabs(float(full[i])));
        }
        auto d_full = to_device(full);
        w.scatter_from(std::span<const bf16>(d_full.span()));
        g.gather(std::span<const bf16>(w.shard()));
        float use = amax;
        if (kind == fp8::recipe::delayed && k > 0)
          use = *std::max_element(amaxes.end() - std::min<std::ptrdiff_t>(2, std::ptrdiff_t(amaxes.size())), amaxes.end());
        ref = fp8::scale_for<e4m3>(use, ref);
        amaxes.push_back(amax);
        std::vector<e4m3> got(g.full().size());
        ops::copy_to_host(std::span<e4m3>(got), g.full());
        std::vector<float> scale(2);
        ops::copy_to_host(std::span<float>(scale), std::span<const float>(g.scale(), 2));
        BOOST_TEST_CONTEXT("numel " << numel << " step " << k << " recipe " << fp8::name_of(kind)) {
          BOOST_TEST(scale[0] == ref);
          std::size_t wrong = 0;
          for (std::size_t i = 0; i < numel; ++i) wrong += got[i].bits != fp8::cast<e4m3>(full[i], ref).bits;
          BOOST_TEST(wrong == 0u);
        }
      }
    }
  }
}

namespace {
template <class T> std::vector<T> random_tensor(std::size_t n, int salt) {
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = convert<T>(uniform(i, salt) * std::exp(3.0 * uniform(i, salt, 9)));  // magnitudes over e^-3 .. e^3
  return x;
}
template <class T> float host_amax(const std::vector<T>& x) {
  float m = 0;
  for (const T& v : x) m = std::max(m, std::fabs(convert<float>(v)));
  return m;
}
using kit_types = std::tuple<float, bf16>;
}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(kit_amax_cast_and_transpose_equal_the_host, T, kit_types) {
  namespace k = trainer_kit::kernels;
  for (auto [rows, cols] : {std::pair{1, 1}, std::pair{37, 70}, std::pair{256, 96}, std::pair{1000, 33}}) {
    const std::size_t n = std::size_t(rows) * std::size_t(cols);
    const auto x = random_tensor<T>(n, rows + cols);
    const float amax = host_amax(x);
    const float scale = fp8::scale_for<e4m3>(amax, 1.0f);
    auto dx = to_device(x);
    auto dscale = to_device(std::vector<float>{scale, 1.0f / scale});
    dbuf<float> damax(3);
    ops::fill(damax.span(), 0.0f);
    dbuf<e4m3> out(n), out2(n), out_t(n);
    k::fp8_amax(dx.data(), n, damax.data());
    k::fp8_cast(dx.data(), n, dscale.data(), out.data(), damax.data() + 1);
    k::fp8_cast_transpose(dx.data(), rows, cols, dscale.data(), out2.data(), out_t.data(), damax.data() + 2);
    const auto am = to_host(damax);
    const auto o = to_host(out), o2 = to_host(out2), ot = to_host(out_t);
    std::size_t wrong = 0, wrong_t = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const std::size_t i = std::size_t(r) * std::size_t(cols) + std::size_t(c);
        const std::uint8_t want = fp8::cast<e4m3>(x[i], scale).bits;
        wrong += (o[i].bits != want) + (o2[i].bits != want);
        wrong_t += ot[std::size_t(c) * std::size_t(rows) + std::size_t(r)].bits != want;
      }
    BOOST_TEST_CONTEXT(rows << " x " << cols << " " << tessera_test::type_name<T>()) {
      BOOST_TEST(am[0] == amax);
      BOOST_TEST(am[1] == amax);
      BOOST_TEST(am[2] == amax);
      BOOST_TEST(wrong == 0u);
      BOOST_TEST(wrong_t == 0u);
    }
  }
  // the scale update runs on the device as on the host
  dbuf<float> a(1), sc(2), hist(4);
  ops::fill(a.span(), 3.0f);
  ops::fill(sc.span(), 1.0f);
  ops::fill(hist.span(), 0.0f);
  for (std::size_t step = 0; step < 6; ++step)
    ops::for_each(1, fp8::scale_update<e5m2, float>{a.data(), sc.data(), hist.data(), 4, step, fp8::recipe::delayed, 1});
  const auto s = to_host(sc);
  BOOST_TEST(s[0] == fp8::scale_for<e5m2>(3.0f, 1.0f, 1));
  BOOST_TEST(s[1] == 1.0f / s[0]);
}

namespace {
// A[rows, k] of random values cast with the scale that maps their amax onto
// F's largest value: the codes, the dequantising scale, and the values they stand for.
template <class F> struct quantized {
  std::vector<F> codes;
  float scale_inv;
  std::vector<double> values;
};
template <class F> quantized<F> quantize(int rows, int k, int salt, double spread) {
  std::vector<float> x(std::size_t(rows) * std::size_t(k));
  float amax = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = float(uniform(i, salt) * std::exp(spread * uniform(i, salt, 1)));
    amax = std::max(amax, std::fabs(x[i]));
  }
  const float s = fp8::scale_for<F>(amax, 1.0f);
  quantized<F> q{std::vector<F>(x.size()), 1.0f / s, std::vector<double>(x.size())};
  for (std::size_t i = 0; i < x.size(); ++i) {
    q.codes[i] = fp8::cast<F>(x[i], s);
    q.values[i] = double(float(q.codes[i])) * double(q.scale_inv);
  }
  return q;
}

template <class TA, class TB, class TD> void check_product(int m, int n, int k, bool fast, bool with_bias, bool amax) {
  const auto A = quantize<TA>(m, k, 1 + m, 1.0);
  const auto B = quantize<TB>(n, k, 2 + n, 2.0);
  auto dA = to_device(A.codes);
  auto dB = to_device(B.codes);
  auto dscale = to_device(std::vector<float>{A.scale_inv, B.scale_inv});
  std::vector<TD> bias(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) bias[std::size_t(j)] = convert<TD>(uniform(j, 77));
  auto dbias = to_device(bias);
  dbuf<TD> dD(std::size_t(m) * std::size_t(n));
  dbuf<float> damax(1);
  ops::fill(damax.span(), -1.0f);
  tessera::cuda::fp8_matmul_problem<TA, TB, TD> p;
  p.m = m, p.n = n, p.k = k, p.a = dA.data(), p.b = dB.data(), p.d = dD.data();
  p.a_scale_inv = dscale.data(), p.b_scale_inv = dscale.data() + 1, p.alpha = 0.75f, p.fast_accum = fast;
  if (with_bias) p.bias = dbias.data();
  if (amax) p.amax_d = damax.data();
  BOOST_TEST_CONTEXT("m " << m << " n " << n << " k " << k << " fast " << fast << " bias " << with_bias << " amax "
                          << amax << " D " << tessera_test::type_name<TD>()) {
    BOOST_REQUIRE(tessera::cuda::fp8_matmul_supported(p));
    tessera::cuda::fp8_matmul(p);
    const auto D = to_host(dD);
    double worst = 0, want_amax = 0;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double s = 0, mag = 0;
        for (int q = 0; q < k; ++q) {
          const double t = A.values[std::size_t(i) * std::size_t(k) + std::size_t(q)] *
                           B.values[std::size_t(j) * std::size_t(k) + std::size_t(q)];
          s += t;
          mag += std::fabs(t);
        }
        s *= 0.75;
        mag *= 0.75;
        if (with_bias) s += convert<double>(bias[std::size_t(j)]), mag += std::fabs(convert<double>(bias[std::size_t(j)]));
        want_amax = std::max(want_amax, std::fabs(s));
        const double got = convert<double>(D[std::size_t(i) * std::size_t(n) + std::size_t(j)]);
        worst = std::max(worst, std::fabs(got - s) / mag);
      }
    // fp32 accumulation of exact fp8 products: a few ulps of float relative to
    // the sum of magnitudes; fast accumulation and a bf16 result round more.
    const double tol = std::is_same_v<TD, bf16> ? 0x1p-8 : fast ? 0x1p-10 : 0x1p-20;
    BOOST_TEST(worst <= tol);
    if (amax) {
      const auto am = to_host(damax);
      BOOST_TEST(std::fabs(double(am[0]) - want_amax) <= 1e-3 * want_amax);
    }
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(fp8_products_equal_float64_of_the_quantized_operands) {
  if (tessera_test::world_rank() != 0) return;  // one GPU's products; the other ranks wait at the end
  int major = 0;
  TESSERA_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 9) {
    BOOST_TEST_MESSAGE("fp8 products need Hopper (compute capability 9.0); this GPU is " << major << ".x");
    return;
  }
  check_product<e4m3, e4m3, float>(200, 128, 256, false, false, false);
  check_product<e4m3, e4m3, float>(77, 48, 1024, true, false, false);
  check_product<e4m3, e4m3, bf16>(128, 256, 512, false, true, true);
  check_product<e4m3, e5m2, bf16>(64, 96, 160, false, false, false);
  check_product<e5m2, e4m3, float>(33, 64, 64, false, true, false);
}

BOOST_AUTO_TEST_CASE(fp8_products_refuse_what_hopper_cannot_run) {
  if (tessera_test::world_rank() != 0) return;
  dbuf<e4m3> a(64 * 40), b(64 * 40);
  dbuf<float> d(64 * 64), s(2);
  tessera::cuda::fp8_matmul_problem<e4m3, e4m3, float> p;
  p.m = 64, p.n = 64, p.k = 40, p.a = a.data(), p.b = b.data(), p.d = d.data();
  p.a_scale_inv = s.data(), p.b_scale_inv = s.data() + 1;
  expect_error([&] { tessera::cuda::fp8_matmul(p); }, "multiples of 16");
  p.k = 32;
  p.a_scale_inv = nullptr;
  expect_error([&] { tessera::cuda::fp8_matmul(p); }, "scale pointers");
}
