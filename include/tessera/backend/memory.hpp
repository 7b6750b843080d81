#pragma once
//! \file Per-backend accounting of the bytes the library allocates, so that a
//! trainer can report its measured peak beside the library's estimate.
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <string>

#include "tessera/core/error.hpp"

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

//! Where a backend buffer lives: the backend's own memory, or host memory
//! the backend can still reach (pinned and mapped on CUDA: kernels read it
//! across PCIe), for state offloaded from the device
//! (wrapper_options::offload_optimizer).
enum class placement { device, host };

//! The tag of the counter of placement::host buffers (memory_of<host_resident>()):
//! host bytes the offload moved off the backend's own memory.
struct host_resident {};

//! The counter of backend B (one per process).
template <class B>
[[nodiscard]] memory_counter& memory_of() noexcept {
  static memory_counter c;
  return c;
}

//! Host memory available to new allocations (MemAvailable of /proc/meminfo;
//! TESSERA_HOST_MEMORY_BYTES overrides it, for tests), or 0 when unknown.
[[nodiscard]] inline std::size_t host_memory_available() {
  if (const char* e = std::getenv("TESSERA_HOST_MEMORY_BYTES")) return std::size_t(std::strtoull(e, nullptr, 10));
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::size_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

namespace detail {
//! A clear error before `bytes` of host memory are taken for `what`, where
//! the host does not have them (checked before allocating anything, so a
//! run that cannot fit loses nothing).
inline void check_host_room(std::size_t bytes, const char* what) {
  if (bytes == 0) return;
  const std::size_t avail = host_memory_available();
  TESSERA_CHECK(avail == 0 || bytes <= avail, what, " needs ", bytes, " bytes (", double(bytes) / (1u << 30),
                " GiB) of host memory and ", avail, " bytes (", double(avail) / (1u << 30),
                " GiB) are available; offload a smaller fraction (wrapper_options::offload_optimizer) or use more ranks");
}
}  // namespace detail

}  // namespace tessera
