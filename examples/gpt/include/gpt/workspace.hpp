#pragma once
// What tessera-gpt's CUDA net holds besides the wrapper (activations,
// activation gradients, the classifier's chunk of logits, scratch), as plain
// arithmetic on the shape, so that host-only code (tessera-plan memory)
// counts the bytes cuda_gpt allocates. cuda_compute.cuh takes its sizes here.
#include <algorithm>
#include <cstddef>
#include <cstdint>

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
//! The products' fp32 bias (or bias gradient) of the widest product (cuda_products.cuh).
inline constexpr std::size_t products_bytes(int d) { return 4 * std::size_t(d) * sizeof(float); }

//! Device bytes of cuda_gpt<C> at `batch` sequences per micro-batch: every
//! block's saved activations (one block's with recompute), the residual
//! stream, the backward's buffers, the logits chunk; `flash`: flash attention
//! runs (its row dots).
template <class C>
std::size_t cuda_bytes(const model_shape& s, int batch, bool recompute, bool flash) {
  const std::size_t n = std::size_t(batch) * std::size_t(s.seq), D = std::size_t(s.d), L = std::size_t(s.layers),
                    slots = recompute ? 1 : L, rows = std::min(chunk_rows, n), V = std::size_t(s.padded_vocab()),
                    H = std::size_t(s.heads);
  return sizeof(float) * ((L + 1) * n * D + slots * 4 * n + 2 * n + slots * n * H + slots * n * D + 4 * n * D + 2 * n * D) +
         products_bytes(s.d) +
         sizeof(C) * (slots * 3 * n * D + slots * 4 * n * D + 3 * slots * n * D + n * D + 4 * n * D + 3 * n * D + 2 * n * D +
                      rows * V) +
         sizeof(std::uint16_t) * 2 * n + sizeof(double) + (flash ? sizeof(float) * n * H : 0);
}

}  // namespace gpt::workspace
