// The GPU trainer's arithmetic against float64 on fresh random data: cuBLASLt
// products with each epilogue (bf16 operands, bf16 or fp32 results, beta 0
// and 1, a separate C), the separate epilogue kernels used for fp32,
// softmax cross-entropy, embedding gather and gradient, column sums.
#define BOOST_TEST_MODULE tessera_mlp_kernels_cuda
#include "common/mpi_test_main.hpp"
#include "common/util.hpp"
#include "common/cuda_util.cuh"
#include "common/reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "mlp_lm/cuda_kernels.cuh"
#include "tessera/backend/cuda/blaslt.hpp"
#include "tessera/tessera.hpp"

using namespace tessera;
using ops = backend_ops<backend::cuda>;
template <class T> using dbuf = tessera::cuda::buffer<T>;
using tessera::cuda::epilogue;

namespace {
using tessera_test::to_device;
using tessera_test::to_host;
template <class T> std::vector<T> random_vec(std::size_t n, std::mt19937& g, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = convert<T>(d(g));
  return v;
}
using tessera_test::gelu64;
using tessera_test::gelu_grad64;
// Row-major op(A)[m,k] op(B)[k,n] in float64, and the matching sum of |terms| (the error scale).
template <class T>
void ref_product(bool ta, bool tb, int m, int n, int k, const std::vector<T>& a, const std::vector<T>& b,
                 std::vector<double>& out, std::vector<double>& mag) {
  out.assign(std::size_t(m) * std::size_t(n), 0.0);
  mag.assign(out.size(), 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0, s_abs = 0;
      for (int p = 0; p < k; ++p) {
        const double x = convert<double>(ta ? a[std::size_t(p) * std::size_t(m) + std::size_t(i)] : a[std::size_t(i) * std::size_t(k) + std::size_t(p)]);
        const double y = convert<double>(tb ? b[std::size_t(j) * std::size_t(k) + std::size_t(p)] : b[std::size_t(p) * std::size_t(n) + std::size_t(j)]);
        s += x * y;
        s_abs += std::abs(x * y);
      }
      out[std::size_t(i) * std::size_t(n) + std::size_t(j)] = s;
      mag[std::size_t(i) * std::size_t(n) + std::size_t(j)] = s_abs;
    }
}
constexpr double bf16_eps = 1.0 / 128;  // one bf16 ulp at 1, relative: rounding of a result
}  // namespace

BOOST_AUTO_TEST_CASE(products_in_every_transpose_match_float64) {
  std::mt19937 g(11);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.0f, 1.0f}) {
        const int m = 37, n = 24, k = 56;  // 37 rows: not a multiple of any tile
        const auto a = random_vec<bf16>(std::size_t(m) * k, g), b = random_vec<bf16>(std::size_t(k) * n, g);
        const auto c0 = random_vec<float>(std::size_t(m) * n, g);
        auto da = to_device(a), db = to_device(b);
        auto dd = to_device(c0);
        tessera::cuda::matmul(tessera::cuda::matmul_problem<bf16, float>{
            .trans_a = bool(ta), .trans_b = bool(tb), .m = m, .n = n, .k = k, .a = da.data(), .b = db.data(),
            .d = dd.data(), .beta = beta});
        std::vector<double> ref, mag;
        ref_product(ta, tb, m, n, k, a, b, ref, mag);
        const auto got = to_host(dd);
        double worst = 0;
        for (std::size_t i = 0; i < got.size(); ++i)
          worst = std::max(worst, std::abs(got[i] - (ref[i] + beta * c0[i])) / (mag[i] + std::abs(c0[i]) + 1e-30));
        BOOST_TEST_CONTEXT("trans_a " << ta << " trans_b " << tb << " beta " << beta) { BOOST_TEST(worst <= 1e-5); }
      }
}

