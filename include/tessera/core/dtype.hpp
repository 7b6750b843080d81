#pragma once
//! \file Storage types bf16 and fp16 (usable on host and device, round to
//! nearest even), the runtime dtype tag and compile-time traits.

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "tessera/core/config.hpp"

namespace tessera {

namespace detail {
TESSERA_HOST_DEVICE inline std::uint32_t float_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
TESSERA_HOST_DEVICE inline float bits_float(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
}  // namespace detail

//! bfloat16 storage: 1 sign, 8 exponent, 7 mantissa bits. Arithmetic goes
//! through float; conversion from float rounds to nearest even and keeps NaN a NaN.
struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  TESSERA_HOST_DEVICE explicit bf16(float f) noexcept : bits(from_float(f)) {}
  TESSERA_HOST_DEVICE explicit operator float() const noexcept {
    return detail::bits_float(std::uint32_t(bits) << 16);
  }
  TESSERA_HOST_DEVICE static bf16 from_bits(std::uint16_t b) noexcept {
    bf16 r;
    r.bits = b;
    return r;
  }
  TESSERA_HOST_DEVICE static std::uint16_t from_float(float f) noexcept {
    std::uint32_t u = detail::float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return std::uint16_t(u >> 16);
  }
  friend TESSERA_HOST_DEVICE bool operator==(bf16 a, bf16 b) noexcept { return a.bits == b.bits; }
};

//! IEEE binary16 storage: 1 sign, 5 exponent, 10 mantissa bits, with
//! subnormals; conversion from float rounds to nearest even.
struct fp16 {
  std::uint16_t bits = 0;

  fp16() = default;
  TESSERA_HOST_DEVICE explicit fp16(float f) noexcept : bits(from_float(f)) {}
  TESSERA_HOST_DEVICE explicit operator float() const noexcept { return to_float(bits); }
  TESSERA_HOST_DEVICE static fp16 from_bits(std::uint16_t b) noexcept {
    fp16 r;
    r.bits = b;
    return r;
  }
  TESSERA_HOST_DEVICE static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t u = detail::float_bits(f);
    const std::uint32_t sign = (u >> 16) & 0x8000u;
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return std::uint16_t(sign | 0x7e00u);          // NaN
    if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);         // overflow -> inf (incl. rounding up)
    if (a < 0x38800000u) {                                               // subnormal or zero in fp16
      if (a < 0x33000000u) return std::uint16_t(sign);                   // below half the smallest subnormal
      const std::uint32_t e = a >> 23;
      const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
      const std::uint32_t shift = 126u - e;  // in [14, 24] here
      // value = m * 2^(e-150); fp16 subnormal unit = 2^-24 -> q = m * 2^(e-126)
      const std::uint32_t q = m >> shift;
      const std::uint32_t rem = m & ((1u << shift) - 1u);
      const std::uint32_t half = 1u << (shift - 1u);
      std::uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
      return std::uint16_t(sign | r);
    }
    std::uint32_t r = a - 0x38000000u;                                   // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);                                      // round to nearest even
    return std::uint16_t(sign | (r >> 13));
  }
  TESSERA_HOST_DEVICE static float to_float(std::uint16_t h) noexcept {
    const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
    const std::uint32_t e = (h >> 10) & 0x1fu;
    const std::uint32_t m = h & 0x3ffu;
    if (e == 0) {
      // subnormal: m * 2^-24, exact in float
      const float v = float(m) * 5.9604644775390625e-08f;
      return detail::bits_float(detail::float_bits(v) | sign);
    }
    if (e == 31) return detail::bits_float(sign | 0x7f800000u | (m << 13));
    return detail::bits_float(sign | ((e + 112u) << 23) | (m << 13));
  }
  friend TESSERA_HOST_DEVICE bool operator==(fp16 a, fp16 b) noexcept { return a.bits == b.bits; }
};

//! Converts between any two tessera element types through float (double stays double).
template <class To, class From>
TESSERA_HOST_DEVICE inline To convert(From x) noexcept {
  if constexpr (std::is_same_v<To, From>) return x;
  else if constexpr (std::is_same_v<From, bf16> || std::is_same_v<From, fp16>) return convert<To>(float(x));
  else if constexpr (std::is_same_v<To, bf16> || std::is_same_v<To, fp16>) return To(float(x));
  else return To(x);
}

//! Runtime element type tag, used by communicators and checkpoints.
//! f8e4m3 and f8e5m2 (core/fp8.hpp) are gathered and stored, never reduced.
enum class dtype : std::uint8_t { f32, f64, bf16, f16, i32, i64, u8, f8e4m3, f8e5m2 };

//! Whether a runtime dtype is one of the two fp8 formats.
[[nodiscard]] constexpr bool is_fp8(dtype t) noexcept { return t == dtype::f8e4m3 || t == dtype::f8e5m2; }

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of<double> { static constexpr dtype value = dtype::f64; };
template <> struct dtype_of<bf16> { static constexpr dtype value = dtype::bf16; };
template <> struct dtype_of<fp16> { static constexpr dtype value = dtype::f16; };
template <> struct dtype_of<std::int32_t> { static constexpr dtype value = dtype::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr dtype value = dtype::i64; };
template <> struct dtype_of<std::uint8_t> { static constexpr dtype value = dtype::u8; };
template <class T> inline constexpr dtype dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

//! A type the library stores and communicates.
template <class T>
concept element_type = requires { dtype_of<std::remove_cv_t<T>>::value; };

//! A floating element type: what weights, gradients and optimizer state may be.
template <class T>
concept floating_element = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                           std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

//! Bytes per element of a runtime dtype.
[[nodiscard]] constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f64: case dtype::i64: return 8;
    case dtype::f32: case dtype::i32: return 4;
    case dtype::bf16: case dtype::f16: return 2;
    case dtype::u8: case dtype::f8e4m3: case dtype::f8e5m2: return 1;
  }
  return 0;
}

//! Name as safetensors spells it (F32, BF16, ...).
[[nodiscard]] constexpr std::string_view name_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f64: return "F64";
    case dtype::bf16: return "BF16";
    case dtype::f16: return "F16";
    case dtype::i32: return "I32";
    case dtype::i64: return "I64";
    case dtype::u8: return "U8";
    case dtype::f8e4m3: return "F8_E4M3";
    case dtype::f8e5m2: return "F8_E5M2";
  }
  return "?";
}

//! Unit roundoff of a floating type (half an ulp at 1.0), for tolerances.
template <class T>
inline constexpr double epsilon_of = std::is_same_v<T, bf16> ? 0x1p-8
                                   : std::is_same_v<T, fp16> ? 0x1p-11
                                   : std::is_same_v<T, float> ? 0x1p-24
                                                              : 0x1p-53;

}  // namespace tessera
