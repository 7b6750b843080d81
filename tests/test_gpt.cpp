// GPT-2's host net (examples/gpt): every parameter's gradient against central
// finite differences of the loss (the tied token table through both of its
// uses, attention, both LayerNorms, GELU, the positions), with and without
// per-block recompute; the data reader's errors; the initial weights'
// statistics; the nets' emulated fp8 products (trainer_kit/fp8_linears.hpp)
// against float64 of their codes, the delayed recipe's history and its refusals.
#define BOOST_TEST_MODULE tessera_gpt
#include "common/mpi_test_main.hpp"
#include "common/util.hpp"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "gpt/data.hpp"
#include "gpt/host_compute.hpp"
#include "gpt/model.hpp"
#include "tessera/tessera.hpp"

using namespace tessera;
using Cfg = config<no_shard, ddp, full_precision<float>, sum, backend::host>;
using W = data_parallel_t<Cfg>;

namespace {
std::vector<std::uint16_t> random_tokens(std::size_t n, int vocab, std::uint64_t seed) {
  std::vector<std::uint16_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = std::uint16_t(splitmix64(seed + i) % std::uint64_t(vocab));
  t[3] = t[5] = t[9];  // repeated tokens: the table's gradient rows add up
  return t;
}

void check_gradients(bool recompute) {
  comm::local<backend::host> solo;
  W m(solo);
  gpt::model_shape s{.layers = 2, .heads = 2, .d = 16, .seq = 7, .vocab = 50};  // seq not a power of two; vocab padded to 128
  const auto ids = gpt::register_model(m, s);
  m.finalize();
  gpt::init_model(m, ids, s, 5);
  // Larger weights than GPT-2's 0.02, so every path carries a gradient well above the differences' noise.
  for (std::size_t u = 0; u < m.num_units(); ++u)
    for (std::size_t t = 0; t < m.layout(unit_id{int(u)}).tensors().size(); ++t) {
      const param_id p{int(u), int(t)};
      const bool is_ln = m.slot(p).spec.name.starts_with("ln");
      m.init_param(p, init::normal{.seed = 11, .stdev = 0.3, .mean = is_ln ? 1.0 : 0.0});
    }
  // keep the padded rows of the table at zero (they never receive probability)
  {
    auto v = m.get_param(ids.wte);
    std::fill(v.begin() + std::ptrdiff_t(s.vocab) * s.d, v.end(), 0.0f);
    m.set_param(ids.wte, v);
  }
  const int batch = 2;
  const auto seqs = random_tokens(std::size_t(batch) * std::size_t(s.seq + 1), s.vocab, 99);
  gpt::host_gpt<W> net(m, ids, s, batch, gpt::net_options{.recompute = recompute});
  m.begin_micro_batch(0, 1);
  net.forward_backward(seqs.data(), batch, 1.0);  // the summed loss's gradient
  net.finish_loss();
  m.finish_grad_sync();
  // Every reduced gradient (one rank, no_shard: the whole tensor), through the shard view an optimizer reads.
  std::vector<std::vector<float>> grads;
  for (std::size_t u = 0; u < m.num_units(); ++u)
    for (std::size_t t = 0; t < m.layout(unit_id{int(u)}).tensors().size(); ++t) {
      const auto g = m.shards().local_grads(param_id{int(u), int(t)});
      grads.emplace_back(g.begin(), g.end());
    }
  const double loss0 = net.take_loss();
  const double loss_eval = gpt::host_gpt<W>(m, ids, s, batch).forward_loss(seqs.data(), batch);
  BOOST_TEST(std::abs(loss0 - loss_eval) <= 1e-6 * loss0);
  int checked = 0;
  std::size_t k = 0;
  for (std::size_t u = 0; u < m.num_units(); ++u)
    for (std::size_t t = 0; t < m.layout(unit_id{int(u)}).tensors().size(); ++t) {
      const param_id p{int(u), int(t)};
      const std::vector<float>& g = grads[k++];
      const std::string name = m.layout(unit_id{int(u)}).name() + "." + m.slot(p).spec.name;
      float gmax = 0;
      std::size_t imax = 0;
      for (std::size_t i = 0; i < g.size(); ++i)
        if (std::abs(g[i]) > gmax) gmax = std::abs(g[i]), imax = i;
      BOOST_TEST_CONTEXT(name << (recompute ? " (recompute)" : "")) {
        BOOST_TEST(gmax > 0.0f);  // every parameter is reached
        std::vector<std::size_t> at = {imax, std::size_t(splitmix64(t + 17 * u) % g.size()), g.size() / 2};
        if (p == ids.wte) at.push_back(std::size_t(seqs[3]) * std::size_t(s.d) + 1);  // an input row, used twice
        const auto base = m.get_param(p);
        for (std::size_t i : at) {
          const float eps = 1e-2f;
          auto v = base;
          v[i] = base[i] + eps;
          m.set_param(p, v);
          const double up = net.forward_loss(seqs.data(), batch);
          v[i] = base[i] - eps;
          m.set_param(p, v);
          const double down = net.forward_loss(seqs.data(), batch);
          const double fd = (up - down) / (2.0 * eps);
          BOOST_TEST_CONTEXT("element " << i << ": gradient " << g[i] << ", differences " << fd) {
            BOOST_TEST(std::abs(g[i] - fd) <= 0.02 * gmax + 2e-3);
          }
          ++checked;
        }
        m.set_param(p, base);
      }
    }
  BOOST_TEST(checked >= 3 * 28);
  // The padded rows of the table receive nothing.
  const auto& gt = grads[std::size_t(ids.wte.index)];
  for (std::size_t i = std::size_t(s.vocab) * std::size_t(s.d); i < gt.size(); ++i) BOOST_TEST_REQUIRE(gt[i] == 0.0f);
}
}  // namespace

