#pragma once
// init_param's property, shared by the host and CUDA suites: every rank draws
// only its own elements from (seed, name, index), so main and compute weights
// are bit-identical to the values drawn whole on the host, at every world
// size, strategy, wrapper and precision (and no rank builds the full tensor).
// Shapes that do not divide the world size; the library's initializers (on
// the CUDA backend drawn on the device), init::first (a padded table) and a
// user's initializer (drawn on the host on every backend).
#include <cstddef>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "tessera/tessera.hpp"

namespace tessera_test {

//! A user's initializer: host-only value(), no on_device.
struct index_initializer {
  [[nodiscard]] float value(std::uint64_t, std::size_t i) const noexcept { return float(i % 97) * 0.01f; }
};

template <class Cfg, class Comm>
void check_init_param(Comm& c) {
  using namespace tessera;
  using C = typename Cfg::compute_type;
  data_parallel_t<Cfg> m(c);
  const auto u0 = m.add_unit("embed"), u1 = m.add_unit("block0");
  const param_id ps[] = {m.add_param(u0, "wte", {37, 5}), m.add_param(u0, "ln.b", {7}, false),
                         m.add_param(u1, "w", {3, 11}), m.add_param(u1, "scale", {13}, false),
                         m.add_param(u1, "padded", {9, 4}), m.add_param(u1, "user", {29})};
  m.finalize();
  const init::normal normal{.seed = 7, .stdev = 0.02};
  const init::uniform uni{.seed = 7, .lo = -1, .hi = 1};
  const init::first<init::normal> padded{normal, 23};  // 23 of 36 drawn, the rest zero
  static_assert(device_initializer<init::first<init::normal>> && !device_initializer<index_initializer>);
  m.init_param(ps[0], normal);
  m.init_param(ps[1], init::constant{0.5});
  m.init_param(ps[2], uni);
  m.init_param(ps[3], init::constant{1.0});
  m.init_param(ps[4], padded);
  m.init_param(ps[5], index_initializer{});
  const char* names[] = {"embed.wte", "embed.ln.b", "block0.w", "block0.scale", "block0.padded", "block0.user"};
  for (int k = 0; k < 6; ++k) {
    const std::vector<float> got = m.get_param(ps[k]);
    const auto key = key_of(names[k]);
    std::vector<float> want(got.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      want[i] = k == 0   ? normal.value(key, i)
                : k == 1 ? 0.5f
                : k == 2 ? uni.value(key, i)
                : k == 3 ? 1.0f
                : k == 4 ? (i < 23 ? normal.value(key, i) : 0.0f)
                         : index_initializer{}.value(key, i);
    BOOST_TEST_CONTEXT(names[k]) {
      BOOST_TEST(got == want, boost::test_tools::per_element());
      auto s = m.gather(unit_id{ps[k].unit});
      const auto w = s.weight(ps[k]);
      std::vector<C> wc(w.size());  // the compute weights, from the backend's memory
      backend_ops<typename Cfg::backend_type>::copy_to_host(std::span<C>(wc), w);
      for (std::size_t i = 0; i < want.size(); ++i) BOOST_TEST(float(wc[i]) == float(convert<C>(want[i])));
    }
  }
}

}  // namespace tessera_test