// set_matmul_tuning: the first run of each problem times several kernels; the
// result must still be one product (an accumulating one added once, not once
// per timed run), and the summary must count the problems timed.
BOOST_AUTO_TEST_CASE(tuned_products_add_once_and_match_float64) {
  std::mt19937 g(12);
  tessera::cuda::set_matmul_tuning(8);
  const int before = tessera::cuda::matmul_tuning_result().timed;
  const int m = 384, n = 256, k = 512;
  for (int ta = 0; ta < 2; ++ta)
    for (float beta : {0.0f, 1.0f}) {
      const auto a = random_vec<bf16>(std::size_t(m) * k, g), b = random_vec<bf16>(std::size_t(k) * n, g);
      const auto c0 = random_vec<float>(std::size_t(m) * n, g);
      auto da = to_device(a), db = to_device(b);
      auto dd = to_device(c0);
      const tessera::cuda::matmul_problem<bf16, float> p{.trans_a = bool(ta), .m = m, .n = n, .k = k, .a = da.data(),
                                                         .b = db.data(), .d = dd.data(), .beta = beta};
      tessera::cuda::matmul(p);  // timed, then run
      std::vector<double> ref, mag;
      ref_product(ta, false, m, n, k, a, b, ref, mag);
      auto got = to_host(dd);
      double worst = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::abs(got[i] - (ref[i] + beta * c0[i])) / (mag[i] + std::abs(c0[i]) + 1e-30));
      BOOST_TEST_CONTEXT("trans_a " << ta << " beta " << beta) { BOOST_TEST(worst <= 1e-5); }
      tessera::cuda::matmul(p);  // the kept kernel, untimed: a second accumulation adds the product once more
      got = to_host(dd);
      worst = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::abs(got[i] - ((1 + beta) * ref[i] + beta * c0[i])) /
                                    ((1 + beta) * mag[i] + std::abs(c0[i]) + 1e-30));
      BOOST_TEST_CONTEXT("second run, trans_a " << ta << " beta " << beta) { BOOST_TEST(worst <= 1e-5); }
    }
  const auto r = tessera::cuda::matmul_tuning_result();
  tessera::cuda::set_matmul_tuning(1);
  // cuBLASLt offers several kernels at these shapes on Hopper: some problems were timed, at most the 4 here.
  BOOST_TEST(r.timed > before);
  BOOST_TEST(r.timed <= before + 4);
  BOOST_TEST(r.kept_ms <= r.first_ms);
}

BOOST_AUTO_TEST_CASE(empty_sum_writes_beta_times_d) {
  std::vector<float> c0(6, 2.5f);
  auto dd = to_device(c0);
  dbuf<bf16> none(1);
  tessera::cuda::matmul(tessera::cuda::matmul_problem<bf16, float>{.m = 2, .n = 3, .k = 0, .a = none.data(),
                                                                   .b = none.data(), .d = dd.data(), .beta = 1});
  BOOST_TEST(to_host(dd) == c0);
  tessera::cuda::matmul(tessera::cuda::matmul_problem<bf16, float>{.m = 2, .n = 3, .k = 0, .a = none.data(),
                                                                   .b = none.data(), .d = dd.data(), .beta = 0});
  BOOST_TEST(to_host(dd) == std::vector<float>(6, 0.0f));
}

// The trainer's forward: A = gelu(X W^T + b), aux = X W^T + b; then Y = C + A V^T + c (separate C).
BOOST_AUTO_TEST_CASE(gelu_and_bias_epilogues_match_float64) {
  std::mt19937 g(12);
  const int T = 45, d = 32, h = 64;
  const auto x = random_vec<bf16>(std::size_t(T) * d, g), w = random_vec<bf16>(std::size_t(h) * d, g, 0.2);
  const auto b = random_vec<bf16>(std::size_t(h), g), v = random_vec<bf16>(std::size_t(d) * h, g, 0.2);
  const auto c = random_vec<bf16>(std::size_t(d), g), res = random_vec<bf16>(std::size_t(T) * d, g);
  auto dx = to_device(x), dw = to_device(w), dbias = to_device(b), dv = to_device(v), dc = to_device(c), dres = to_device(res);
  dbuf<bf16> act(std::size_t(T) * h), pre(std::size_t(T) * h), y(std::size_t(T) * d);
  const tessera::cuda::matmul_problem<bf16, bf16> p1{.trans_b = true, .m = T, .n = h, .k = d, .a = dx.data(), .b = dw.data(),
                                                     .d = act.data(), .ep = epilogue::gelu_aux_bias, .bias = dbias.data(),
                                                     .aux = pre.data()};
  BOOST_REQUIRE(tessera::cuda::matmul_supported(p1));
  tessera::cuda::matmul(p1);
  tessera::cuda::matmul(tessera::cuda::matmul_problem<bf16, bf16>{.trans_b = true, .m = T, .n = d, .k = h, .a = act.data(),
                                                                  .b = dv.data(), .d = y.data(), .beta = 1,
                                                                  .ep = epilogue::bias, .bias = dc.data(), .c = dres.data()});
  std::vector<double> ref, mag;
  ref_product(false, true, T, h, d, x, w, ref, mag);
  const auto got_pre = to_host(pre), got_act = to_host(act);
  double worst_pre = 0, worst_act = 0;
  std::vector<bf16> act_ref(got_act.size());
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double z = ref[i] + convert<double>(b[i % std::size_t(h)]);
    const double scale = mag[i] + std::abs(convert<double>(b[i % std::size_t(h)])) + 1e-3;
    worst_pre = std::max(worst_pre, std::abs(convert<double>(got_pre[i]) - z) / scale);
    worst_act = std::max(worst_act, std::abs(convert<double>(got_act[i]) - gelu64(z)) / scale);
  }
  BOOST_TEST(worst_pre <= bf16_eps);
  BOOST_TEST(worst_act <= bf16_eps);
  // Second product from the GPU's own activations, so only its rounding is under test.
  ref_product(false, true, T, d, h, got_act, v, ref, mag);
  const auto got_y = to_host(y);
  double worst_y = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double r0 = convert<double>(res[i]), cb = convert<double>(c[i % std::size_t(d)]);
    worst_y = std::max(worst_y, std::abs(convert<double>(got_y[i]) - (r0 + ref[i] + cb)) /
                                    (mag[i] + std::abs(r0) + std::abs(cb) + 1e-3));
  }
  BOOST_TEST(worst_y <= bf16_eps);
}

