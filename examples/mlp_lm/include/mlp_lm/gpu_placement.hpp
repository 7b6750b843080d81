#pragma once
// GPU placement is the trainer kit's (shared by every reference trainer).
#include "trainer_kit/gpu_placement.hpp"

namespace mlp_lm {
using trainer_kit::gpu_placement;
using trainer_kit::place_on_gpu;
}  // namespace mlp_lm
