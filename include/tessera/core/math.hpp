#pragma once
//! \file Small integer helpers used for layouts and launches.
#include <cstddef>
#include <cstdint>
#include "tessera/core/config.hpp"

namespace tessera {
template <class I>
[[nodiscard]] TESSERA_HOST_DEVICE constexpr I ceil_div(I a, I b) noexcept { return (a + b - 1) / b; }
template <class I>
[[nodiscard]] TESSERA_HOST_DEVICE constexpr I round_up(I a, I b) noexcept { return ceil_div(a, b) * b; }
}  // namespace tessera
