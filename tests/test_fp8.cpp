// fp8 on the host backend: the two formats against a brute-force quantizer at
// every code, tie and edge; the scaling recipes; communicators refusing to
// reduce fp8; and fp8_gather at every world size meson runs it under, equal bit
// for bit to casting the gathered tensor with the same scale.
#define BOOST_TEST_MODULE tessera_fp8
#include "common/mpi_test_main.hpp"
#include "common/fp8_reference.hpp"
#include "common/util.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "tessera/tessera.hpp"

using namespace tessera;
using tessera_test::expect_error;
using tessera_test::uniform;

namespace {
template <class F> constexpr tessera_test::fp8_format_spec spec_of = tessera_test::e4m3_spec;
template <> constexpr tessera_test::fp8_format_spec spec_of<e5m2> = tessera_test::e5m2_spec;
using formats = std::tuple<e4m3, e5m2>;

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
float next_up(float f) { return std::nextafter(f, std::numeric_limits<float>::infinity()); }
float next_down(float f) { return std::nextafter(f, -std::numeric_limits<float>::infinity()); }

template <class F> void expect_reference(float x) {
  const std::uint8_t got = F::from_float(x), want = tessera_test::fp8_reference(spec_of<F>, x);
  BOOST_TEST_CONTEXT("x = " << x << " (bits 0x" << std::hex << bits_of(x) << ")") {
    BOOST_TEST(int(got) == int(want));
  }
}
}  // namespace

BOOST_AUTO_TEST_SUITE(formats_)

BOOST_AUTO_TEST_CASE_TEMPLATE(every_code_decodes_and_round_trips, F, formats) {
  const auto s = spec_of<F>;
  int finite = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = float(F::from_bits(std::uint8_t(c)));
    const int mag = c & 0x7f;
    if (mag > s.max_code) {  // e4m3: only 0x7f; e5m2: infinity (0x7c) and NaN
      if (s.ieee && mag == 0x7c) BOOST_TEST(std::isinf(v));
      else BOOST_TEST(std::isnan(v));
      continue;
    }
    ++finite;
    BOOST_TEST(double(v) == (c & 0x80 ? -1 : 1) * tessera_test::fp8_magnitude(s, mag));
    BOOST_TEST(int(F::from_float(v)) == c);  // -0 included: 0x80 stays 0x80
  }
  BOOST_TEST(finite == 2 * (s.max_code + 1));
  BOOST_TEST(float(F::from_bits(std::uint8_t(s.max_code))) == F::max);
  BOOST_TEST(float(F::from_bits(1)) == F::min_subnormal);
  BOOST_TEST(float(F::from_bits(std::uint8_t(1 << F::mantissa_bits))) == F::min_normal);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(ties_and_neighbours_round_like_the_reference, F, formats) {
  // Every midpoint between adjacent magnitudes (a tie), the floats either side
  // of it, and each code's own value and neighbours, both signs.
  const auto s = spec_of<F>;
  for (int c = 0; c < s.max_code; ++c) {
    const double lo = tessera_test::fp8_magnitude(s, c), hi = tessera_test::fp8_magnitude(s, c + 1);
    const float mid = float((lo + hi) / 2);  // exact: a few bits more than the format
    BOOST_REQUIRE(double(mid) == (lo + hi) / 2);
    for (float x : {mid, next_up(mid), next_down(mid), float(lo), next_up(float(lo)), float(hi), next_down(float(hi))})
      for (float sgn : {1.0f, -1.0f}) expect_reference<F>(sgn * x);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(edges_saturate_and_keep_nan, F, formats) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, F::max, next_up(F::max), F::max * 1.0625f, F::max * 4.0f, 3.0e38f, inf, -inf,
                  F::min_subnormal / 2, next_up(F::min_subnormal / 2), F::min_subnormal / 4,
                  std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(), F::min_normal, next_down(F::min_normal)})
    expect_reference<F>(x);
  BOOST_TEST(int(F::from_float(inf)) == spec_of<F>.max_code);
  BOOST_TEST(int(F::from_float(-inf)) == (0x80 | spec_of<F>.max_code));
  BOOST_TEST(int(F::from_float(std::numeric_limits<float>::quiet_NaN())) == 0x7f);
  BOOST_TEST(std::isnan(float(F(-std::numeric_limits<float>::quiet_NaN()))));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(random_floats_over_the_whole_range, F, formats) {
  // log-uniform magnitudes from 2^-30 to 2^20: subnormals, normals and saturation
  for (int i = 0; i < 200000; ++i) {
    const double e = uniform(i, 1) * 25.0 - 5.0;
    const float x = float(std::ldexp(1.0 + 0.5 * (uniform(i, 2) + 1.0), int(std::floor(e))) * (uniform(i, 3) < 0 ? -1 : 1));
    expect_reference<F>(x);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(scaling)

BOOST_AUTO_TEST_CASE_TEMPLATE(the_amax_maps_onto_the_largest_code, F, formats) {
  for (int i = 0; i < 10000; ++i) {
    const float amax = float(std::ldexp(1.0 + 0.5 * (uniform(i, 7) + 1.0), int(uniform(i, 8) * 40)));
    const float s = fp8::scale_for<F>(amax, 1.0f);
    BOOST_TEST(int(fp8::cast<F>(amax, s).bits) == spec_of<F>.max_code);
    BOOST_TEST(int(fp8::cast<F>(-amax, s).bits) == (0x80 | spec_of<F>.max_code));
    // a margin of m leaves the amax 2^m below the largest value
    const float s2 = fp8::scale_for<F>(amax, 1.0f, 2);
    BOOST_TEST(s2 == s / 4);
    BOOST_TEST(float(fp8::cast<F>(amax, s2)) <= F::max / 4 * 1.07f);
  }
  BOOST_TEST(fp8::scale_for<F>(F::max, 7.0f) == 1.0f);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_useless_amax_keeps_the_previous_scale, F, formats) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float amax : {0.0f, -1.0f, inf, std::numeric_limits<float>::quiet_NaN(), 1e-45f})
    BOOST_TEST(fp8::scale_for<F>(amax, 3.5f) == 3.5f);
}

