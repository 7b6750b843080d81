#pragma once
// What tessera-gpt's CUDA net holds besides the wrapper (activations,
// activation gradients, the classifier's chunk of logits, scratch), as one
// buffer list in host-only code: cuda_compute.cuh allocates it and tessera-plan
// memory counts it, so the two cannot differ.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "gpt/model.hpp"
#include "trainer_kit/buffers.hpp"
#include "trainer_kit/kernels/scratch.hpp"

namespace gpt::workspace {

//! Rows of the classifier's logits the CUDA net holds at once. 4096, not
//! fewer: the input gradient of a chunk (rows x d, summed over the 50k
//! vocabulary) has too few output tiles to fill an H200 at 1024 rows (it ran
//! at 60% of cuBLAS speed), and each chunk adds the fp32 gradient of the
//! whole tied table once. 4096 rows of GPT-2's bf16 logits are 412 MB.
inline constexpr std::size_t chunk_rows = 4096;
using trainer_kit::kernels::cublaslt_bytes;  // cuBLASLt's workspace (the kit's one figure)
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

//! --deterministic's sums in a fixed order (cuda_layernorm.cuh): LayerNorm's
//! backward runs on a fixed number of blocks (not the device's SM count, so
//! that its order is the same on any GPU), each keeping 2 d partial sums.
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
//! The products' separate bias gradients (the kit's column sums), the widest 4 d columns.
inline constexpr std::size_t products_partial_floats(int d) { return trainer_kit::kernels::column_scratch_floats(4 * d); }
using trainer_kit::kernels::token_group_ints;  // the embedding's ordered backward (the kit's)
//! The buffers cuda_gpt<C> holds at `batch` sequences per micro-batch, as one
//! list (trainer_kit/buffers.hpp): its constructor allocates exactly these and
//! tessera-plan counts exactly these. Every block's saved activations (one
//! block's with recompute), the residual stream, the backward's buffers, the
//! logits chunk, the products' scratch, each input slot's tokens (a step
//! graph's micro-batches), and what --deterministic or `flash` (flash
//! attention runs: its row dots) add; the products' kernel tuning is reserved
//! beside the block (the library allocates it for a moment in the first step).
template <class C>
struct cuda_buffers {
  trainer_kit::buffer_list list;
  trainer_kit::buffer_slot<float> x, stats, lse, xmid, big, dx, dsmall, dvec, ln_partial, resid_db, bias32, partial;
  trainer_kit::buffer_slot<C> qkv, h, xn1, y, xn2, xf, act, big_c, dx_c, dy_c, z;
  trainer_kit::buffer_slot<std::uint16_t> tok;
  trainer_kit::buffer_slot<double> loss, row_loss;
  trainer_kit::buffer_slot<int> groups;

  cuda_buffers(const model_shape& s, int batch, const net_options& o, bool flash) {
    const std::size_t n = std::size_t(batch) * std::size_t(s.seq), D = std::size_t(s.d), L = std::size_t(s.layers),
                      slots = o.recompute ? 1 : L, H = std::size_t(s.heads), rows = std::min(chunk_rows, n);
    const bool det = o.deterministic;
    auto& l = list;
    x = l.add<float>("residual stream", (L + 1) * n * D);
    stats = l.add<float>("LayerNorm statistics", slots * 4 * n + 2 * n);  // per block mean, rstd of both; the final's
    lse = l.add<float>("attention log-sum-exp", slots * n * H);
    qkv = l.add<C>("qkv", slots * 3 * n * D);
    xmid = l.add<float>("mid-block stream", slots * n * D);
    h = l.add<C>("GELU inputs", slots * 4 * n * D);
    xn1 = l.add<C>("LayerNorm 1 outputs", slots * n * D);
    y = l.add<C>("attention outputs", slots * n * D);
    xn2 = l.add<C>("LayerNorm 2 outputs", slots * n * D);
    xf = l.add<C>("final LayerNorm output", n * D);
    act = l.add<C>("GELU outputs", (o.keep_gelu ? slots : 1) * 4 * n * D);  // then dH
    big = l.add<float>("dA, dqkv", 4 * n * D);
    big_c = l.add<C>("dqkv", 3 * n * D);
    dx = l.add<float>("dx", n * D);
    dsmall = l.add<float>("dxn", n * D);
    dx_c = l.add<C>("dx", n * D);
    dy_c = l.add<C>("dy", n * D);
    z = l.add<C>("logits chunk", rows * std::size_t(s.padded_vocab()));  // then their gradient, in place
    tok = l.add<std::uint16_t>("tokens", std::size_t(o.input_slots) * 2 * n);  // per slot: inputs, then targets
    loss = l.add<double>("loss", 1);
    dvec = l.add<float>("attention row dots", flash || det ? n * H : 0);
    bias32 = l.add<float>("products' fp32 bias", products_bytes(s.d) / sizeof(float));
    partial = l.add<float>("products' column sums", products_partial_floats(s.d));
    row_loss = l.add<double>("per-row loss", det ? n : 0);
    ln_partial = l.add<float>("LayerNorm partial sums", det ? layernorm_partial_floats(s.d) : 0);
    groups = l.add<int>("token groups", det ? token_group_ints(n) : 0);
    resid_db = l.add<float>("residual column sums", det ? 0 : D);
    if (!det && sizeof(C) != sizeof(float)) l.reserve("products' kernel tuning", tuning_scratch_bytes(s));
  }
};

//! The bytes of cuda_buffers<C>: what cuda_gpt<C> holds besides the wrapper.
template <class C>
std::size_t cuda_bytes(const model_shape& s, int batch, const net_options& o, bool flash) {
  return cuda_buffers<C>(s, batch, o, flash).list.bytes();
}

}  // namespace gpt::workspace
