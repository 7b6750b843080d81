#pragma once
// A brute-force fp8 quantizer, written independently of core/fp8.hpp: it
// decodes every finite code of the format in double and picks the nearest,
// ties to the code with an even mantissa, saturating at the largest finite
// value. Tests hold the library's bit-level conversion to it.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace tessera_test {

struct fp8_format_spec {
  int man, bias;
  bool ieee;       // e5m2: the top exponent is infinity and NaN; e4m3fn: only S.1111.111 is NaN
  int max_code;    // largest finite magnitude's code
};
inline constexpr fp8_format_spec e4m3_spec{3, 7, false, 0x7e};
inline constexpr fp8_format_spec e5m2_spec{2, 15, true, 0x7b};

// The value of a magnitude code (0 .. max_code), from the definition of the format.
inline double fp8_magnitude(fp8_format_spec f, int code) {
  const int e = code >> f.man, m = code & ((1 << f.man) - 1);
  if (e == 0) return std::ldexp(double(m), 1 - f.bias - f.man);
  return std::ldexp(1.0 + double(m) / double(1 << f.man), e - f.bias);
}

inline std::uint8_t fp8_reference(fp8_format_spec f, float x) {
  if (std::isnan(x)) return 0x7f;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(double(x));
  if (a >= fp8_magnitude(f, f.max_code)) return std::uint8_t(sign | f.max_code);
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= f.max_code; ++c) {
    const double d = std::fabs(fp8_magnitude(f, c) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
  }
  return std::uint8_t(sign | best);
}

}  // namespace tessera_test
