#pragma once
//! \file splitmix64: a stateless 64-bit mixer, usable on host and device. The
//! library's tests, examples and benchmarks draw reproducible "random" values
//! from it by hashing (seed, index), so every rank and world size sees the same.
#include <cstdint>

#include "tessera/core/config.hpp"

namespace tessera {

[[nodiscard]] TESSERA_HOST_DEVICE constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace tessera