BOOST_AUTO_TEST_CASE(delayed_amax_looks_at_the_last_casts) {
  float h[3] = {0, 0, 0};
  BOOST_TEST(fp8::delayed_amax(h, 3, 0, 9.0f) == 9.0f);  // nothing recorded yet: its own amax
  h[0] = 2.0f;                                           // step 0 recorded 2
  BOOST_TEST(fp8::delayed_amax(h, 3, 1, 9.0f) == 2.0f);  // the current amax is not looked at
  h[1] = 5.0f;
  h[2] = 1.0f;
  BOOST_TEST(fp8::delayed_amax(h, 3, 3, 0.5f) == 5.0f);
  h[1] = 0.25f;  // step 4 overwrote step 1's slot
  BOOST_TEST(fp8::delayed_amax(h, 3, 5, 0.5f) == 2.0f);
}

BOOST_AUTO_TEST_CASE(bad_recipes_and_settings_are_tessera_errors) {
  BOOST_TEST((fp8::parse_recipe("current") == fp8::recipe::current));
  BOOST_TEST((fp8::parse_recipe("delayed") == fp8::recipe::delayed));
  expect_error([] { (void)fp8::parse_recipe("tensorwise"); }, "fp8 recipe 'tensorwise'");
  expect_error([] { fp8::scaling{fp8::recipe::delayed, 0, 0}.check(); }, "amax history of 0");
  expect_error([] { fp8::scaling{fp8::recipe::current, 16, 40}.check(); }, "margin of 40");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(communicators)

BOOST_AUTO_TEST_CASE(fp8_is_gathered_never_reduced) {
  comm::mpi c;
  comm::local<backend::host> one;
  std::vector<std::uint8_t> buf(4 * std::size_t(c.size()), 1);
  for (dtype t : {dtype::f8e4m3, dtype::f8e5m2}) {
    expect_error([&] { c.all_reduce(buf.data(), buf.data(), 4, t, comm::reduce_op::sum); }, "fp8 is gathered, not reduced");
    expect_error([&] { c.reduce_scatter(buf.data(), buf.data(), 4, t, comm::reduce_op::max); }, "comm::mpi: a max reduction of F8_");
    expect_error([&] { (void)c.iall_reduce(buf.data(), buf.data(), 4, t, comm::reduce_op::sum); }, "fp8 is gathered");
    expect_error([&] { one.all_reduce(buf.data(), buf.data(), 4, t, comm::reduce_op::sum); }, "comm::local");
    BOOST_TEST(size_of(t) == 1u);
  }
  // the refusal came before any collective: the ranks still agree on the next one
  std::vector<e4m3> mine(3), all(3 * std::size_t(c.size()));
  for (std::size_t i = 0; i < 3; ++i) mine[i] = e4m3(float(c.rank() * 3 + int(i)));
  c.all_gather(mine.data(), all.data(), 3, dtype_of_v<e4m3>);
  for (std::size_t k = 0; k < all.size(); ++k) BOOST_TEST(float(all[k]) == float(k));
  BOOST_TEST(name_of(dtype::f8e4m3) == "F8_E4M3");
  BOOST_TEST(name_of(dtype::f8e5m2) == "F8_E5M2");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(gather)

namespace {
// A value of tensor element i at step k: mostly O(1), one element per step
// scaled up so that the amax moves between ranks and steps.
double element(std::size_t i, int step, std::size_t numel) {
  const double big = (i == (std::size_t(step) * 7919u) % numel) ? 3.0 + step : 1.0;
  return uniform(i, step, 11) * big * std::ldexp(1.0, step % 3 - 1);
}

template <class F, class T> void check_gathers(std::size_t numel, fp8::scaling how, int steps) {
  comm::mpi c;
  ShardedTensor<T, backend::host> w(c, tessera::shape{std::int64_t(numel)});
  fp8_gather<F, backend::host> g(c, w.shard().size(), how);
  std::vector<T> full(numel);
  std::vector<float> history;  // the reference recipe, over the whole tensor
  float ref_scale = 1.0f;
  for (int k = 0; k < steps; ++k) {
    for (std::size_t i = 0; i < numel; ++i) full[i] = convert<T>(element(i, k, numel));
    w.scatter_from(std::span<const T>(full));
    g.gather(std::span<const T>(w.shard()));

    float amax = 0;
    for (const T& x : full) amax = std::max(amax, std::fabs(convert<float>(x)));
    const float use = how.kind == fp8::recipe::delayed && !history.empty()
                          ? *std::max_element(history.end() - std::min<std::ptrdiff_t>(how.history, std::ptrdiff_t(history.size())), history.end())
                          : amax;
    ref_scale = fp8::scale_for<F>(use, ref_scale, how.margin);
    history.push_back(amax);
    BOOST_TEST_CONTEXT("numel " << numel << " step " << k << " world " << c.size() << " recipe " << fp8::name_of(how.kind)) {
      BOOST_TEST(g.scale()[0] == ref_scale);
      BOOST_TEST(g.scale()[1] == 1.0f / ref_scale);
      BOOST_TEST(*g.amax() == double(amax));
      const auto got = g.full();
      BOOST_REQUIRE(got.size() == w.padded_numel());
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < numel; ++i) wrong += got[i].bits != fp8::cast<F>(full[i], ref_scale).bits;
      for (std::size_t i = numel; i < got.size(); ++i) wrong += got[i].bits != 0;  // padding casts to +0
      BOOST_TEST(wrong == 0u);
    }
  }
  BOOST_TEST(g.steps() == std::size_t(steps));
  BOOST_TEST(g.bytes_gathered() == w.shard().size() * std::size_t(c.size() - 1));
}
using types = std::tuple<float, bf16>;
}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(equals_cast_after_gather_bit_for_bit, T, types) {
  for (std::size_t numel : {std::size_t(1), std::size_t(7), std::size_t(1000), std::size_t(4099)}) {
    check_gathers<e4m3, T>(numel, {fp8::recipe::current, 16, 0}, 4);
    check_gathers<e5m2, T>(numel, {fp8::recipe::current, 16, 1}, 3);
    check_gathers<e4m3, T>(numel, {fp8::recipe::delayed, 3, 0}, 7);  // the history wraps
  }
}

BOOST_AUTO_TEST_CASE(a_wrong_shard_or_an_infinite_one) {
  comm::mpi c;
  fp8_gather<e4m3, backend::host> g(c, 8);
  std::vector<float> shard(8, 0.5f), bad(7, 0.5f);
  expect_error([&] { g.gather(std::span<const float>(bad)); }, "fp8_gather: a shard of 7 elements where the gather was built for 8");
  // bad settings are refused before any buffer is sized from them
  expect_error([&] { (void)fp8_gather<e4m3, backend::host>(c, 8, {fp8::recipe::delayed, -1, 0}); }, "amax history of -1");
  g.gather(std::span<const float>(shard));
  const float s = g.scale()[0];
  BOOST_TEST(s == 896.0f);  // 448 / 0.5
  // an infinite value on the last rank: every rank keeps the scale, the cast saturates
  if (c.rank() == c.size() - 1) shard[3] = std::numeric_limits<float>::infinity();
  g.gather(std::span<const float>(shard));
  BOOST_TEST(g.scale()[0] == s);
  BOOST_TEST(std::isinf(*g.amax()));
  BOOST_TEST(float(g.full()[std::size_t(c.size() - 1) * 8 + 3]) == e4m3::max);
  BOOST_TEST(float(g.full()[0]) == 448.0f);
}

BOOST_AUTO_TEST_SUITE_END()
