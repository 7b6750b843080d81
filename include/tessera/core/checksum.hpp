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
    if (nt_ > 0) {  // finish a word left over from the last call
      while (n > 0 && nt_ < 8) tail_[nt_++] = *p++, --n;
      if (nt_ < 8) return;
      mix(load(tail_));
      nt_ = 0;
    }
    for (; n >= 8; n -= 8, p += 8) mix(load(p));
    while (n > 0) tail_[nt_++] = *p++, --n;
  }
  [[nodiscard]] std::uint64_t digest() const noexcept {
    unsigned char last[8] = {};
    std::memcpy(last, tail_, std::size_t(nt_));
    return splitmix64(h_ ^ splitmix64(load(last) ^ (len_ * 0x9e3779b97f4a7c15ull)));
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
  static std::uint64_t load(const unsigned char* p) noexcept {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    return w;
  }
  void mix(std::uint64_t w) noexcept {
    h_ ^= w * 0x87c37b91114253d5ull;
    h_ = ((h_ << 31) | (h_ >> 33)) * 0x4cf5ad432745937full + 0x52dce729ull;
  }
  std::uint64_t h_ = 0x6a09e667f3bcc908ull, len_ = 0;
  unsigned char tail_[8] = {};
  int nt_ = 0;
};

}  // namespace tessera