BOOST_AUTO_TEST_CASE(gradients_match_finite_differences) { check_gradients(false); }
BOOST_AUTO_TEST_CASE(gradients_match_finite_differences_with_recompute) { check_gradients(true); }

// GPT-2's initialisation: N(0, 0.02) tables and matrices, residual projections
// scaled by 1/sqrt(2 layers), zero biases, unit LayerNorm scales, zero padded rows.
BOOST_AUTO_TEST_CASE(initial_weights_follow_gpt2) {
  comm::local<backend::host> solo;
  W m(solo);
  gpt::model_shape s{.layers = 8, .heads = 4, .d = 64, .seq = 16, .vocab = 300};
  const auto ids = gpt::register_model(m, s);
  m.finalize();
  gpt::init_model(m, ids, s, 1);
  auto sd = [](const std::vector<float>& v, std::size_t n) {
    double s2 = 0;
    for (std::size_t i = 0; i < n; ++i) s2 += double(v[i]) * v[i];
    return std::sqrt(s2 / double(n));
  };
  const auto wte = m.get_param(ids.wte);
  BOOST_TEST(std::abs(sd(wte, 300 * 64) - 0.02) < 0.001);
  for (std::size_t i = 300 * 64; i < wte.size(); ++i) BOOST_TEST_REQUIRE(wte[i] == 0.0f);
  const auto proj = m.get_param(ids.blocks[3].fc_proj_w);
  BOOST_TEST(std::abs(sd(proj, proj.size()) - 0.02 / 4.0) < 0.0005);
  for (float v : m.get_param(ids.blocks[2].qkv_b)) BOOST_TEST_REQUIRE(v == 0.0f);
  for (float v : m.get_param(ids.blocks[2].ln2_w)) BOOST_TEST_REQUIRE(v == 1.0f);
  BOOST_TEST(s.padded_vocab() == 384);
}