// The trainer's backward through GELU: dH = (dY V) * gelu'(pre), db = column sums of dH.
BOOST_AUTO_TEST_CASE(gelu_gradient_and_bias_gradient_epilogue_match_float64) {
  std::mt19937 g(13);
  const int T = 45, d = 32, h = 64;
  const auto dy = random_vec<bf16>(std::size_t(T) * d, g), v = random_vec<bf16>(std::size_t(d) * h, g, 0.2);
  const auto pre = random_vec<bf16>(std::size_t(T) * h, g);
  auto ddy = to_device(dy), dv = to_device(v), dpre = to_device(pre);
  dbuf<bf16> dh{std::size_t(T) * h}, bgrad{std::size_t(h)};
  const tessera::cuda::matmul_problem<bf16, bf16> p{.m = T, .n = h, .k = d, .a = ddy.data(), .b = dv.data(), .d = dh.data(),
                                                    .ep = epilogue::dgelu_bgrad, .bias_grad = bgrad.data(), .aux = dpre.data()};
  BOOST_REQUIRE(tessera::cuda::matmul_supported(p));
  tessera::cuda::matmul(p);
  std::vector<double> ref, mag;
  ref_product(false, false, T, h, d, dy, v, ref, mag);
  const auto got = to_host(dh), got_b = to_host(bgrad);
  std::vector<double> colsum(std::size_t(h), 0.0), colmag(std::size_t(h), 0.0);
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double gg = gelu_grad64(convert<double>(pre[i]));
    const double want = ref[i] * gg;
    worst = std::max(worst, std::abs(convert<double>(got[i]) - want) / (mag[i] * std::abs(gg) + 1e-3));
    colsum[i % std::size_t(h)] += want;
    colmag[i % std::size_t(h)] += mag[i] * std::abs(gg);
  }
  BOOST_TEST(worst <= bf16_eps);
  double worst_b = 0;
  for (std::size_t c = 0; c < std::size_t(h); ++c)
    worst_b = std::max(worst_b, std::abs(convert<double>(got_b[c]) - colsum[c]) / (colmag[c] + 1e-3));
  BOOST_TEST(worst_b <= bf16_eps);
}

