#pragma once
// The MLP programs' configuration table is the trainer kit's (one table for
// every reference program).
#include "trainer_kit/configs.hpp"

namespace mlp_lm {
using trainer_kit::with_config;
}  // namespace mlp_lm