// Token shards (trainer_kit/tokens.hpp): a round trip in both of llm.c's
// formats, and each kind of damage is one tessera: error naming the file,
// before anything the header promises is allocated.
BOOST_AUTO_TEST_CASE(token_shards_and_their_errors) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera-gpt-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string good = (dir / "a.bin").string();
  std::vector<std::uint16_t> toks(100);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = std::uint16_t(i % 50);
  trainer_kit::write_shard(good, toks);
  BOOST_TEST(trainer_kit::read_shard<std::uint16_t>(good, 50).tokens == toks);
  {  // Llama 3's format (32-bit tokens) read as 32 and as 16 bits; GPT-2's read as 32
    const std::string wide = (dir / "wide.bin").string();
    std::vector<std::uint32_t> big(toks.begin(), toks.end());
    big[7] = 70000;
    trainer_kit::write_shard(wide, big, trainer_kit::llama3_shards);
    BOOST_TEST(std::filesystem::file_size(wide) == 1024 + 4 * big.size());
    BOOST_TEST(trainer_kit::read_shard<std::uint32_t>(wide, 128256).tokens == big);
    BOOST_TEST(trainer_kit::read_shard<std::uint32_t>(good, 50).tokens == std::vector<std::uint32_t>(toks.begin(), toks.end()));
    try {
      (void)trainer_kit::read_shard<std::uint16_t>(wide, 50257);
      BOOST_ERROR("a 32-bit token past a 16-bit vocabulary was read");
    } catch (const tessera::error& e) {
      BOOST_TEST(std::string(e.what()).find("token 70000 at position 7") != std::string::npos);
    }
  }
  const gpt::corpus c(good, false, 50, 9);
  std::vector<std::uint16_t> a(10), b(10);
  c.sequence(1, 3, 7, a.data());
  c.sequence(1, 3, 7, b.data());
  BOOST_TEST(a == b);  // a function of (seed, step, index)
  auto expect = [](auto f, const std::string& part) {
    try {
      f();
      BOOST_ERROR("no error; expected one containing '" << part << "'");
    } catch (const tessera::error& e) {
      BOOST_TEST_CONTEXT(e.what()) { BOOST_TEST(std::string(e.what()).find(part) != std::string::npos); }
    }
  };
  auto damaged = [&](const char* name, auto edit) {
    std::string bytes;
    {
      std::ifstream f(good, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(f), {});
    }
    edit(bytes);
    const std::string path = (dir / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  };
  const auto magic = damaged("magic.bin", [](std::string& s) { s[0] = 1; });
  const auto read = [](const std::string& p) { return trainer_kit::read_shard<std::uint16_t>(p, 50); };
  expect([&] { (void)read(magic); }, "is not a token shard: magic");
  const auto version = damaged("version.bin", [](std::string& s) { s[4] = 2; });
  expect([&] { (void)read(version); }, "token shard version 2");
  const auto shortf = damaged("short.bin", [](std::string& s) { s.resize(s.size() - 10); });
  expect([&] { (void)read(shortf); }, "holds 190 bytes of tokens; its header promises 100 16-bit tokens (200 bytes)");
  const auto longer = damaged("long.bin", [](std::string& s) { s += '\x01'; });  // an odd trailing byte
  expect([&] { (void)read(longer); }, "holds 201 bytes of tokens; its header promises 100 16-bit tokens");
  const auto lies = damaged("lies.bin", [](std::string& s) { s[8] = '\xff', s[9] = '\xff', s[10] = '\xff', s[11] = 0x7f; });
  expect([&] { (void)read(lies); }, "its header promises 2147483647 16-bit tokens");  // refused before any allocation
  expect([&] { (void)read(dir.string()); }, "is not a regular file (a directory)");
  const std::string fifo = (dir / "fifo").string();
  BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  expect([&] { (void)read(fifo); }, "is not a regular file (a FIFO)");  // refused, not opened (which would block)
  expect([&] { (void)trainer_kit::read_text<std::uint16_t>(fifo); }, "is not a regular file (a FIFO)");
  expect([&] { (void)gpt::corpus(good, false, 40, 9); }, "is not below the vocabulary size 40");
  expect([&] { (void)gpt::corpus(good, false, 50, 100); }, "no file holds 101 tokens");
  expect([&] { (void)gpt::corpus((dir / "nothing*.bin").string(), false, 50, 9); }, "no file matches it");
  std::filesystem::remove_all(dir);
}

// ---- --precision fp8's products (trainer_kit::host_linears over fp8_casts) ----
namespace {
std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = scale * (float(double(splitmix64(seed + i) >> 11) / 9007199254740992.0) * 2.0f - 1.0f);
  return v;
}
// Every value is an F code (a float that casts to itself) and the largest magnitude is F's max:
// the amax maps onto the format's largest value.
template <class F>
void check_codes(const std::vector<float>& q) {
  float m = 0;
  for (float v : q) {
    BOOST_TEST(float(F(v)) == v);
    m = std::max(m, std::fabs(v));
  }
  BOOST_TEST(m == F::max);
}
// y = alpha * (a b^T) in float64 over rows of a [n, k] and b [m, k].
std::vector<double> product(const std::vector<float>& a, const std::vector<float>& b, std::size_t n, std::size_t m,
                            std::size_t k, double alpha, bool a_t = false, bool b_t = false) {
  std::vector<double> y(n * m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) {
      double s = 0;
      for (std::size_t c = 0; c < k; ++c) s += double(a_t ? a[c * n + i] : a[i * k + c]) * double(b_t ? b[c * m + j] : b[j * k + c]);
      y[i * m + j] = alpha * s;
    }
  return y;
}
void check_close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  double worst = 0, big = 0;
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i])), big = std::max(big, std::fabs(want[i]));
  BOOST_TEST(worst <= tol * big, "worst difference " << worst << " against values up to " << big);
}
}  // namespace

