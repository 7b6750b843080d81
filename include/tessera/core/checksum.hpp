#pragma once
//! \file checksum64: a streaming 64-bit checksum of bytes, for checkpoint
//! files. Not cryptographic: it detects damage (flipped bits, truncation,
//! swapped blocks), about one multiply per 8 bytes so it costs little beside
//! the disk. The same bytes give the same value however they are split into
//! update() calls.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "tessera/core/hash.hpp"

namespace tessera {

class checksum64 {
public:
  void update(const void* data, std::size_t n) noexcept {
    const auto* p = static_cast<const unsigned char*>(data);
    len_ += n;
    if (nt_ > 0) {  // finish a block left over from the last call
      while (n > 0 && nt_ < block) tail_[nt_++] = *p++, --n;
      if (nt_ < block) return;
      mix(tail_);
      nt_ = 0;
    }
    for (; n >= block; n -= block, p += block) mix(p);
    while (n > 0) tail_[nt_++] = *p++, --n;
  }
  [[nodiscard]] std::uint64_t digest() const noexcept {
    unsigned char last[block] = {};
    std::memcpy(last, tail_, std::size_t(nt_));
    std::uint64_t h = splitmix64(len_ * 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < lanes; ++i) h = splitmix64(h ^ lane_[i] ^ splitmix64(load(last + 8 * i) + std::uint64_t(i)));
    return h;
  }
  //! The digest as 16 lower-case hex digits.
  [[nodiscard]] std::string hex() const { return to_hex(digest()); }
  [[nodiscard]] static std::string to_hex(std::uint64_t v) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
    return b;
  }
  [[nodiscard]] static std::uint64_t of(const void* data, std::size_t n) noexcept {
    checksum64 c;
    c.update(data, n);
    return c.digest();
  }

private:
  // Four independent lanes over 32-byte blocks: the multiplies of one block
  // overlap, so the hash runs at several GB/s on one core.
  static constexpr int lanes = 4, block = 8 * lanes;
  static std::uint64_t load(const unsigned char* p) noexcept {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    return w;
  }
  void mix(const unsigned char* p) noexcept {
    for (int i = 0; i < lanes; ++i) {
      std::uint64_t h = lane_[i] ^ (load(p + 8 * i) * 0x87c37b91114253d5ull);
      lane_[i] = ((h << 31) | (h >> 33)) * 0x4cf5ad432745937full + 0x52dce729ull;
    }
  }
  std::uint64_t lane_[lanes] = {0x6a09e667f3bcc908ull, 0xbb67ae8584caa73bull, 0x3c6ef372fe94f82bull,
                                0xa54ff53a5f1d36f1ull};
  std::uint64_t len_ = 0;
  unsigned char tail_[block] = {};
  int nt_ = 0;
};

}  // namespace tessera
