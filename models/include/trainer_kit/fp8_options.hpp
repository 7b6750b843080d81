#pragma once
// --precision fp8's settings as the reference nets take them (net_options::fp8);
// trainer_kit/fp8_linears.hpp does the host nets' fp8 products with them.
#include "tessera/core/fp8_scaling.hpp"

namespace trainer_kit {

//! Off: the compute type's products; on: the linear layers' products in fp8
//! with per-tensor scales under `scaling` (its recipe: --fp8-recipe).
struct fp8_options {
  bool on = false;
  tessera::fp8::scaling scaling{};
};

}  // namespace trainer_kit
