// The language models' GPU kernels (the kit's, and GPT-2's LayerNorm) against
// float64 on fresh random data: causal attention forward and backward (the
// exact fp32 kernels with grouped kv heads, the bf16 flash kernels, cuDNN's
// fused SDPA; sequences that are not a multiple of the 64-row tile, one head
// and many), LayerNorm forward and backward, the classifier's cross-entropy
// and its gradient, GELU, and the embeddings' backward with repeated tokens;
// and the --deterministic forms of each sum (fixed-order column sums and
// embedding rows, attention without atomics): the same reference, and the
// same bits run after run.
#define BOOST_TEST_MODULE tessera_gpt_kernels_cuda
#include "common/mpi_test_main.hpp"
#include "common/util.hpp"
#include "common/cuda_util.cuh"
#include "common/reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gpt/cuda_layernorm.cuh"
#include "trainer_kit/cudnn_attention.hpp"
#include "trainer_kit/embedding.cuh"
#include "trainer_kit/kernels/attention.cuh"
#include "trainer_kit/kernels/flash.cuh"
#include "tessera/tessera.hpp"

using namespace tessera;
template <class T> using dbuf = tessera::cuda::buffer<T>;

namespace {
using tessera_test::to_device;
using tessera_test::to_host;

std::vector<float> normal(std::size_t n, std::mt19937& g, double stdev, bool bf16_exact = false) {
  std::normal_distribution<double> d(0.0, stdev);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16_exact ? float(bf16(float(d(g)))) : float(d(g));
  return v;
}
void device_sync() { TESSERA_CUDA(cudaDeviceSynchronize()); }

// max |got - ref| / max |ref|: the error relative to the tensor's scale.
template <class T>
double rel_error(const std::vector<T>& got, const std::vector<double>& ref) {
  double err = 0, scale = 1e-30;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::abs(double(float(got[i])) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return err / scale;
}

// Causal attention in float64: y, lse and, given dy, dqkv. Layouts as the
// kernels': rows [q (H heads) | k (KV) | v (KV)], q head h reading kv head h / (H / KV).
struct attention_ref {
  std::vector<double> y, lse, dqkv;
  attention_ref(const std::vector<float>& qkv, const std::vector<float>& dy, int B, int T, int H, int KV, int hd) {
    const std::size_t d = std::size_t(H) * std::size_t(hd), row = std::size_t(H + 2 * KV) * std::size_t(hd);
    y.assign(std::size_t(B) * T * d, 0.0), lse.assign(std::size_t(B) * T * H, 0.0), dqkv.assign(std::size_t(B) * T * row, 0.0);
    const double scale = 1.0 / std::sqrt(double(hd));
    std::vector<double> p(static_cast<std::size_t>(T)), dp(static_cast<std::size_t>(T));
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < T; ++i) {
          const std::size_t kvh = std::size_t(h / (H / KV));
          auto at = [&](int t, int part) {
            const std::size_t first = part == 0 ? std::size_t(h) * hd
                                    : part == 1 ? d + kvh * hd
                                                : d + std::size_t(KV) * hd + kvh * hd;
            return (std::size_t(b) * T + std::size_t(t)) * row + first;
          };
          double mx = -1e300;
          for (int j = 0; j <= i; ++j) {
            double s = 0;
            for (int c = 0; c < hd; ++c) s += double(qkv[at(i, 0) + c]) * double(qkv[at(j, 1) + c]);
            p[std::size_t(j)] = s * scale;
            mx = std::max(mx, p[std::size_t(j)]);
          }
          double sum = 0;
          for (int j = 0; j <= i; ++j) sum += std::exp(p[std::size_t(j)] - mx);
          const double l = mx + std::log(sum);
          lse[(std::size_t(b) * T + std::size_t(i)) * H + std::size_t(h)] = l;
          const std::size_t yo = (std::size_t(b) * T + std::size_t(i)) * d + std::size_t(h) * hd;
          for (int j = 0; j <= i; ++j) {
            p[std::size_t(j)] = std::exp(p[std::size_t(j)] - l);
            for (int c = 0; c < hd; ++c) y[yo + c] += p[std::size_t(j)] * double(qkv[at(j, 2) + c]);
          }
          double D = 0;
          for (int j = 0; j <= i; ++j) {
            double s = 0;
            for (int c = 0; c < hd; ++c) s += double(dy[yo + c]) * double(qkv[at(j, 2) + c]);
            dp[std::size_t(j)] = s;
            D += p[std::size_t(j)] * s;
          }
          for (int j = 0; j <= i; ++j) {
            const double ds = p[std::size_t(j)] * (dp[std::size_t(j)] - D) * scale;
            for (int c = 0; c < hd; ++c) {
              dqkv[at(i, 0) + c] += ds * double(qkv[at(j, 1) + c]);
              dqkv[at(j, 1) + c] += ds * double(qkv[at(i, 0) + c]);
              dqkv[at(j, 2) + c] += p[std::size_t(j)] * double(dy[yo + c]);
            }
          }
        }
  }
};

struct attention_case {
  int B, T, H, KV;
};
// Sequences of 1, 63, 64, 65, 100 and 200 rows (tiles are 64), one head and
// several, and grouped kv heads (Llama's: 2 or 4 q heads reading each).
const attention_case cases[] = {{1, 1, 2, 2}, {1, 63, 1, 1}, {2, 64, 3, 3}, {1, 65, 2, 2}, {2, 100, 3, 3},
                                {1, 200, 2, 2}, {1, 63, 4, 2}, {2, 100, 4, 1}, {1, 65, 6, 3}};

// In: what the kernels read q, k, v and dy as (fp32, or bf16 as the bf16 trainer keeps them).
// deterministic: dq (flash) or dk and dv (exact) summed in a fixed order, no
// atomics; the backward then runs twice and must give the same bits.
template <class C, class In = float>
void check_attention(bool flash, double tol, bool deterministic = false) {
  std::mt19937 g(flash ? 41 : 42);
  constexpr int hd = 64;
  for (const auto& k : cases) {
    if (flash && k.KV != k.H) continue;  // the flash kernels run as many kv heads as heads
    const trainer_kit::kernels::attention_shape A{k.H, k.KV, hd};
    const std::size_t d = std::size_t(k.H) * hd, n = std::size_t(k.B) * std::size_t(k.T), row = std::size_t(A.row());
    // bf16-exact inputs for the flash kernels: what is left is the rounding of P and dS.
    const bool exact_in = flash || !std::is_same_v<In, float>;  // bf16-exact where anything reads bf16
    const auto qkv = normal(n * row, g, 1.5, exact_in), dy = normal(n * d, g, 1.0, exact_in);
    const attention_ref ref(qkv, dy, k.B, k.T, k.H, k.KV, hd);
    auto as_in = [](const std::vector<float>& v) {
      std::vector<In> r(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) r[i] = In(v[i]);
      return r;
    };
    auto dqkv_in = to_device(as_in(qkv));
    auto ddy = to_device(as_in(dy));
    dbuf<C> y(n * d);
    dbuf<float> lse(n * std::size_t(k.H)), D(n * std::size_t(k.H)), dqkv(n * row);
    if (flash) trainer_kit::flash::forward<C, In>(dqkv_in.data(), y.data(), lse.data(), k.B, k.T, k.H, nullptr);
    else trainer_kit::kernels::exact_attention(dqkv_in.data(), y.data(), lse.data(), k.B, k.T, A, nullptr);
    TESSERA_CUDA(cudaGetLastError());
    auto backward = [&] {
      TESSERA_CUDA(cudaMemset(dqkv.data(), 0, dqkv.size() * sizeof(float)));
      if (flash)
        trainer_kit::flash::backward<C, In>(ddy.data(), dqkv_in.data(), y.data(), lse.data(), D.data(), dqkv.data(), k.B,
                                            k.T, k.H, nullptr, deterministic);
      else
        trainer_kit::kernels::exact_attention_backward(ddy.data(), dqkv_in.data(), y.data(), lse.data(), dqkv.data(), k.B,
                                                       k.T, A, deterministic ? D.data() : nullptr, nullptr);
      TESSERA_CUDA(cudaGetLastError());
      device_sync();
      return to_host(dqkv);
    };
    const auto got = backward();
    const double ey = rel_error(to_host(y), ref.y), el = rel_error(to_host(lse), ref.lse), ed = rel_error(got, ref.dqkv);
    std::printf("attention %s%s%s B %d T %d H %d KV %d: y %.2e, lse %.2e, dqkv %.2e (relative to the largest value)\n",
                flash ? "flash bf16" : std::is_same_v<C, float> ? "exact fp32" : "exact bf16",
                std::is_same_v<In, float> ? "" : " (bf16 inputs)", deterministic ? ", fixed order" : "", k.B, k.T, k.H,
                k.KV, ey, el, ed);
    BOOST_TEST_CONTEXT("B " << k.B << " T " << k.T << " H " << k.H << " KV " << k.KV) {
      BOOST_TEST(ey <= tol);
      BOOST_TEST(el <= tol);
      BOOST_TEST(ed <= tol);
      if (deterministic) BOOST_TEST((backward() == got), "the fixed-order backward gives other bits on a second run");
    }
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(exact_attention_matches_float64) { check_attention<float>(false, 2e-6); }

BOOST_AUTO_TEST_CASE(flash_attention_matches_float64_within_bf16) {
  BOOST_REQUIRE(trainer_kit::flash::supported());
  // P and dS are rounded to bf16 (2^-9 relative) before their products.
  check_attention<bf16>(true, 1e-2);
}

BOOST_AUTO_TEST_CASE(exact_attention_in_a_fixed_order_matches_float64) {
  check_attention<float>(false, 2e-6, true);
  check_attention<bf16, bf16>(false, 1e-2, true);
}

BOOST_AUTO_TEST_CASE(flash_attention_in_a_fixed_order_matches_float64) {
  BOOST_REQUIRE(trainer_kit::flash::supported());
  check_attention<bf16, bf16>(true, 1e-2, true);
}

BOOST_AUTO_TEST_CASE(flash_attention_reads_bf16_inputs) {
  BOOST_REQUIRE(trainer_kit::flash::supported());
  // What the bf16 trainer runs: q, k, v and dy kept in bf16 (bf16-exact here, so the same tolerance).
  check_attention<bf16, bf16>(true, 1e-2);
}

// cuDNN's fused attention (the trainer's default where the build has cuDNN):
// bf16 in and out, softmax statistics (B, H, T) against the reference's lse.
BOOST_AUTO_TEST_CASE(cudnn_attention_matches_float64_within_bf16) {
  if (!trainer_kit::cudnn_attention::compiled()) {
    std::printf("attention cudnn: not in this build (%s)\n", trainer_kit::cudnn_attention::version().c_str());
    return;
  }
  std::mt19937 g(43);
  constexpr int hd = 64;
  std::printf("attention cudnn: %s\n", trainer_kit::cudnn_attention::version().c_str());
  for (const auto& k : cases) {
    const std::size_t d = std::size_t(k.H) * hd, n = std::size_t(k.B) * std::size_t(k.T),
                      row = std::size_t(k.H + 2 * k.KV) * hd;
    const auto qkv = normal(n * row, g, 1.5, true), dy = normal(n * d, g, 1.0, true);
    if (k.T == 1) {  // cuDNN refuses one-token sequences: a tessera: error, which the trainer's auto turns into flash
      BOOST_CHECK_EXCEPTION(trainer_kit::cudnn_attention(k.B, k.T, k.H, k.KV, hd), tessera::error, [](const tessera::error& e) {
        std::printf("attention cudnn B 1 T 1: refused (%s)\n", e.what());
        return std::string(e.what()).find("cuDNN attention") != std::string::npos;
      });
      continue;
    }
    const attention_ref ref(qkv, dy, k.B, k.T, k.H, k.KV, hd);
    auto as_bf16 = [](const std::vector<float>& v) { return std::vector<bf16>(v.begin(), v.end()); };
    auto dq = to_device(as_bf16(qkv));
    auto ddy = to_device(as_bf16(dy));
    dbuf<bf16> y(n * d), dqkv(n * row);
    dbuf<float> stats(n * std::size_t(k.H));
    const trainer_kit::cudnn_attention att(k.B, k.T, k.H, k.KV, hd);
    att.forward(dq.data(), y.data(), stats.data(), nullptr);
    att.backward(ddy.data(), dq.data(), y.data(), stats.data(), dqkv.data(), nullptr);
    device_sync();
    // cuDNN's statistics are (B, H, T); the reference's lse (B, T, H).
    const auto st = to_host(stats);
    std::vector<float> lse(st.size());
    for (int b = 0; b < k.B; ++b)
      for (int h = 0; h < k.H; ++h)
        for (int t = 0; t < k.T; ++t)
          lse[(std::size_t(b) * k.T + t) * k.H + h] = st[(std::size_t(b) * k.H + h) * k.T + t];
    const double ey = rel_error(to_host(y), ref.y), el = rel_error(lse, ref.lse), ed = rel_error(to_host(dqkv), ref.dqkv);
    std::printf("attention cudnn bf16 B %d T %d H %d KV %d: y %.2e, lse %.2e, dqkv %.2e (relative to the largest value)\n",
                k.B, k.T, k.H, k.KV, ey, el, ed);
    BOOST_TEST_CONTEXT("B " << k.B << " T " << k.T << " H " << k.H) {
      BOOST_TEST(ey <= 1e-2);
      BOOST_TEST(el <= 1e-2);
      BOOST_TEST(ed <= 1e-2);
    }
    // --deterministic: cuDNN's deterministic backward where it has one for the
    // shape (else the trainer runs flash's fixed-order form: said, not failed).
    try {
      const trainer_kit::cudnn_attention det(k.B, k.T, k.H, k.KV, hd, true);
      auto backward = [&] {
        det.backward(ddy.data(), dq.data(), y.data(), stats.data(), dqkv.data(), nullptr);
        device_sync();
        return to_host(dqkv);
      };
      const auto got = backward();
      const double e = rel_error(got, ref.dqkv);
      const bool same = backward() == got;
      std::printf("attention cudnn bf16 deterministic B %d T %d H %d: dqkv %.2e, %s bits on a second run\n", k.B, k.T,
                  k.H, e, same ? "the same" : "OTHER");
      BOOST_TEST(e <= 1e-2);
      BOOST_TEST(same);
    } catch (const tessera::error& e) {
      std::printf("attention cudnn bf16 deterministic B %d T %d H %d: refused (%s)\n", k.B, k.T, k.H, e.what());
    }
  }
}

BOOST_AUTO_TEST_CASE(exact_attention_reads_bf16_inputs) {
  // The bf16 trainer where flash does not apply (head dimension other than 64): y rounded to bf16.
  check_attention<bf16, bf16>(false, 1e-2);
}

// D 100 (a part of a warp), 700, 1600 (GPT-2's widest) and 2100: the
// forward's registers and the backward's columns kernel (a thread per 4
// columns, rows 2 at a time) on 2 blocks and on the grid it picks itself;
// 2102 (not a multiple of 4): one value a lane, every row adding into
// shared memory. Neither n nor D a multiple of a warp. The ordered form
// (--deterministic) where it applies (D a multiple of 4 up to 2048): the
// same reference, the same bits twice. The unordered forms also sum the new
// dx's columns (dsum: the bias gradient of the product below the norm).
BOOST_AUTO_TEST_CASE(layernorm_forward_and_backward_match_float64) {
  for (const int D : {100, 700, 1600, 2100, 2102}) {
    BOOST_TEST_CONTEXT("D " << D) {
      std::mt19937 g(43);
      const int n = 37;
      const auto x = normal(std::size_t(n) * D, g, 2.0), w = normal(std::size_t(D), g, 1.0), b = normal(std::size_t(D), g, 1.0);
      const auto dout = normal(std::size_t(n) * D, g, 1.0), dx0 = normal(std::size_t(n) * D, g, 1.0);
      auto dxx = to_device(x), dw = to_device(w), db = to_device(b), ddout = to_device(dout);
      dbuf<float> out(std::size_t(n) * D), mean(static_cast<std::size_t>(n)), rstd(static_cast<std::size_t>(n)), gw(static_cast<std::size_t>(D)), gb(static_cast<std::size_t>(D));
      // The registers' form up to 2048 columns; one value a lane at 2100 and 2102.
      gpt::kernels::layernorm<float>(dxx.data(), dw.data(), db.data(), out.data(), mean.data(), rstd.data(), n, D, nullptr);
      // Two blocks for 37 rows: each block sums several rows' dw, db before adding them;
      // dxc receives the new dx in the compute type as well.
      dbuf<float> dxc(std::size_t(n) * D), partial(gpt::workspace::layernorm_partial_floats(D));
      // dsum (the unordered forms): the new dx's column sums, added to what it holds (here ones).
      const std::vector<float> ones(static_cast<std::size_t>(D), 1.0f);
      auto dsum = to_device(ones);
      struct result {
        std::vector<float> dx, dxc, gw, gb, dsum;
        bool operator==(const result&) const = default;
      };
      auto backward = [&](bool ordered, int blocks = 2) {
        auto ddx = to_device(dx0);
        TESSERA_CUDA(cudaMemset(gw.data(), 0, gw.size() * sizeof(float)));
        TESSERA_CUDA(cudaMemset(gb.data(), 0, gb.size() * sizeof(float)));
        TESSERA_CUDA(cudaMemcpy(dsum.data(), ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice));
        gpt::kernels::layernorm_backward<float>(ddout.data(), dxx.data(), dw.data(), mean.data(), rstd.data(), ddx.data(),
                                                dxc.data(), gw.data(), gb.data(), n, D, nullptr, blocks,
                                                ordered ? partial.data() : nullptr, ordered ? nullptr : dsum.data());
        TESSERA_CUDA(cudaGetLastError());
        device_sync();
        return result{to_host(ddx), to_host(dxc), to_host(gw), to_host(gb), to_host(dsum)};
      };
      std::vector<double> y(x.size()), dx(x.size()), rgw(std::size_t(D), 0.0), rgb(std::size_t(D), 0.0),
          rsum(std::size_t(D), 1.0);
      for (int r = 0; r < n; ++r) {
        const float* xr = x.data() + std::size_t(r) * D;
        double mu = 0, var = 0;
        for (int c = 0; c < D; ++c) mu += xr[c];
        mu /= D;
        for (int c = 0; c < D; ++c) var += (xr[c] - mu) * (xr[c] - mu);
        const double rs = 1.0 / std::sqrt(var / D + 1e-5);
        double m1 = 0, m2 = 0;
        for (int c = 0; c < D; ++c) {
          const double xh = (xr[c] - mu) * rs, g_ = dout[std::size_t(r) * D + c];
          y[std::size_t(r) * D + c] = xh * w[std::size_t(c)] + b[std::size_t(c)];
          m1 += g_ * w[std::size_t(c)] / D, m2 += g_ * w[std::size_t(c)] * xh / D;
          rgw[std::size_t(c)] += g_ * xh, rgb[std::size_t(c)] += g_;
        }
        for (int c = 0; c < D; ++c) {
          const double xh = (xr[c] - mu) * rs;
          dx[std::size_t(r) * D + c] = dx0[std::size_t(r) * D + c] + rs * (dout[std::size_t(r) * D + c] * w[std::size_t(c)] - m1 - xh * m2);
          rsum[std::size_t(c)] += dx[std::size_t(r) * D + c];
        }
      }
      BOOST_TEST(rel_error(to_host(out), y) <= 1e-6);
      for (const auto& [ordered, blocks] : {std::pair{false, 2}, std::pair{false, 0}, std::pair{true, 2}}) {
        if (ordered && !gpt::workspace::layernorm_ordered_fits(D)) continue;
        BOOST_TEST_CONTEXT((ordered ? "ordered" : "atomics") << ", blocks " << blocks) {
          const result got = backward(ordered, blocks);
          BOOST_TEST(rel_error(got.dx, dx) <= 1e-5);
          BOOST_TEST(rel_error(got.dxc, dx) <= 1e-5);
          BOOST_TEST(rel_error(got.gw, rgw) <= 1e-5);
          BOOST_TEST(rel_error(got.gb, rgb) <= 1e-5);
          if (!ordered) BOOST_TEST(rel_error(got.dsum, rsum) <= 1e-5);
          // dsum with the ordered form is refused before anything runs (its sums would be in no fixed order).
          if (ordered)
            BOOST_CHECK_THROW(gpt::kernels::layernorm_backward<float>(ddout.data(), dxx.data(), dw.data(), mean.data(),
                                                                      rstd.data(), dxc.data(), nullptr, gw.data(),
                                                                      gb.data(), n, D, nullptr, 2, partial.data(),
                                                                      dsum.data()),
                              tessera::error);
          if (ordered) BOOST_TEST((backward(true) == got), "the ordered LayerNorm backward gives other bits on a second run");
        }
      }
    }
  }
}

// The bias gradients' column sums (the products' separate forms; the kit's):
// atomics per block of 256 rows, and in a fixed order (partial sums over
// slices of rows, added in slice order) with the same bits twice; the loss
// per row summed by one block.
BOOST_AUTO_TEST_CASE(column_sums_and_loss_in_a_fixed_order) {
  std::mt19937 g(47);
  for (const auto& [n, cols] : {std::pair{1000, 300}, std::pair{257, 2304}, std::pair{1, 5}}) {
    BOOST_TEST_CONTEXT("n " << n << " cols " << cols) {
      const auto y = normal(std::size_t(n) * std::size_t(cols), g, 1.0), start = normal(std::size_t(cols), g, 1.0);
      auto dy = to_device(y);
      dbuf<float> partial(gpt::kernels::column_scratch_floats(cols));
      std::vector<double> ref(start.begin(), start.end());
      for (int r = 0; r < n; ++r)
        for (int c = 0; c < cols; ++c) ref[std::size_t(c)] += y[std::size_t(r) * cols + c];
      auto sum = [&](bool ordered) {
        auto out = to_device(start);
        if (ordered) gpt::kernels::column_sums(dy.data(), n, cols, out.data(), false, partial.span(), nullptr);
        else gpt::kernels::column_add_atomic(dy.data(), n, cols, out.data(), nullptr);
        device_sync();
        return to_host(out);
      };
      BOOST_TEST(rel_error(sum(false), ref) <= 1e-5);
      const auto ordered = sum(true);
      BOOST_TEST(rel_error(ordered, ref) <= 1e-5);
      BOOST_TEST((sum(true) == ordered));
    }
  }
  for (const std::size_t n : {std::size_t(1), std::size_t(1023), std::size_t(32768)}) {
    std::vector<double> v(n);
    std::normal_distribution<double> d(3.0, 1.0);
    double ref = 0.25;
    for (auto& e : v) e = d(g), ref += e;
    auto dv = to_device(v);
    auto run = [&] {
      auto out = to_device(std::vector<double>{0.25});
      gpt::kernels::ordered_sum(dv.data(), n, out.data(), nullptr);
      device_sync();
      return to_host(out)[0];
    };
    const double got = run();
    BOOST_TEST(std::abs(got - ref) <= 1e-12 * std::abs(ref), "ordered_sum of " << n << ": " << got << " against " << ref);
    BOOST_TEST(run() == got);
  }
}

namespace {
// C: the logits' type (fp32, or bf16 as the bf16 classifier writes them; bf16-exact values then).
// Rows ld apart over a real vocabulary of V (not a multiple of the block): the
// padding holds large logits that must not count, and its gradient, written
// over the logits, must come out zero (the padded rows of the tied table learn
// nothing). cache: the kernel may keep a row in shared memory (else it reads
// the row twice).
template <class C>
void check_cross_entropy(double tol, int rows = 13, int V = 1000, int ld = 1024, bool cache = true) {
  std::mt19937 g(44);
  auto z = normal(std::size_t(rows) * ld, g, 3.0, !std::is_same_v<C, float>);
  for (int r = 0; r < rows; ++r)
    for (int c = V; c < ld; ++c) z[std::size_t(r) * ld + std::size_t(c)] = 50.0f;
  std::vector<std::uint16_t> target(static_cast<std::size_t>(rows));
  for (auto& t : target) t = std::uint16_t(g() % unsigned(V));
  std::vector<C> zc(z.size());
  for (std::size_t i = 0; i < z.size(); ++i) zc[i] = C(z[i]);
  auto dz = to_device(zc);  // the logits, then (in place) their gradient
  auto dt = to_device(target);
  dbuf<double> loss(1);
  TESSERA_CUDA(cudaMemset(loss.data(), 0, sizeof(double)));
  const float scale = 0.37f;
  gpt::kernels::cross_entropy<C>(dz.data(), dt.data(), V, ld, scale, true, loss.data(), std::size_t(rows), nullptr,
                                 cache);
  TESSERA_CUDA(cudaGetLastError());
  device_sync();
  std::vector<double> ref_dz(z.size(), 0.0);
  double ref_loss = 0;
  for (int r = 0; r < rows; ++r) {
    const float* zr = z.data() + std::size_t(r) * ld;
    const double mx = *std::max_element(zr, zr + V);
    double sum = 0;
    for (int c = 0; c < V; ++c) sum += std::exp(zr[c] - mx);
    ref_loss += std::log(sum) + mx - zr[target[std::size_t(r)]];
    for (int c = 0; c < V; ++c)
      ref_dz[std::size_t(r) * ld + std::size_t(c)] =
          (std::exp(zr[c] - mx) / sum - (c == target[std::size_t(r)] ? 1.0 : 0.0)) * scale;
  }
  BOOST_TEST(std::abs(to_host(loss)[0] - ref_loss) <= 1e-5 * ref_loss);
  BOOST_TEST(rel_error(to_host(dz), ref_dz) <= tol);
  // --deterministic: each row's loss written apart, then summed in a fixed order.
  auto dz2 = to_device(zc);
  dbuf<double> rows_loss(static_cast<std::size_t>(rows)), loss2(1);
  TESSERA_CUDA(cudaMemset(loss2.data(), 0, sizeof(double)));
  gpt::kernels::cross_entropy<C>(dz2.data(), dt.data(), V, ld, scale, true, nullptr, std::size_t(rows), nullptr, cache,
                                 rows_loss.data());
  gpt::kernels::ordered_sum(rows_loss.data(), std::size_t(rows), loss2.data(), nullptr);
  device_sync();
  BOOST_TEST(std::abs(to_host(loss2)[0] - ref_loss) <= 1e-5 * ref_loss);
  BOOST_TEST((to_host(dz2) == to_host(dz)), "the gradient does not depend on where the loss goes");
}
}  // namespace

BOOST_AUTO_TEST_CASE(cross_entropy_and_gradient_match_float64) { check_cross_entropy<float>(1e-5); }

// The gradient rounded to bf16 (2^-9 relative); the loss is summed in fp32 from bf16-exact logits.
BOOST_AUTO_TEST_CASE(cross_entropy_of_bf16_logits_matches_float64) { check_cross_entropy<bf16>(8e-3); }

// GPT-2's padded vocabulary, a row in shared memory (bf16: 98 KiB) and read
// twice instead (fp32 at 65,536: more than an H200's 227 KiB of shared memory).
BOOST_AUTO_TEST_CASE(cross_entropy_of_gpt2_rows_cached_and_streamed) {
  check_cross_entropy<bf16>(8e-3, 5, 50257, 50304, true);
  check_cross_entropy<bf16>(8e-3, 5, 50257, 50304, false);
  check_cross_entropy<float>(1e-5, 3, 50257, 50304, true);
  check_cross_entropy<float>(1e-5, 3, 65000, 65536, true);
}

// The kit's GELU (the backward's recompute) against float64: bf16 in and out
// 8 at a time, a tail that is not a multiple of 8, a misaligned start (one at
// a time), and fp32.
template <class C>
void check_gelu(std::size_t total, std::size_t offset, double tol) {
  std::mt19937 g(46);
  const auto h = normal(total + offset, g, 2.0, !std::is_same_v<C, float>);
  std::vector<C> hc(h.begin(), h.end());
  auto dh = to_device(hc);
  dbuf<C> da(total + offset);
  gpt::kernels::gelu(dh.data() + offset, da.data() + offset, total, nullptr);
  device_sync();
  const auto a = to_host(da);
  std::vector<double> ref(total);
  std::vector<C> got(total);
  for (std::size_t i = 0; i < total; ++i) {
    const double x = h[offset + i];
    ref[i] = tessera_test::gelu64(x);
    got[i] = a[offset + i];
  }
  BOOST_TEST(rel_error(got, ref) <= tol);
}
BOOST_AUTO_TEST_CASE(gelu_matches_float64) {
  check_gelu<bf16>(1 << 20, 0, 4e-3);
  check_gelu<bf16>(1000003, 0, 4e-3);
  check_gelu<bf16>(4099, 1, 4e-3);
  check_gelu<float>(4099, 0, 1e-6);
}

BOOST_AUTO_TEST_CASE(embedding_backward_sums_repeated_tokens) {
  std::mt19937 g(45);
  const int seq = 16, D = 48, V = 7;  // 64 tokens over a vocabulary of 7: every id repeats
  const std::size_t n = 4 * seq;
  const auto dx = normal(n * D, g, 1.0);
  std::vector<std::uint16_t> tok(n);
  for (auto& t : tok) t = std::uint16_t(g() % unsigned(V));
  auto ddx = to_device(dx);
  auto dtok = to_device(tok);
  dbuf<float> gwte(std::size_t(V) * D), gwpe(std::size_t(seq) * D);
  TESSERA_CUDA(cudaMemset(gwte.data(), 0, gwte.size() * sizeof(float)));
  TESSERA_CUDA(cudaMemset(gwpe.data(), 0, gwpe.size() * sizeof(float)));
  trainer_kit::kernels::embed_backward(ddx.data(), dtok.data(), gwte.data(), gwpe.data(), n, seq, D, nullptr);
  device_sync();
  std::vector<double> rte(gwte.size(), 0.0), rpe(gwpe.size(), 0.0);
  for (std::size_t i = 0; i < n; ++i)
    for (int c = 0; c < D; ++c) {
      rte[std::size_t(tok[i]) * D + c] += dx[i * D + c];
      rpe[(i % seq) * D + c] += dx[i * D + c];
    }
  BOOST_TEST(rel_error(to_host(gwte), rte) <= 1e-6);
  BOOST_TEST(rel_error(to_host(gwpe), rpe) <= 1e-6);
  // --deterministic: positions in sequence order, tokens grouped on the host (a
  // vocabulary of 7 padded to 128, as the trainer pads it), the same bits twice.
  trainer_kit::token_groups<std::uint16_t> groups;
  groups.build(tok.data(), n, 128);
  BOOST_TEST(groups.groups <= V);
  // The same layout for any tokens of n rows (a step graph replays backward() on the next micro-batch's).
  BOOST_TEST(groups.ints.size() == n + 2 * std::min<std::size_t>(n, 128) + 1);
  auto dgroups = to_device(groups.ints);
  auto ordered = [&] {
    TESSERA_CUDA(cudaMemset(gwte.data(), 0, gwte.size() * sizeof(float)));
    TESSERA_CUDA(cudaMemset(gwpe.data(), 0, gwpe.size() * sizeof(float)));
    trainer_kit::kernels::position_backward_kernel<float><<<4, 256>>>(ddx.data(), gwpe.data(), int(n / seq), seq, D);
    groups.backward(ddx.data(), dgroups.data(), gwte.data(), D, nullptr);
    TESSERA_CUDA(cudaGetLastError());
    device_sync();
    return std::pair{to_host(gwte), to_host(gwpe)};
  };
  const auto got = ordered();
  BOOST_TEST(rel_error(got.first, rte) <= 1e-6);
  BOOST_TEST(rel_error(got.second, rpe) <= 1e-6);
  BOOST_TEST((ordered() == got));
}
