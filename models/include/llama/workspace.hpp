#pragma once
// What tessera-llama's CUDA net holds besides the wrapper (activations,
// activation gradients, the classifier's chunk of logits, the rotary tables,
// scratch), as one buffer list in host-only code: cuda_compute.cuh allocates
// it and tessera-plan memory counts it, so the two cannot differ.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "llama/host_compute.hpp"
#include "llama/model.hpp"
#include "trainer_kit/buffers.hpp"
#include "trainer_kit/kernels/scratch.hpp"

namespace llama::workspace {

//! Rows of the classifier's logits the CUDA net holds at once: at most 4096,
//! and at most 256 MiB of them (Llama 3's 128256 columns: 1024 rows).
inline std::size_t chunk_rows(const model_shape& s, std::size_t n) {
  const std::size_t by_bytes = (std::size_t(256) << 20) / (2 * std::size_t(s.padded_vocab()));
  return std::min({std::size_t(4096), std::max<std::size_t>(by_bytes, 64), n});
}
using trainer_kit::kernels::cublaslt_bytes;  // cuBLASLt's workspace (the kit's one figure)

//! The buffers cuda_llama<C> holds at `batch` sequences per micro-batch: every
//! block's saved activations (one block's with recompute), the residual
//! stream, the backward's buffers, the logits chunk, the rotary tables, each
//! input slot's tokens, and what --deterministic or the flash kernels add.
template <class C>
struct cuda_buffers {
  trainer_kit::buffer_list list;
  trainer_kit::buffer_slot<float> x, rstd, lse, xmid, dx, dsmall, pbig, dvec, cos, sin, colscratch;
  trainer_kit::buffer_slot<C> xn1, qkv, y, xn2, gu, xf, a, da, dgu, dx_c, dy_c, z;
  trainer_kit::buffer_slot<token> tok;
  trainer_kit::buffer_slot<double> loss, row_loss;
  trainer_kit::buffer_slot<int> groups;

  cuda_buffers(const model_shape& s, int batch, const net_options& o, bool flash) {
    const std::size_t n = std::size_t(batch) * std::size_t(s.seq), D = std::size_t(s.d), L = std::size_t(s.layers),
                      slots = o.recompute ? 1 : L, H = std::size_t(s.heads), R = std::size_t(s.qkv_dim()),
                      Q = std::size_t(s.q_dim()), F = std::size_t(s.ffn), half = std::size_t(s.head_dim() / 2);
    const bool det = o.deterministic;
    auto& l = list;
    x = l.add<float>("residual stream", (L + 1) * n * D);
    rstd = l.add<float>("norm statistics", slots * 2 * n + n);  // per block both norms' rstd; the final one's
    lse = l.add<float>("attention log-sum-exp", slots * n * H);
    xmid = l.add<float>("mid-block stream", slots * n * D);
    xn1 = l.add<C>("norm 1 outputs", slots * n * D);
    qkv = l.add<C>("qkv (rotated)", slots * n * R);
    y = l.add<C>("attention outputs", slots * n * Q);
    xn2 = l.add<C>("norm 2 outputs", slots * n * D);
    gu = l.add<C>("gate and up", slots * n * 2 * F);
    xf = l.add<C>("final norm output", n * D);
    a = l.add<C>("SwiGLU output", n * F);
    da = l.add<C>("dA", n * F);
    dgu = l.add<C>("dgate_up, dqkv", n * std::max(2 * F, R));
    dx = l.add<float>("dx", n * D);
    dsmall = l.add<float>("dxn", n * D);
    pbig = l.add<float>("norm weight terms, attention's fp32 dqkv", n * std::max(D, R));
    dx_c = l.add<C>("dx", n * D);
    dy_c = l.add<C>("dy", n * Q);
    z = l.add<C>("logits chunk", chunk_rows(s, n) * std::size_t(s.padded_vocab()));
    cos = l.add<float>("rotary cos", std::size_t(s.seq) * half);
    sin = l.add<float>("rotary sin", std::size_t(s.seq) * half);
    colscratch = l.add<float>("column sums", trainer_kit::kernels::column_scratch_floats(s.d));
    tok = l.add<token>("tokens", std::size_t(o.input_slots) * 2 * n);
    loss = l.add<double>("loss", 1);
    dvec = l.add<float>("attention row dots", flash || det ? n * H : 0);
    row_loss = l.add<double>("per-row loss", det ? n : 0);
    groups = l.add<int>("token groups", det ? trainer_kit::kernels::token_group_ints(n) : 0);
  }
};

//! The bytes of cuda_buffers<C>: what cuda_llama<C> holds besides the wrapper.
template <class C>
std::size_t cuda_bytes(const model_shape& s, int batch, const net_options& o, bool flash) {
  return cuda_buffers<C>(s, batch, o, flash).list.bytes();
}

}  // namespace llama::workspace
