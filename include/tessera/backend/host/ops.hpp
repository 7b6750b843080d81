#pragma once
//! \file backend_ops<backend::host>: plain loops on the calling thread.
#include <algorithm>
#include <functional>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>
#include <utility>

#include "tessera/backend/host/buffer.hpp"
#include "tessera/backend/ops.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/fixed_point.hpp"

namespace tessera {

template <>
struct backend_ops<backend::host> {
  using tessera_backend_ops = void;
  template <class T> using buffer = host::buffer<T>;
  //! Host memory for staging copies to and from buffers (plain memory here;
  //! pinned on the CUDA backend): reserve(n) grows it, data() is the start.
  template <class T> struct staging {
    std::vector<T> v;
    void reserve(std::size_t n) {
      if (v.size() < n) v.resize(n);
    }
    [[nodiscard]] T* data() noexcept { return v.data(); }
  };

  template <class T> static void fill(std::span<T> dst, T value) { std::fill(dst.begin(), dst.end(), value); }

  template <class T> static void copy(std::span<T> dst, std::span<const T> src) {
    TESSERA_CHECK(dst.size() == src.size(), "copy of ", src.size(), " elements into ", dst.size());
    if (!src.empty()) std::memmove(dst.data(), src.data(), src.size() * sizeof(T));
  }
  template <class T> static void copy_from_host(std::span<T> dst, std::span<const T> src) { copy(dst, src); }
  template <class T> static void copy_to_host(std::span<T> dst, std::span<const T> src) { copy(dst, src); }
  //! Device to host without waiting (dst: staging memory); the values are
  //! there once a marker recorded after it is reached. Here at once.
  template <class T> static void copy_to_host_async(std::span<T> dst, std::span<const T> src) { copy(dst, src); }
  template <class T> static void copy_from_host_async(std::span<T> dst, std::span<const T> src) { copy(dst, src); }
  //! Host work in stream order: here, now.
  template <class F> static void host_task(F f) { f(); }

  //! A point in the work issued so far on the current stream: record() sets
  //! it, done() asks whether the work before it finished, wait() blocks the
  //! host until it did. Host work is done when issued.
  struct marker {
    void record() noexcept {}
    [[nodiscard]] bool done() const noexcept { return true; }
    void wait() const noexcept {}
  };

  //! Calls f(i) for i in [0, n) in order.
  template <class F> static void for_each(std::size_t n, F f) {
    for (std::size_t i = 0; i < n; ++i) f(i);
  }

  //! for_each over placement::host memory (the same memory here).
  template <class F> static void for_each_streaming(std::size_t n, F f, unsigned = 0) { for_each(n, f); }

  //! acc[0] += sum of squares of the finite elements of x (in double),
  //! acc[1] += number of non-finite elements. acc is backend memory.
  template <class T> static void sum_squares_into(std::span<const T> x, double* acc) {
    double s = 0, bad = 0;
    for (const T& v : x) {
      const double d = convert<double>(v);
      if (!std::isfinite(d)) bad += 1;
      else s += d * d;
    }
    acc[0] += s;
    acc[1] += bad;
  }
  //! The same over several spans (the CUDA backend's one launch for all).
  template <class T> static void sum_squares_into(std::span<const std::span<const T>> xs, double* acc) {
    for (const auto& x : xs) sum_squares_into(x, acc);
  }

  //! Calls f(i) for i in [0, n), each returning a non-negative magnitude
  //! (+inf for a value that is not finite), and sets acc[0] to the largest
  //! of them and acc[0]: one pass where a kernel also needs its range.
  template <class F> static void for_each_max(std::size_t n, F f, double* acc) {
    double m = acc[0];
    for (std::size_t i = 0; i < n; ++i) m = std::max(m, f(i));
    acc[0] = m;
  }

  //! acc[0] = max(acc[0], largest |x[i]|), +inf where some element is not
  //! finite (exact_reduction's range; acc is backend memory).
  template <class T> static void max_abs_into(std::span<const T> x, double* acc) {
    for_each_max(x.size(), detail::magnitude_at<T>{x.data()}, acc);
  }
  //! The same over several spans.
  template <class T> static void max_abs_into(std::span<const std::span<const T>> xs, double* acc) {
    for (const auto& x : xs) max_abs_into(x, acc);
  }
  //! Adds every finite x[i]^2 onto the fixed-point grid of the largest
  //! magnitude *max (from max_abs_into, agreed over the ranks) as three
  //! uint64 limbs (core/fixed_point.hpp): an integer sum, the same in any
  //! order. Nothing where *max is zero or not finite.
  template <class T> static void sum_squares_fixed_into(std::span<const T> x, const double* max, std::uint64_t* acc) {
    const double m = *max;
    if (!(m > 0) || !std::isfinite(m)) return;
    const int t = fixed::square_shift(m);
    for (const T& v : x) fixed::add_square(convert<double>(v), t, acc);
  }
  //! The same over several spans.
  template <class T>
  static void sum_squares_fixed_into(std::span<const std::span<const T>> xs, const double* max, std::uint64_t* acc) {
    for (const auto& x : xs) sum_squares_fixed_into(x, max, acc);
  }

  //! Work that must follow an asynchronous operation: returns a callable that
  //! waits for it (`wait`) and then runs `then`. Here both run when the
  //! callable is called; the CUDA backend queues them at once on side stream
  //! `Lane` (0: gathers' copies, 1: the optimizer's deferred updates, 2: offloaded
  //! units' host updates).
  template <int Lane = 0, class Wait, class Then> static auto after(Wait wait, Then then) {
    return [wait = std::move(wait), then = std::move(then)]() mutable {
      wait();
      then();
    };
  }

  static void synchronize() noexcept {}
  //! Whether work is being captured for replay (never on the host).
  [[nodiscard]] static constexpr bool capturing() noexcept { return false; }
};

}  // namespace tessera
