#pragma once
//! \file Counter-based random values: each value is a pure function of
//! (seed, stream key, element index), so any rank can draw exactly the
//! elements it owns and every world size, strategy and wrapper sees the same
//! numbers (no generator state to advance, split or broadcast). Usable on
//! host and device. The initializers of the wrappers (`init_param`) are built
//! on it.
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "tessera/core/config.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/hash.hpp"

namespace tessera {

//! A 64-bit key for a name (FNV-1a, then mixed): parameters are keyed by
//! their full name, which is the same at every world size.
[[nodiscard]] constexpr std::uint64_t key_of(std::string_view name) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ std::uint64_t(static_cast<unsigned char>(c))) * 0x100000001b3ull;
  return splitmix64(h);
}

//! Two independent 64-bit words for element i of stream `key` under `seed`.
struct counter_bits {
  std::uint64_t a, b;
};
[[nodiscard]] TESSERA_HOST_DEVICE constexpr counter_bits counter_random(std::uint64_t seed, std::uint64_t key,
                                                                        std::uint64_t i) noexcept {
  const std::uint64_t s = splitmix64(seed ^ splitmix64(key));
  const std::uint64_t a = splitmix64(s + 2 * i * 0x9e3779b97f4a7c15ull);
  return {a, splitmix64(a ^ 0x632be59bd9b4e019ull)};
}

//! A uniform value in (0, 1] from the top 53 bits of a word.
[[nodiscard]] TESSERA_HOST_DEVICE inline double unit_interval(std::uint64_t w) noexcept {
  return (double(w >> 11) + 1.0) * 0x1p-53;
}

//! N(0, 1) for element i of stream `key` (Box-Muller on the two words, in
//! double; then rounded to float). glibc's log and cos and CUDA's agree to
//! about an ulp of double, so the floats are equal except where a value lands
//! that close to a float rounding boundary (one ulp apart then): measured on
//! an H200, 0 of 2^24 draws and 0 of GPT-2 124M's weights differ.
[[nodiscard]] TESSERA_HOST_DEVICE inline double counter_normal(std::uint64_t seed, std::uint64_t key,
                                                             std::uint64_t i) noexcept {
  const counter_bits r = counter_random(seed, key, i);
  const double u1 = unit_interval(r.a), u2 = double(r.b >> 11) * 0x1p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

//! The initial values a wrapper's init_param draws: value(key, i) for element
//! i of the parameter whose key is `key` (key_of its "unit.tensor" name).
//! These are callable on the device too (on_device): the CUDA backend draws
//! each rank's elements in a kernel, where they are written, instead of on
//! the host (a 1.5B-parameter model in milliseconds instead of seconds).
namespace init {
//! An initializer's settings as one number, for the check that every rank
//! set the same values (the optimizer's step, get_param): its digest() where
//! it has one (the library's do), else 0 (only the call is compared).
template <class I>
[[nodiscard]] std::uint64_t initializer_digest(const I& i) noexcept {
  if constexpr (requires { { i.digest() } -> std::convertible_to<std::uint64_t>; }) return i.digest();
  else return 0;
}
//! The digest of a library initializer's kind and fields (doubles by their bits).
[[nodiscard]] inline std::uint64_t digest_of(std::uint64_t kind, std::uint64_t a, double b, double c) noexcept {
  std::uint64_t bb = 0, cc = 0;
  static_assert(sizeof(double) == sizeof(std::uint64_t));
  __builtin_memcpy(&bb, &b, sizeof b);
  __builtin_memcpy(&cc, &c, sizeof c);
  return splitmix64(splitmix64(splitmix64(kind) ^ a) ^ bb) ^ cc;
}
//! N(mean, stdev), rounded to float.
struct normal {
  static constexpr bool on_device = true;
  std::uint64_t seed = 0;
  double stdev = 1.0, mean = 0.0;
  //! What the step's check compares across ranks (see initializer_digest).
  [[nodiscard]] std::uint64_t digest() const noexcept { return digest_of(1, seed, stdev, mean); }
  [[nodiscard]] TESSERA_HOST_DEVICE float value(std::uint64_t key, std::size_t i) const noexcept {
    return float(mean + stdev * counter_normal(seed, key, i));
  }
};
//! U[lo, hi), rounded to float.
struct uniform {
  static constexpr bool on_device = true;
  std::uint64_t seed = 0;
  double lo = 0.0, hi = 1.0;
  [[nodiscard]] std::uint64_t digest() const noexcept { return digest_of(2, seed, lo, hi); }
  [[nodiscard]] TESSERA_HOST_DEVICE float value(std::uint64_t key, std::size_t i) const noexcept {
    return float(lo + (hi - lo) * (double(counter_random(seed, key, i).a >> 11) * 0x1p-53));
  }
};
//! Every element the same (zeros for biases, ones for norm scales).
struct constant {
  static constexpr bool on_device = true;
  double v = 0.0;
  [[nodiscard]] std::uint64_t digest() const noexcept { return digest_of(3, 0, v, 0.0); }
  [[nodiscard]] TESSERA_HOST_DEVICE float value(std::uint64_t, std::size_t) const noexcept { return float(v); }
};
//! `inner` for the first `count` elements, zero after: a table padded past
//! its real rows (a vocabulary rounded up for aligned GEMMs) starts with
//! zeros there.
template <class I>
struct first {
  static constexpr bool on_device = requires { requires I::on_device; };
  I inner;
  std::size_t count = 0;
  [[nodiscard]] std::uint64_t digest() const noexcept {
    return splitmix64(initializer_digest(inner) ^ splitmix64(std::uint64_t(count) + 4));
  }
  [[nodiscard]] TESSERA_HOST_DEVICE float value(std::uint64_t key, std::size_t i) const noexcept {
    return i < count ? inner.value(key, i) : 0.0f;
  }
};
}  // namespace init

//! What init_param accepts: anything with value(key, element index) -> float.
template <class I>
concept initializer = requires(const I& i, std::uint64_t key, std::size_t n) {
  { i.value(key, n) } -> std::convertible_to<float>;
};
//! An initializer the CUDA backend runs on the device: value() is
//! __host__ __device__ (TESSERA_HOST_DEVICE), I is trivially copyable, and it
//! says so with `static constexpr bool on_device = true`. Others run on the
//! host and are copied over.
template <class I>
concept device_initializer = initializer<I> && std::is_trivially_copyable_v<I> && requires { requires I::on_device; };

namespace detail {
//! An initializer bound to its parameter's key: value of element i, as
//! unit_store::init_param takes it; on_device as I's.
template <class I>
struct drawn {
  static constexpr bool on_device = device_initializer<I>;
  I init;
  std::uint64_t key;
  [[nodiscard]] TESSERA_HOST_DEVICE float operator()(std::size_t i) const noexcept
    requires device_initializer<I> { return init.value(key, i); }
  [[nodiscard]] float operator()(std::size_t i) const noexcept
    requires(!device_initializer<I>) { return init.value(key, i); }
};
//! out[i] = element first + i of f, rounded to M then to T (the host path's
//! arithmetic): a backend for_each functor.
template <class T, class M, class F>
struct drawn_into {
  T* out;
  F f;
  std::size_t first;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const { out[i] = convert<T>(M(f(first + i))); }
};
}  // namespace detail

}  // namespace tessera
