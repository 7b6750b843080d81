#pragma once
//! \file The two fp8 storage formats of Hopper's tensor cores, usable on host
//! and device: `e4m3` (OCP E4M3FN: 4 exponent bits, bias 7, 3 mantissa bits,
//! no infinity, largest 448, 0x7f/0xff NaN) for weights and activations, and
//! `e5m2` (5 exponent bits, bias 15, 2 mantissa bits, IEEE-like, largest
//! 57344) for gradients.
//!
//! Conversion from float rounds to nearest even, keeps subnormals, and
//! saturates: a magnitude past the largest finite value (infinity included)
//! becomes the largest finite value, as CUDA's `__NV_SATFINITE` does, so the
//! host backend emulates the device bit for bit (tests/test_fp8.cpp checks every
//! code against a brute-force quantizer; tests/cuda against cuda_fp8.h). NaN
//! stays NaN (0x7f with the sign cleared, CUDA's choice). Scaled training never
//! feeds a value past the largest on purpose: the scale maps the tensor's
//! largest magnitude onto it (fp8_scaling.hpp), so saturation only catches the
//! rounding of that one value and the growth of delayed scaling's stale amax.
#include <cstdint>

#include "tessera/core/dtype.hpp"

namespace tessera {

namespace detail {
//! The fp8 code of a float with Man mantissa bits and exponent bias Bias, whose
//! largest finite magnitude has the float bits MaxBits and the code MaxCode.
template <int Man, int Bias, std::uint32_t MaxBits, std::uint8_t MaxCode>
TESSERA_HOST_DEVICE inline std::uint8_t fp8_from_float(float f) noexcept {
  const std::uint32_t u = float_bits(f);
  const std::uint8_t sign = std::uint8_t((u >> 24) & 0x80u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;                     // NaN
  if (a >= MaxBits) return std::uint8_t(sign | MaxCode);  // saturate (infinity too)
  const int e = int(a >> 23);                            // float's biased exponent
  const int te = e - 127 + Bias;                         // fp8's biased exponent
  constexpr int drop = 23 - Man;                         // mantissa bits rounded off
  if (te >= 1) {                                         // normal in fp8
    // The float with its exponent rebiased: dropping `drop` bits with round to
    // nearest even gives the fp8 code; a mantissa carry bumps the exponent as it should.
    std::uint32_t r = (std::uint32_t(te) << 23) | (a & 0x7fffffu);
    r += (1u << (drop - 1)) - 1u + ((r >> drop) & 1u);
    return std::uint8_t(sign | (r >> drop));
  }
  // Subnormal in fp8: the value over the subnormal unit 2^(1 - Bias - Man),
  // rounded to nearest even; a result of 2^Man is the smallest normal's code.
  if (e == 0) return sign;                               // float subnormals are far below fp8's
  const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;   // value = m * 2^(e - 150)
  const int shift = 150 - e + 1 - Bias - Man;            // >= drop + 1 here
  if (shift > 24) return sign;                           // below half the smallest subnormal
  const std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  return std::uint8_t(sign | (q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u)));
}

//! The float value of an fp8 code (exact); e4m3's 0x7f/0xff are NaN, e5m2's
//! exponent 31 is infinity or NaN.
template <int Man, int Bias, bool HasInf>
TESSERA_HOST_DEVICE inline float fp8_to_float(std::uint8_t c) noexcept {
  const std::uint32_t sign = std::uint32_t(c & 0x80u) << 24;
  constexpr int exp_bits = 7 - Man;
  const std::uint32_t e = (c >> Man) & ((1u << exp_bits) - 1u);
  const std::uint32_t m = c & ((1u << Man) - 1u);
  constexpr std::uint32_t top = (1u << exp_bits) - 1u;
  if (HasInf && e == top) return bits_float(sign | 0x7f800000u | (m ? 0x400000u : 0u));
  if (!HasInf && e == top && m == (1u << Man) - 1u) return bits_float(0x7fc00000u);
  if (e == 0) {  // subnormal: m * 2^(1 - Bias - Man), exact in float
    const float v = float(m) * bits_float(std::uint32_t(127 + 1 - Bias - Man) << 23);
    return bits_float(float_bits(v) | sign);
  }
  return bits_float(sign | ((e - Bias + 127u) << 23) | (m << (23 - Man)));
}

//! What tells the two formats apart (fp8_storage reads them).
struct e4m3_format {
  static constexpr int mantissa_bits = 3, bias = 7;
  static constexpr bool has_inf = false;
  static constexpr std::uint32_t max_float_bits = 0x43e00000u;  // 448
  static constexpr std::uint8_t max_code = 0x7e;
  static constexpr float max = 448.0f, min_normal = 0x1p-6f, min_subnormal = 0x1p-9f;
};
struct e5m2_format {
  static constexpr int mantissa_bits = 2, bias = 15;
  static constexpr bool has_inf = true;
  static constexpr std::uint32_t max_float_bits = 0x47600000u;  // 57344
  static constexpr std::uint8_t max_code = 0x7b;
  static constexpr float max = 57344.0f, min_normal = 0x1p-14f, min_subnormal = 0x1p-16f;
};
}  // namespace detail

//! One byte of fp8 storage in Format; arithmetic goes through float.
//! `max` is the largest finite magnitude (code `max_code`).
template <class Format>
struct fp8_storage : Format {
  std::uint8_t bits = 0;

  fp8_storage() = default;
  TESSERA_HOST_DEVICE explicit fp8_storage(float f) noexcept : bits(from_float(f)) {}
  TESSERA_HOST_DEVICE explicit operator float() const noexcept {
    return detail::fp8_to_float<Format::mantissa_bits, Format::bias, Format::has_inf>(bits);
  }
  TESSERA_HOST_DEVICE static fp8_storage from_bits(std::uint8_t b) noexcept {
    fp8_storage r;
    r.bits = b;
    return r;
  }
  TESSERA_HOST_DEVICE static std::uint8_t from_float(float f) noexcept {
    return detail::fp8_from_float<Format::mantissa_bits, Format::bias, Format::max_float_bits, Format::max_code>(f);
  }
  friend TESSERA_HOST_DEVICE bool operator==(fp8_storage a, fp8_storage b) noexcept { return a.bits == b.bits; }
};

//! E4M3 (OCP E4M3FN): what weights and activations are cast to.
using e4m3 = fp8_storage<detail::e4m3_format>;
//! E5M2: what gradients may be cast to (a wider range, one bit less).
using e5m2 = fp8_storage<detail::e5m2_format>;
static_assert(sizeof(e4m3) == 1 && sizeof(e5m2) == 1 && std::is_trivially_copyable_v<e4m3>);

//! One of the two fp8 formats.
template <class T>
concept fp8_format = std::is_same_v<T, e4m3> || std::is_same_v<T, e5m2>;

template <> struct dtype_of<e4m3> { static constexpr dtype value = dtype::f8e4m3; };
template <> struct dtype_of<e5m2> { static constexpr dtype value = dtype::f8e5m2; };

}  // namespace tessera
