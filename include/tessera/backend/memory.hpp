#pragma once
//! \file Per-backend accounting of the bytes the library allocates, so that a
//! trainer can report its measured peak beside the library's estimate.
#include <atomic>
#include <cstddef>

namespace tessera {

//! Bytes currently held and the high-water mark, for one backend.
class memory_counter {
public:
  void add(std::size_t n) noexcept {
    const std::size_t now = current_.fetch_add(n, std::memory_order_relaxed) + n;
    std::size_t p = peak_.load(std::memory_order_relaxed);
    while (now > p && !peak_.compare_exchange_weak(p, now, std::memory_order_relaxed)) {}
  }
  void sub(std::size_t n) noexcept { current_.fetch_sub(n, std::memory_order_relaxed); }
  [[nodiscard]] std::size_t current() const noexcept { return current_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::size_t peak() const noexcept { return peak_.load(std::memory_order_relaxed); }
  //! Starts a new high-water mark at the current figure.
  void reset_peak() noexcept { peak_.store(current(), std::memory_order_relaxed); }

private:
  std::atomic<std::size_t> current_{0}, peak_{0};
};

//! The counter of backend B (one per process).
template <class B>
[[nodiscard]] memory_counter& memory_of() noexcept {
  static memory_counter c;
  return c;
}

}  // namespace tessera
