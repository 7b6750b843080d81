#pragma once
// What the reference model's CUDA compute holds besides the wrapper: its
// activation arena, gradients of activations, scratch and staged inputs, as
// plain arithmetic on the model's shape, so that host-only code (tessera-plan)
// counts the same bytes cuda_mlp allocates. cuda_compute.cuh and
// the kernel kit take their sizes from here.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "mlp_lm/model.hpp"
#include "trainer_kit/buffers.hpp"
#include "trainer_kit/kernels/scratch.hpp"

namespace mlp_lm::workspace {

using trainer_kit::kernels::column_scratch_floats;  // the kit's column sums' scratch
//! Offsets in multiples of 8 elements keep every matrix 16-byte aligned.
constexpr std::size_t round8(std::size_t n) { return (n + 7) / 8 * 8; }
constexpr std::size_t round4(std::size_t b) { return (b + 3) / 4 * 4; }
//! One block's region of the arena: its GELU input, then its output stream.
inline std::size_t block_stride(const model_shape& s, std::size_t n) {
  return round8(n * std::size_t(s.hidden())) + round8(n * std::size_t(s.d));
}
//! Scratch for column sums and bias gradients: the widest is the hidden
//! layer's (db1 over 4d columns); it also holds the one-hot GEMM's [vocab, e] output.
inline std::size_t scratch_floats(const model_shape& s) {
  return std::max(column_scratch_floats(std::max({s.d, s.hidden(), vocab})), std::size_t(vocab) * std::size_t(s.e()));
}
//! One micro-batch's staged inputs: context bytes, targets, the (token,
//! position) rows grouped by byte for the embedding gradient, the group starts.
inline std::size_t input_bytes(const model_shape& s, std::size_t n) {
  const std::size_t rows = n * std::size_t(s.ctx);
  return round4(rows) + round4(n) + rows * sizeof(int) + (vocab + 1) * sizeof(int);
}
//! The buffers cuda_mlp<C> holds for micro-batches of up to n tokens, as one
//! list (trainer_kit/buffers.hpp): what its constructor allocates and what
//! tessera-plan counts. The arena (X0, then each block's GELU input and
//! output), the kept GELU outputs (none when recomputed), logits, dX, dH, a
//! bias gradient, the one-hot matrix, scratch, the loss and the staged inputs.
template <class C>
struct cuda_buffers {
  trainer_kit::buffer_list list;
  trainer_kit::buffer_slot<C> arena, act, z, dx, dh, bgrad, one_hot;
  trainer_kit::buffer_slot<float> scratch;
  trainer_kit::buffer_slot<unsigned long long> loss;
  trainer_kit::buffer_slot<std::byte> inputs;
  cuda_buffers(const model_shape& s, std::size_t n, const net_options& o) {
    const std::size_t D = std::size_t(s.d), H = std::size_t(s.hidden()), L = std::size_t(s.layers);
    arena = list.add<C>("activation arena", round8(n * D) + L * block_stride(s, n));
    act = list.add<C>("GELU outputs", o.recompute_gelu ? 0 : L * n * H);
    z = list.add<C>("logits", n * vocab);
    dx = list.add<C>("dX", n * D);
    dh = list.add<C>("dH", n * H);
    bgrad = list.add<C>("bias gradient", H);
    scratch = list.add<float>("column sums, one-hot product", scratch_floats(s));
    loss = list.add<unsigned long long>("loss", 1);
    one_hot = list.add<C>("one-hot rows", n * std::size_t(s.ctx) * vocab);
    inputs = list.add<std::byte>("staged inputs", std::size_t(o.input_slots) * input_bytes(s, n));
  }
};
//! The bytes of cuda_buffers<C>: what cuda_mlp<C> holds besides the wrapper.
template <class C>
std::size_t cuda_bytes(const model_shape& s, std::size_t n, const net_options& o) {
  return cuda_buffers<C>(s, n, o).list.bytes();
}

//! Where cuda_mlp::lend_grad_shards lends each unit's gradient shard, in
//! compute-dtype elements of micro-batches of up to n tokens: the
//! embedding's output X(0), a block's arena region (GELU input and output
//! stream), the head's logits. A unit whose shard needs more gets a buffer of
//! its own.
struct lend_regions {
  std::size_t embed, block, head;
};
inline lend_regions lend_capacity(const model_shape& s, std::size_t n) {
  return {n * std::size_t(s.d), block_stride(s, n), n * std::size_t(vocab)};
}

using trainer_kit::kernels::cublaslt_bytes;  // cuBLASLt's workspace (the kit's one figure)

}  // namespace mlp_lm::workspace
