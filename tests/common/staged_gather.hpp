#pragma once
// comm::all_gather_host's staged path (device buffers: the CUDA backend's),
// shared by test-comm (on the host, under a backend named otherwise) and
// test-strategies-cuda (staged MPI and NCCL on the GPU).
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tessera/comm/staged.hpp"

namespace tessera_test {

//! Per-rank counts and staging bounds (bytes) that do not divide one another, and the default bound.
inline constexpr std::array<std::size_t, 5> staged_gather_counts{0, 1, 7, 1000, 4099};
inline constexpr std::array<std::size_t, 4> staged_gather_bounds{1, 100, 4096, tessera::comm::staged_gather_bytes};

//! Gathers n rank-tagged values from every rank through all_gather_host,
//! staging at most `stage` bytes at a time; returns how many landed wrong.
template <class Comm>
std::size_t misplaced_by_all_gather_host(Comm& c, std::size_t n, std::size_t stage) {
  const std::size_t P = std::size_t(c.size());
  const auto tag = [](std::size_t rank, std::size_t i) { return std::int64_t(rank) * 1000003 + std::int64_t(i); };
  std::vector<std::int64_t> mine(n), all(n * P, -1);
  for (std::size_t i = 0; i < n; ++i) mine[i] = tag(std::size_t(c.rank()), i);
  tessera::comm::all_gather_host(c, std::span<const std::int64_t>(mine), std::span<std::int64_t>(all), stage);
  std::size_t wrong = 0;
  for (std::size_t q = 0; q < P; ++q)
    for (std::size_t i = 0; i < n; ++i) wrong += all[q * n + i] != tag(q, i);
  return wrong;
}

}  // namespace tessera_test
