#pragma once
// The scratch sizes of the kernel kit's reductions, the embedding's ordered
// backward and cuBLASLt, as plain arithmetic that host-only code
// (tessera-plan, the nets' buffer lists) can include.
#include <cstddef>

namespace trainer_kit::kernels {

//! Most row slices column_sums (column_sums.cuh) uses, and the floats of
//! scratch it needs at any row count for up to max_cols columns.
inline constexpr int column_parts_max = 64;
constexpr std::size_t column_scratch_floats(int max_cols) {
  return std::size_t(column_parts_max) * std::size_t(max_cols);
}

//! Ints of n rows grouped by token (trainer_kit::token_groups, the
//! embedding's ordered backward): at most 4 n + 1.
inline constexpr std::size_t token_group_ints(std::size_t n) { return 4 * n + 1; }

//! cuBLASLt's workspace, one per (device, stream), counted in the library's
//! device memory like any buffer: tessera::cuda::matmul_workspace_bytes()
//! (backend/cuda/blaslt.hpp, which host code cannot include). Each CUDA net
//! checks the two equal at compile time.
inline constexpr std::size_t cublaslt_bytes = std::size_t(32) << 20;

}  // namespace trainer_kit::kernels