// add_bias, bf16 and fp32: the 16-byte path (columns a multiple of the vector,
// aligned) and the element-wise one (odd widths, an offset row pointer) give
// the host's arithmetic exactly: each element is one sum rounded once.
BOOST_AUTO_TEST_CASE(add_bias_vector_and_element_paths_match_host) {
  std::mt19937 g(21);
  auto check = [&](auto zero, int n, int cols, std::size_t offset) {
    using T = decltype(zero);
    const auto y0 = random_vec<T>(std::size_t(n) * cols + offset, g), b = random_vec<T>(std::size_t(cols), g);
    auto dy = to_device(y0), db = to_device(b);
    mlp_lm::gpu::add_bias(dy.data() + offset, db.data(), std::size_t(n), cols);
    const auto got = to_host(dy);
    long wrong = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const T want = i < offset ? y0[i]
                                : convert<T>(convert<float>(y0[i]) + convert<float>(b[(i - offset) % std::size_t(cols)]));
      wrong += convert<float>(got[i]) != convert<float>(want);
    }
    BOOST_TEST(wrong == 0, "add_bias " << sizeof(T) * 8 << "-bit, " << n << " x " << cols << " at offset " << offset
                                        << ": " << wrong << " elements differ");
  };
  for (int cols : {8, 40, 1024, 37}) {
    check(bf16{}, 77, cols, 0);
    check(bf16{}, 77, cols, 1);  // misaligned: the element-wise path
    check(0.0f, 77, cols, 0);
  }
  check(bf16{}, 4096, 256, 0);  // the head's shape: many rows, few columns
}

// fp32 runs these as separate kernels; they must match float64 to fp32 rounding.
BOOST_AUTO_TEST_CASE(separate_epilogue_kernels_match_float64) {
  std::mt19937 g(14);
  const int n = 77, cols = 40;
  const auto h0 = random_vec<float>(std::size_t(n) * cols, g), b = random_vec<float>(std::size_t(cols), g);
  const auto da0 = random_vec<float>(std::size_t(n) * cols, g);
  auto dh = to_device(h0), dbias = to_device(b), dda = to_device(da0);
  dbuf<float> act(h0.size());
  mlp_lm::gpu::bias_gelu(dh.data(), dbias.data(), act.data(), std::size_t(n), cols);
  mlp_lm::gpu::gelu_backward(dda.data(), dh.data(), dda.data(), h0.size());
  auto y = to_device(h0);
  mlp_lm::gpu::add_bias(y.data(), dbias.data(), std::size_t(n), cols);
  dbuf<float> again(h0.size());  // the recomputation backward does from the kept GELU input
  mlp_lm::gpu::gelu(dh.data(), again.data(), h0.size());
  const auto gh = to_host(dh), ga = to_host(act), gda = to_host(dda), gy = to_host(y), gr = to_host(again);
  double worst = 0;
  for (std::size_t i = 0; i < h0.size(); ++i) {
    const double z = double(h0[i]) + double(b[i % std::size_t(cols)]);
    worst = std::max({worst, std::abs(gh[i] - z) / (std::abs(z) + 1), std::abs(gy[i] - z) / (std::abs(z) + 1),
                      std::abs(ga[i] - gelu64(z)) / (std::abs(z) + 1), std::abs(gr[i] - gelu64(z)) / (std::abs(z) + 1),
                      std::abs(gda[i] - double(da0[i]) * gelu_grad64(z)) / (std::abs(double(da0[i])) + 1)});
  }
  BOOST_TEST(worst <= 1e-6);
}

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_matches_float64) {
  std::mt19937 g(15);
  for (int n : {1, 9, 1000}) {
    const auto z = random_vec<bf16>(std::size_t(n) * 256, g, 3.0);
    std::vector<std::uint8_t> t(static_cast<std::size_t>(n));
    for (auto& x : t) x = std::uint8_t(g() % 256);
    auto dz = to_device(z);
    auto dt = to_device(t);
    dbuf<unsigned long long> loss{1};  // fixed point, units of 2^-32 nats
    ops::fill(loss.span(), 0ull);
    const float scale = 1.0f / 3;
    mlp_lm::gpu::softmax_xent<mlp_lm::gpu::vocab>(dz.data(), dt.data(), n, scale, loss.data());
    const auto got = to_host(dz);
    double want_loss = 0, worst = 0;
    for (int j = 0; j < n; ++j) {
      double mx = -1e30, s = 0;
      for (int c = 0; c < 256; ++c) mx = std::max(mx, convert<double>(z[std::size_t(j) * 256 + std::size_t(c)]));
      for (int c = 0; c < 256; ++c) s += std::exp(convert<double>(z[std::size_t(j) * 256 + std::size_t(c)]) - mx);
      want_loss += std::log(s) + mx - convert<double>(z[std::size_t(j) * 256 + t[std::size_t(j)]]);
      for (int c = 0; c < 256; ++c) {
        const double p = std::exp(convert<double>(z[std::size_t(j) * 256 + std::size_t(c)]) - mx) / s;
        const double want = (p - (c == t[std::size_t(j)] ? 1.0 : 0.0)) * scale;
        worst = std::max(worst, std::abs(convert<double>(got[std::size_t(j) * 256 + std::size_t(c)]) - want) / scale);
      }
    }
    BOOST_TEST_CONTEXT("tokens " << n) {
      BOOST_TEST(worst <= bf16_eps);  // dZ is stored in bf16
      const double got_loss = double(static_cast<long long>(to_host(loss)[0])) / mlp_lm::gpu::loss_unit;
      BOOST_TEST(std::abs(got_loss - want_loss) <= 1e-5 * want_loss);
    }
  }
}

