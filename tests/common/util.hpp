#pragma once
// Helpers shared by the suites: a counter-based RNG (the same values on every
// rank and world size), type names for failure messages, and comparisons.
#include <boost/core/demangle.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <typeinfo>

#include "tessera/core/error.hpp"
#include "tessera/core/hash.hpp"

namespace tessera_test {

//! splitmix64 of a key: a deterministic hash giving independent streams.
inline std::uint64_t mix(std::uint64_t x) { return tessera::splitmix64(x); }
//! Uniform in [-1, 1) from a tuple of keys.
template <class... K>
inline double uniform(K... keys) {
  std::uint64_t h = 0x1234567ull;
  ((h = mix(h ^ std::uint64_t(keys))), ...);
  return double(h >> 11) * 0x1p-52 - 1.0;
}

template <class T>
std::string type_name() {
  return boost::core::demangle(typeid(T).name());
}

//! |a - b| <= tol * max(1, |b|)
inline bool close(double a, double b, double tol) { return std::abs(a - b) <= tol * std::max(1.0, std::abs(b)); }

}  // namespace tessera_test

#include "tessera/policy/config.hpp"
namespace tessera_test {
//! The same policies on another backend.
template <class Cfg, class B>
using on_backend = tessera::config<typename Cfg::strategy, typename Cfg::wrapper, typename Cfg::precision,
                                   typename Cfg::averaging, B>;
// Checks that f throws a tessera::error whose what() starts with "tessera:" and contains `part`.
template <class F>
void expect_error(F&& f, const std::string& part) {
  try {
    f();
    BOOST_ERROR("expected a tessera error containing '" << part << "'");
  } catch (const tessera::error& e) {
    const std::string w = e.what();
    BOOST_TEST_CONTEXT("message: " << w) {
      BOOST_TEST(w.rfind("tessera: ", 0) == 0u);
      BOOST_TEST(w.find(part) != std::string::npos);
    }
  }
}

}  // namespace tessera_test
