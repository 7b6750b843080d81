#pragma once
// The one check that the cuBLASLt workspace the planner and the nets' buffer
// lists count (kernels/scratch.hpp, host code) is the one the library
// allocates (backend/cuda/blaslt.hpp, CUDA code). Every CUDA net includes it.
#include "tessera/backend/cuda/blaslt.hpp"
#include "trainer_kit/kernels/scratch.hpp"

static_assert(trainer_kit::kernels::cublaslt_bytes == tessera::cuda::matmul_workspace_bytes(),
              "tessera-plan counts the cuBLASLt workspace the library allocates (trainer_kit/kernels/scratch.hpp)");