BOOST_AUTO_TEST_CASE(embedding_gather_and_gradient_match_float64) {
  std::mt19937 g(16);
  for (int e : {8, 13}) {  // 16-byte rows and odd rows
    const int n = 301, ctx = 5, d = ctx * e;
    const auto table = random_vec<bf16>(std::size_t(256) * e, g);
    std::vector<std::uint8_t> bytes(std::size_t(n) * ctx);
    for (auto& b : bytes) b = std::uint8_t(g() % 7 == 0 ? 32 : g() % 256);  // one frequent byte
    auto dtab = to_device(table);
    auto dbytes = to_device(bytes);
    dbuf<bf16> x(std::size_t(n) * d);
    mlp_lm::gpu::embed_forward(dtab.data(), dbytes.data(), n, ctx, e, x.data());
    const auto gx = to_host(x);
    bool same = true;
    for (std::size_t r = 0; r < bytes.size(); ++r)
      for (int c = 0; c < e; ++c)
        same = same && gx[r * std::size_t(e) + std::size_t(c)].bits == table[std::size_t(bytes[r]) * std::size_t(e) + std::size_t(c)].bits;
    BOOST_TEST(same);
    // Gradient: rows grouped by byte, as the trainer stages them.
    const auto dx = random_vec<bf16>(std::size_t(n) * d, g);
    std::vector<int> starts(257, 0), order(bytes.size());
    for (auto b : bytes) starts[std::size_t(b) + 1]++;
    for (int v = 0; v < 256; ++v) starts[std::size_t(v) + 1] += starts[std::size_t(v)];
    std::vector<int> pos(starts.begin(), starts.end() - 1);
    for (std::size_t r = 0; r < bytes.size(); ++r) order[std::size_t(pos[bytes[r]]++)] = int(r);
    auto ddx = to_device(dx);
    auto dorder = to_device(order), dstarts = to_device(starts);
    const auto before = random_vec<float>(std::size_t(256) * e, g);
    auto gE = to_device(before);
    mlp_lm::gpu::embed_backward(ddx.data(), dorder.data(), dstarts.data(), e, gE.data(), false);
    const auto acc = to_host(gE);
    mlp_lm::gpu::embed_backward(ddx.data(), dorder.data(), dstarts.data(), e, gE.data(), true);
    const auto fresh = to_host(gE);
    std::vector<double> want(before.size(), 0.0);
    for (std::size_t r = 0; r < bytes.size(); ++r)
      for (int c = 0; c < e; ++c)
        want[std::size_t(bytes[r]) * std::size_t(e) + std::size_t(c)] += convert<double>(dx[r * std::size_t(e) + std::size_t(c)]);
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      worst = std::max({worst, std::abs(fresh[i] - want[i]), std::abs(acc[i] - (want[i] + before[i]))});
    BOOST_TEST_CONTEXT("e " << e) { BOOST_TEST(worst <= 1e-4); }
  }
}

BOOST_AUTO_TEST_CASE(column_sums_match_float64) {
  std::mt19937 g(17);
  dbuf<float> scratch(mlp_lm::gpu::column_scratch_floats(2048));
  for (int n : {0, 1, 63, 1000, 4096, 70001})
    for (int cols : {1, 33, 256, 2048}) {
      if (std::size_t(n) * std::size_t(cols) > (std::size_t(1) << 27)) continue;
      const auto y = random_vec<bf16>(std::size_t(n) * std::size_t(cols) + 1, g);
      const auto before = random_vec<float>(std::size_t(cols), g);
      auto dy = to_device(y);
      auto out = to_device(before);
      mlp_lm::gpu::column_sums(dy.data(), n, cols, out.data(), false, scratch.span());
      const auto got = to_host(out);
      double worst = 0;
      for (int c = 0; c < cols; ++c) {
        double s = before[std::size_t(c)], mag = std::abs(before[std::size_t(c)]);
        for (int r = 0; r < n; ++r) {
          s += convert<double>(y[std::size_t(r) * std::size_t(cols) + std::size_t(c)]);
          mag += std::abs(convert<double>(y[std::size_t(r) * std::size_t(cols) + std::size_t(c)]));
        }
        worst = std::max(worst, std::abs(got[std::size_t(c)] - s) / (mag + 1e-30));
      }
      BOOST_TEST_CONTEXT("n " << n << " cols " << cols) { BOOST_TEST(worst <= 1e-6); }
    }
}