BOOST_AUTO_TEST_CASE(fp8_products_equal_float64_of_their_codes) {
  const std::size_t n = 37, in = 24, out = 40;  // nothing a multiple of 16
  trainer_kit::fp8_casts casts({.on = true}, 2);
  std::vector<float> xq(n * in), wq(out * in), dyq(n * out);
  const trainer_kit::host_linears lin{&casts, xq.data(), wq.data(), dyq.data()};
  const auto x = random_floats(n * in, 11, 3.0f), W = random_floats(out * in, 12, 0.05f), dy = random_floats(n * out, 13, 1e-4f);
  std::vector<float> y(n * out, 0.0f);
  lin.forward(1, x.data(), W.data(), y.data(), n, in, out, 0.0f);
  check_codes<tessera::e4m3>(xq), check_codes<tessera::e4m3>(wq);
  const auto amax = [](const std::vector<float>& v) { float m = 0; for (float e : v) m = std::max(m, std::fabs(e)); return m; };
  const double ix = 1.0 / double(448.0f / amax(x)), iw = 1.0 / double(448.0f / amax(W));  // the inverse scales
  check_close(y, product(xq, wq, n, out, in, ix * iw), 1e-5);
  // ... and the product of the codes is the fp32 product within fp8's rounding (E4M3: 2^-4 relative)
  check_close(y, product(x, W, n, out, in, 1.0), 0.1);
  // backward: dy in E5M2; wgrad dW += dy^T x, dgrad dx = dy W
  std::vector<float> dW(out * in, 0.0f), dx(n * in, 0.0f);
  lin.backward(1, dy.data(), x.data(), W.data(), dW.data(), dx.data(), n, in, out);
  check_codes<tessera::e5m2>(dyq);
  const double ig = 1.0 / double(57344.0f / amax(dy));
  check_close(dW, product(dyq, xq, out, in, n, ig * ix, true, true), 1e-5);
  std::vector<float> wq_t(in * out);  // W's codes as [in, out] for dx = dy W
  for (std::size_t o = 0; o < out; ++o)
    for (std::size_t i = 0; i < in; ++i) wq_t[i * out + o] = wq[o * in + i];
  check_close(dx, product(dyq, wq_t, n, in, out, ig * iw), 1e-5);
  // off: the fp32 product itself
  trainer_kit::fp8_casts off;
  std::vector<float> y32(n * out, 0.0f);
  trainer_kit::host_linears{&off}.forward(0, x.data(), W.data(), y32.data(), n, in, out, 0.0f);
  check_close(y32, product(x, W, n, out, in, 1.0), 1e-6);
}

BOOST_AUTO_TEST_CASE(fp8_delayed_scales_come_from_the_steps_before) {
  comm::mpi world;
  trainer_kit::fp8_options o{.on = true, .scaling = {.kind = fp8::recipe::delayed, .history = 2}};
  trainer_kit::fp8_casts casts(o, 1);
  std::vector<float> a{0.5f, -1.0f}, b{4.0f, 2.0f}, q(2);
  // step 0: no history, each cast its own amax (1: scale 448)
  BOOST_TEST(casts.cast(0, trainer_kit::fp8_casts::input, a.data(), q.data(), 2) == 1.0f / 448.0f);
  BOOST_TEST(q[1] == -448.0f);
  casts.cast(0, trainer_kit::fp8_casts::input, b.data(), q.data(), 2);  // amax 4 on the same step
  casts.record(false);
  std::vector<float> big{100.0f};  // an evaluation's cast: not recorded
  casts.cast(0, trainer_kit::fp8_casts::input, big.data(), q.data(), 1);
  casts.record(true);
  casts.end_step(world);
  // step 1: the step's largest amax (4, over every rank), whatever this cast holds
  BOOST_TEST(casts.cast(0, trainer_kit::fp8_casts::input, a.data(), q.data(), 2) == 4.0f / 448.0f);
  BOOST_TEST(q[1] == -112.0f);
  // the state round-trips through a checkpoint's JSON; a damaged or other one is refused by name
  trainer_kit::fp8_casts again(o, 1);
  again.restore(casts.state(), "ck");
  std::vector<float> q2(2);
  again.cast(0, trainer_kit::fp8_casts::input, a.data(), q2.data(), 2);
  BOOST_TEST(q2 == q);
  auto damaged = casts.state();
  damaged.erase("amax");
  tessera_test::expect_error([&] { again.restore(damaged, "ck/step-3"); }, "ck/step-3: its fp8 state is damaged");
  trainer_kit::fp8_casts wider({.on = true, .scaling = {.kind = fp8::recipe::delayed, .history = 4}}, 1);
  tessera_test::expect_error([&] { wider.restore(casts.state(), "ck"); }, "this run keeps 3 of 4");
  auto short_history = casts.state();
  short_history["amax"] = std::vector<float>{1.0f};
  tessera_test::expect_error([&] { again.restore(short_history, "ck"); }, "holds 1 values, not 6");
  // a non-finite cast is not recorded (its step is skipped), and its scale is 1
  std::vector<float> inf{std::numeric_limits<float>::infinity()};
  trainer_kit::fp8_casts cur({.on = true}, 1);
  BOOST_TEST(cur.cast(0, trainer_kit::fp8_casts::grad, inf.data(), q.data(), 1) == 1.0f);
  BOOST_TEST(q[0] == 57344.0f);  // saturated
}
