#pragma once
// Tensor parallelism's building blocks on the host, over one tensor-parallel
// group (comm::make_tp_groups): Megatron's layout of a transformer's
// products and its vocab-parallel table and loss, in fp32.
//  - column-parallel product: W's rows (the output features) split; the
//    forward needs nothing of the others, the backward sums dx over the group.
//  - row-parallel product: W's columns (the input features) split, the input
//    arriving split the same way; the forward sums y over the group.
//  - vocab-parallel embedding and cross-entropy: the table's rows split; a
//    token's row is looked up where it lives and summed in; the loss's max,
//    its sum of exponentials and the target's logit are reduced over the
//    group, so no rank holds a whole row of logits.
// A tensor-parallel block (qkv and fc column-parallel, the projections
// row-parallel) needs two sums a direction. Every rank of a group returns the
// same values; they equal the one-rank computation within fp32's rounding of
// the sums' order.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "tessera/backend/host/blas.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/core/error.hpp"

namespace trainer_kit::host_tp {

//! One rank's part of a dimension: [first, first + count).
struct part {
  std::size_t first = 0, count = 0;
  [[nodiscard]] bool holds(std::size_t i) const noexcept { return i >= first && i < first + count; }
};
//! Rank `rank`'s part of `n` split over `tp` ranks; tp must divide n (`what`
//! names the dimension in the error: "--heads", "the padded vocabulary", ...).
inline part part_of(std::size_t n, int tp, int rank, std::string_view what) {
  TESSERA_CHECK(tp >= 1 && n % std::size_t(tp) == 0, "tensor parallelism over ", tp, " ranks: ", what, " (", n,
                ") does not split evenly; give a tensor-parallel size that divides it");
  const std::size_t c = n / std::size_t(tp);
  return {c * std::size_t(rank), c};
}

//! Column-parallel backward: dW_local += dy_local^T x and dx = the sum over
//! the group of dy_local W_local (x [n, in], W_local [out_local, in]).
template <class Comm>
void column_backward(Comm& tp, const float* dy_local, const float* x, const float* W_local, float* dW_local, float* dx,
                     std::size_t n, std::size_t in, std::size_t out_local) {
  using tessera::host::gemm;
  gemm(true, false, int(out_local), int(in), int(n), 1.0f, dy_local, x, 1.0f, dW_local);
  gemm(false, false, int(n), int(in), int(out_local), 1.0f, dy_local, W_local, 0.0f, dx);
  tessera::comm::all_reduce(tp, std::span<float>(dx, n * in));
}

//! Row-parallel forward: y = the sum over the group of x_local W_local^T,
//! plus beta y (a residual added once: group rank 0 carries it into the sum).
template <class Comm>
void row_forward(Comm& tp, const float* x_local, const float* W_local, float* y, std::size_t n, std::size_t in_local,
                 std::size_t out, float beta) {
  tessera::host::gemm(false, true, int(n), int(out), int(in_local), 1.0f, x_local, W_local, tp.rank() == 0 ? beta : 0.0f, y);
  tessera::comm::all_reduce(tp, std::span<float>(y, n * out));
}
//! Row-parallel backward (no sum): dW_local += dy^T x_local, dx_local = dy W_local.
inline void row_backward(const float* dy, const float* x_local, const float* W_local, float* dW_local, float* dx_local,
                         std::size_t n, std::size_t in_local, std::size_t out) {
  using tessera::host::gemm;
  gemm(true, false, int(out), int(in_local), int(n), 1.0f, dy, x_local, 1.0f, dW_local);
  gemm(false, false, int(n), int(in_local), int(out), 1.0f, dy, W_local, 0.0f, dx_local);
}

//! Vocab-parallel lookup: out (n x d) = the rows of `tokens` from a table
//! whose rows `rows` this rank holds (table_local), each row from the rank
//! that holds it, summed over the group.
template <class Comm, class Token>
void embedding_forward(Comm& tp, const float* table_local, part rows, const Token* tokens, std::size_t n, std::size_t d,
                       float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t t = std::size_t(tokens[i]);
    float* o = out + i * d;
    if (rows.holds(t)) std::copy_n(table_local + (t - rows.first) * d, d, o);
    else std::fill_n(o, d, 0.0f);
  }
  tessera::comm::all_reduce(tp, std::span<float>(out, n * d));
}
//! Its backward: the local table's rows gather dout of their tokens (no sum).
template <class Token>
void embedding_backward(const float* dout, part rows, const Token* tokens, std::size_t n, std::size_t d,
                        float* dtable_local) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t t = std::size_t(tokens[i]);
    if (!rows.holds(t)) continue;
    float* g = dtable_local + (t - rows.first) * d;
    for (std::size_t c = 0; c < d; ++c) g[c] += dout[i * d + c];
  }
}

//! Softmax cross-entropy of `n` rows whose logits are split over the group by
//! column: z_local (n x cols.count) holds this rank's columns; columns at or
//! past `vocab` (a padded table's rows) take no part. In place, z_local
//! becomes d loss / d z x scale (this rank's columns; 0 on padding). Returns
//! the summed loss, the same on every rank; host::cross_entropy's arithmetic
//! (sums in double) with its three reductions over the group.
template <class Comm, class Target>
double cross_entropy(Comm& tp, float* z_local, part cols, std::size_t vocab, const Target* targets, std::size_t n,
                     float scale) {
  const std::size_t w = cols.count, live = cols.first >= vocab ? 0 : std::min(w, vocab - cols.first);
  std::vector<float> mx(n, -INFINITY);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t c = 0; c < live; ++c) mx[i] = std::max(mx[i], z_local[i * w + c]);
  tessera::comm::all_reduce(tp, std::span<float>(mx), tessera::comm::reduce_op::max);
  std::vector<double> sums(2 * n, 0.0);  // [sum of exponentials | the target's logit]
  for (std::size_t i = 0; i < n; ++i) {
    const float* r = z_local + i * w;
    for (std::size_t c = 0; c < live; ++c) sums[i] += std::exp(double(r[c] - mx[i]));
    const std::size_t t = std::size_t(targets[i]);
    if (cols.holds(t) && t < vocab) sums[n + i] = double(r[t - cols.first]);
  }
  tessera::comm::all_reduce(tp, std::span<double>(sums));
  double loss = 0;
  for (std::size_t i = 0; i < n; ++i) {
    loss += std::log(sums[i]) + mx[i] - float(sums[n + i]);
    float* r = z_local + i * w;
    for (std::size_t c = 0; c < w; ++c)
      r[c] = c < live ? float(std::exp(double(r[c] - mx[i])) / sums[i]) * scale : 0.0f;
    const std::size_t t = std::size_t(targets[i]);
    if (cols.holds(t) && t < vocab) r[t - cols.first] -= scale;
  }
  return loss;
}

}  // namespace trainer_kit::host_tp