// The 16-byte path (aligned rows, columns a multiple of the vector) sums each
// column exactly as the element-wise one does: the same values at an aligned
// and at a misaligned address give the same bits, bf16 and fp32.
BOOST_AUTO_TEST_CASE(column_sums_vector_path_equals_element_path) {
  std::mt19937 g(23);
  dbuf<float> scratch(mlp_lm::gpu::column_scratch_floats(4096));
  auto check = [&](auto zero, int n, int cols) {
    using T = decltype(zero);
    const auto y = random_vec<T>(std::size_t(n) * std::size_t(cols), g);
    std::vector<T> shifted(y.size() + 1);
    std::copy(y.begin(), y.end(), shifted.begin() + 1);
    auto aligned = to_device(y), misaligned = to_device(shifted);
    dbuf<float> a{std::size_t(cols)}, b{std::size_t(cols)};
    mlp_lm::gpu::column_sums(aligned.data(), n, cols, a.data(), true, scratch.span());
    mlp_lm::gpu::column_sums(misaligned.data() + 1, n, cols, b.data(), true, scratch.span());
    const auto ga = to_host(a), gb = to_host(b);
    long differ = 0;
    for (int c = 0; c < cols; ++c) differ += std::memcmp(&ga[std::size_t(c)], &gb[std::size_t(c)], sizeof(float)) != 0;
    BOOST_TEST(differ == 0, sizeof(T) * 8 << "-bit " << n << " x " << cols << ": " << differ << " columns differ");
  };
  for (int n : {1, 63, 1000, 4096})
    for (int cols : {8, 256, 1024, 4096}) {
      check(bf16{}, n, cols);
      check(0.0f, n, cols);
    }
}

// 4096 rows of 2048 columns take 32 slices (65536 floats): a scratch sized for
// fewer columns is refused instead of written past (the trainer once sized it
// by max(d, vocab), too small for the hidden layer's bias gradient at d = 512).
BOOST_AUTO_TEST_CASE(column_sums_refuse_a_small_scratch) {
  dbuf<bf16> y(std::size_t(4096) * 2048);
  dbuf<float> out(2048), small(mlp_lm::gpu::column_scratch_floats(512));
  tessera_test::expect_error([&] { mlp_lm::gpu::column_sums(y.data(), 4096, 2048, out.data(), true, small.span()); }, "floats of scratch");
}

// The recomputation in backward: 16-byte vectors where pointers and length
// allow, element by element otherwise; both against float64.
BOOST_AUTO_TEST_CASE(gelu_recomputation_matches_float64_vectorised_or_not) {
  std::mt19937 g(19);
  for (std::size_t n : {std::size_t(8) * 1000, std::size_t(8) * 1000 + 3}) {
    const auto h = random_vec<bf16>(n + 1, g);
    auto dh = to_device(h);
    dbuf<bf16> a(n + 1);
    for (std::size_t off : {std::size_t(0), std::size_t(1)}) {  // 1: misaligned, so the scalar form runs
      mlp_lm::gpu::gelu(dh.data() + off, a.data() + off, n);
      const auto got = to_host(a);
      double worst = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double x = convert<double>(h[off + i]);
        worst = std::max(worst, std::abs(convert<double>(got[off + i]) - gelu64(x)) / (std::abs(gelu64(x)) + 1e-2));
      }
      BOOST_TEST_CONTEXT("n " << n << " offset " << off) { BOOST_TEST(worst <= 1e-2); }
    }
  }
}

