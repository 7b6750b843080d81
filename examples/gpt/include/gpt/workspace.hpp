#pragma once
// What tessera-gpt's CUDA net holds besides the wrapper (activations,
// activation gradients, the classifier's chunk of logits, scratch), as plain
// arithmetic on the shape, so that host-only code (tessera-plan memory)
// counts the bytes cuda_gpt allocates. cuda_compute.cuh takes its sizes here.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "gpt/model.hpp"

namespace gpt::workspace {

//! Rows of the classifier's logits the CUDA net holds at once. 4096, not
//! fewer: the input gradient of a chunk (rows x d, summed over the 50k
//! vocabulary) has too few output tiles to fill an H200 at 1024 rows (it ran
//! at 60% of cuBLAS speed), and each chunk adds the fp32 gradient of the
//! whole tied table once. 4096 rows of GPT-2's bf16 logits are 412 MB.
inline constexpr std::size_t chunk_rows = 4096;
//! cuBLASLt's workspace, one per (device, stream) (tessera/backend/cuda/blaslt.hpp),
//! counted in the library's device memory like any buffer.
inline constexpr std::size_t cublaslt_bytes = std::size_t(32) << 20;
//! The products' kernel tuning (bf16 without --deterministic: each product
//! keeps the fastest of cuBLASLt's first candidates, timed in the first
//! step) times a weight gradient, which accumulates, on a scratch fp32 copy
//! of its result, freed at once; the library leaves untimed one over its
//! limit. The largest scratch the net's products take: an upper bound on
//! what the first step adds for a moment.
inline constexpr std::size_t matmul_tuning_limit = std::size_t(64) << 20;
inline std::size_t tuning_scratch_bytes(const model_shape& s) {
  const std::size_t D = std::size_t(s.d), V = std::size_t(s.padded_vocab());
  std::size_t most = 0;
  for (const std::size_t elems : {4 * D * D, 3 * D * D, D * D, V * D})
    if (elems * sizeof(float) <= matmul_tuning_limit) most = std::max(most, elems * sizeof(float));
  return most;
}
//! The products' fp32 bias (or bias gradient) of the widest product (cuda_products.cuh).
inline constexpr std::size_t products_bytes(int d) { return 4 * std::size_t(d) * sizeof(float); }

//! --deterministic's sums in a fixed order (cuda_ordered.cuh): a column sum
//! over n rows keeps a partial sum per 256 rows and column; LayerNorm's
//! backward runs on a fixed number of blocks (not the device's SM count, so
//! that its order is the same on any GPU), each keeping 2 d partial sums.
inline constexpr std::size_t column_sum_partial_floats(std::size_t n, std::size_t cols) { return (n + 255) / 256 * cols; }
inline constexpr int layernorm_ordered_blocks = 256;
//! The widths the ordered LayerNorm backward takes (4 columns a lane in
//! registers: d a multiple of 4, at most 2048, every GPT-2 size), and what
//! --deterministic on the GPU says otherwise (options.hpp, the CUDA net).
inline constexpr bool layernorm_ordered_fits(int d) { return d % 4 == 0 && d <= 2048; }
inline std::string layernorm_ordered_refusal(int d) {
  return "--deterministic on the GPU sums LayerNorm's gradients in a fixed order at --d a multiple of 4 up to 2048, "
         "not " + std::to_string(d);
}
inline constexpr std::size_t layernorm_partial_floats(int d) {
  return std::size_t(layernorm_ordered_blocks) * 2 * std::size_t(d);
}
//! The products' bias gradients, the widest 4 d columns.
inline constexpr std::size_t products_partial_floats(std::size_t n, int d) { return column_sum_partial_floats(n, 4 * std::size_t(d)); }
//! Ints of the token embedding's rows grouped by token (token_groups): at most 4 n + 1.
inline constexpr std::size_t token_group_ints(std::size_t n) { return 4 * n + 1; }
//! What --deterministic adds at n rows: those partial sums, each row's loss
//! (summed in order), the token groups; the attention's row dots (D) are
//! counted with flash's.
inline std::size_t deterministic_bytes(const model_shape& s, int batch) {
  const std::size_t n = std::size_t(batch) * std::size_t(s.seq);
  return sizeof(float) * (products_partial_floats(n, s.d) + layernorm_partial_floats(s.d)) + sizeof(double) * n +
         sizeof(int) * token_group_ints(n);
}

//! Device bytes of cuda_gpt<C> at `batch` sequences per micro-batch: every
//! block's saved activations (one block's with recompute), the residual
//! stream, the backward's buffers, the logits chunk; `flash`: flash attention
//! runs (its row dots, which --deterministic keeps on every attention path);
//! `input_slots`: micro-batches whose tokens are on the device at once (a step graph's);
//! `keep_gelu`: every block's GELU output kept for backward (one, shared, otherwise).
template <class C>
std::size_t cuda_bytes(const model_shape& s, int batch, bool recompute, bool flash, bool deterministic = false,
                       int input_slots = 1, bool keep_gelu = false) {
  const std::size_t n = std::size_t(batch) * std::size_t(s.seq), D = std::size_t(s.d), L = std::size_t(s.layers),
                    slots = recompute ? 1 : L, rows = std::min(chunk_rows, n), V = std::size_t(s.padded_vocab()),
                    H = std::size_t(s.heads), acts = keep_gelu ? slots : 1;
  return sizeof(float) * ((L + 1) * n * D + slots * 4 * n + 2 * n + slots * n * H + slots * n * D + 4 * n * D + 2 * n * D) +
         products_bytes(s.d) +
         sizeof(C) * (slots * 3 * n * D + slots * 4 * n * D + 3 * slots * n * D + n * D + acts * 4 * n * D + 3 * n * D + 2 * n * D +
                      rows * V) +
         sizeof(std::uint16_t) * 2 * n * std::size_t(input_slots) + sizeof(double) + (flash || deterministic ? sizeof(float) * n * H : 0) +
         (deterministic ? deterministic_bytes(s, batch) : sizeof(float) * D) +  // else the residual's column sums
         (deterministic || sizeof(C) == sizeof(float) ? 0 : tuning_scratch_bytes(s));
}

}  // namespace gpt::workspace