// A weight-gradient product dW = dY^T X that also yields db[i] = sum_t dY[t, i] (fp32).
BOOST_AUTO_TEST_CASE(bias_gradient_of_a_weight_gradient_product_matches_float64) {
  std::mt19937 g(18);
  const int T = 200, m = 48, n = 40;  // dY [T, m], X [T, n]
  const auto dy = random_vec<bf16>(std::size_t(T) * m, g), x = random_vec<bf16>(std::size_t(T) * n, g);
  auto ddy = to_device(dy), dx = to_device(x);
  dbuf<float> dw{std::size_t(m) * n}, db{std::size_t(m)};
  const tessera::cuda::matmul_problem<bf16, float> p{.trans_a = true, .m = m, .n = n, .k = T, .a = ddy.data(),
                                                     .b = dx.data(), .d = dw.data(), .ep = epilogue::bgrad_a,
                                                     .bias_grad = db.data()};
  if (!tessera::cuda::matmul_supported(p)) {
    BOOST_TEST_MESSAGE("cuBLASLt has no bias-gradient epilogue for this product; the trainer uses column sums");
    return;
  }
  tessera::cuda::matmul(p);
  std::vector<double> ref, mag;
  ref_product(true, false, m, n, T, dy, x, ref, mag);
  const auto gw = to_host(dw), gb = to_host(db);
  double worst = 0, worst_b = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(gw[i] - ref[i]) / (mag[i] + 1e-30));
  for (int i = 0; i < m; ++i) {
    double s = 0, a = 0;
    for (int t = 0; t < T; ++t) {
      s += convert<double>(dy[std::size_t(t) * m + std::size_t(i)]);
      a += std::abs(convert<double>(dy[std::size_t(t) * m + std::size_t(i)]));
    }
    worst_b = std::max(worst_b, std::abs(gb[std::size_t(i)] - s) / a);
  }
  BOOST_TEST(worst <= 1e-5);
  BOOST_TEST(worst_b <= 1e-5);
}

// The GELU gradient without the bias gradient, and the one-hot embedding gradient.
BOOST_AUTO_TEST_CASE(gelu_gradient_epilogue_and_one_hot_embedding_gradient) {
  std::mt19937 g(19);
  const int T = 45, d = 32, h = 64;
  const auto dy = random_vec<bf16>(std::size_t(T) * d, g), v = random_vec<bf16>(std::size_t(d) * h, g, 0.2);
  const auto pre = random_vec<bf16>(std::size_t(T) * h, g);
  auto ddy = to_device(dy), dv = to_device(v), dpre = to_device(pre);
  dbuf<bf16> dh{std::size_t(T) * h};
  tessera::cuda::matmul(tessera::cuda::matmul_problem<bf16, bf16>{.m = T, .n = h, .k = d, .a = ddy.data(), .b = dv.data(),
                                                                  .d = dh.data(), .ep = epilogue::dgelu, .aux = dpre.data()});
  std::vector<double> ref, mag;
  ref_product(false, false, T, h, d, dy, v, ref, mag);
  const auto got = to_host(dh);
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double gg = gelu_grad64(convert<double>(pre[i]));
    worst = std::max(worst, std::abs(convert<double>(got[i]) - ref[i] * gg) / (mag[i] * std::abs(gg) + 1e-3));
  }
  BOOST_TEST(worst <= bf16_eps);

  const int rows = 777, e = 24;
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(rows));
  for (auto& b : bytes) b = std::uint8_t(g() % 3 == 0 ? 32 : g() % 256);
  const auto dx = random_vec<bf16>(std::size_t(rows) * e, g);
  auto dbytes = to_device(bytes);
  auto ddx = to_device(dx);
  dbuf<bf16> s{std::size_t(rows) * 256};
  dbuf<float> ge{std::size_t(256) * e};
  mlp_lm::gpu::one_hot(dbytes.data(), std::size_t(rows), s.data());
  tessera::cuda::matmul(tessera::cuda::matmul_problem<bf16, float>{.trans_a = true, .m = 256, .n = e, .k = rows,
                                                                   .a = s.data(), .b = ddx.data(), .d = ge.data()});
  std::vector<double> want(std::size_t(256) * e, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < e; ++c) want[std::size_t(bytes[std::size_t(r)]) * e + std::size_t(c)] += convert<double>(dx[std::size_t(r) * e + std::size_t(c)]);
  const auto gotE = to_host(ge);
  double worstE = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worstE = std::max(worstE, std::abs(gotE[i] - want[i]));
  BOOST_TEST(worstE <= 1e-4);
}
