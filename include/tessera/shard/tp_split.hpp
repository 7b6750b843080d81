#pragma once
//! \file How a global tensor is split over a tensor-parallel group (issue 65):
//! which of its elements one tp rank holds, in what order, and where each
//! lies in the global tensor, for the models' registration, their
//! initialisation from the global tensor's values, and checkpoints of global
//! tensors.
//!
//! A 1-D or 2-D tensor [rows, cols] (a vector: [n, 1]) is split along one
//! dimension: dim 0, the rows (a column-parallel weight's output features, a
//! vocab-parallel table, a split bias), or dim 1, the columns (a row-parallel
//! weight's input features). A packed tensor splits each of its blocks alike:
//! qkv's rows are [q | k | v], and tp rank r holds its heads of each, in that
//! order (Megatron's layout: rank r's slice is itself a packed qkv of H / tp
//! heads and KV / tp kv heads). Every block's extent must divide by tp.
//!
//!   auto s = tp::split::rows(tp, rank, {q_dim, kv_dim, kv_dim});  // a Llama qkv weight [q + 2 kv, d]
//!   model.add_param(u, "qkv", s.local({q_dim + 2 * kv_dim, d}));
//!   model.init_param(p, tp::sliced{init::normal{0.02f, seed}, s, {q_dim + 2 * kv_dim, d}});
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/random.hpp"
#include "tessera/core/shape.hpp"

namespace tessera::tp {

//! A tensor's split over tp ranks, as this rank holds it (trivially copyable:
//! sliced initializers carry it to the device).
struct split {
  static constexpr int max_blocks = 4;
  int dim = 0;  //!< 0: rows split; 1: columns split
  int tp = 1, rank = 0;
  int blocks = 1;
  std::int64_t block[max_blocks] = {};  //!< extents of the packed blocks along dim (0 for blocks == 1: the whole dim)

  //! Rows split (dim 0), in packed blocks of the given extents ({} : one block).
  [[nodiscard]] static split rows(int tp, int rank, std::initializer_list<std::int64_t> blocks = {}) {
    return make(0, tp, rank, blocks);
  }
  //! Columns split (dim 1).
  [[nodiscard]] static split cols(int tp, int rank, std::initializer_list<std::int64_t> blocks = {}) {
    return make(1, tp, rank, blocks);
  }

  //! This rank's shape of a tensor of `global` shape; a tessera: error where
  //! the blocks do not add up to the split dimension or one does not divide by tp.
  [[nodiscard]] shape local(const shape& global) const {
    check(global);
    std::vector<std::int64_t> e = global.extents();
    e[std::size_t(dim)] /= tp;
    return shape(std::move(e));
  }
  //! Where local element i (row-major in the local shape) lies in the global tensor.
  [[nodiscard]] TESSERA_HOST_DEVICE std::size_t global_index(std::int64_t rows, std::int64_t cols, std::size_t i) const {
    if (dim == 0) {
      const std::size_t c = std::size_t(cols), r = i / c;
      return std::size_t(global_along(std::int64_t(r), rows)) * c + i % c;
    }
    const std::size_t lc = std::size_t(cols / tp), r = i / lc;
    return r * std::size_t(cols) + std::size_t(global_along(std::int64_t(i % lc), cols));
  }
  //! One contiguous run of the local tensor in the global one.
  struct run {
    std::size_t global_offset, local_offset, count;
  };
  //! The local tensor as contiguous runs of the global one, in local order
  //! (what a checkpoint of global tensors writes or reads for this rank).
  [[nodiscard]] std::vector<run> runs(const shape& global) const {
    check(global);
    const auto [R, C] = extents(global);
    std::vector<run> out;
    std::size_t local = 0;
    if (dim == 0) {
      for (std::int64_t k = 0, start = 0; k < blocks; start += extent(int(k), R), ++k) {
        const std::size_t rows = std::size_t(extent(int(k), R) / tp), part = rows * std::size_t(C);
        out.push_back({(std::size_t(start) + std::size_t(rank) * rows) * std::size_t(C), local, part});
        local += part;
      }
      return out;
    }
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t k = 0, start = 0; k < blocks; start += extent(int(k), C), ++k) {
        const std::size_t part = std::size_t(extent(int(k), C) / tp);
        out.push_back({std::size_t(r) * std::size_t(C) + std::size_t(start) + std::size_t(rank) * part, local, part});
        local += part;
      }
    return out;
  }
  //! A tensor's [rows, cols]: a vector is [n, 1].
  [[nodiscard]] static std::pair<std::int64_t, std::int64_t> extents(const shape& s) {
    return {s.rank() == 0 ? 1 : s[0], s.rank() == 2 ? s[1] : 1};
  }

private:
  static split make(int dim, int tp, int rank, std::initializer_list<std::int64_t> b) {
    TESSERA_CHECK(tp >= 1 && rank >= 0 && rank < tp, "tp::split: rank ", rank, " of a tensor-parallel group of ", tp);
    TESSERA_CHECK(b.size() <= std::size_t(max_blocks), "tp::split: ", b.size(), " packed blocks; at most ", max_blocks);
    split s;
    s.dim = dim, s.tp = tp, s.rank = rank, s.blocks = b.size() == 0 ? 1 : int(b.size());
    int k = 0;
    for (std::int64_t e : b) s.block[k++] = e;
    return s;
  }
  // Block k's extent along a dimension of n.
  [[nodiscard]] TESSERA_HOST_DEVICE std::int64_t extent(int k, std::int64_t n) const {
    return blocks == 1 && block[0] == 0 ? n : block[k];
  }
  // The global position of local position p along the split dimension (of global extent n).
  [[nodiscard]] TESSERA_HOST_DEVICE std::int64_t global_along(std::int64_t p, std::int64_t n) const {
    std::int64_t start = 0;
    for (int k = 0; k < blocks; ++k) {
      const std::int64_t part = extent(k, n) / tp;
      if (p < part) return start + std::int64_t(rank) * part + p;
      p -= part, start += extent(k, n);
    }
    return -1;  // past the local extent (check() rules it out)
  }
  void check(const shape& global) const {
    TESSERA_CHECK(global.rank() >= 1 && global.rank() <= 2 && (dim == 0 || global.rank() == 2),
                  "tp::split: a tensor of rank ", global.rank(), " split along dimension ", dim,
                  " (1-D tensors split their rows, 2-D ones rows or columns)");
    const std::int64_t n = global[std::size_t(dim)];
    std::int64_t sum = 0;
    for (int k = 0; k < blocks; ++k) {
      const std::int64_t e = extent(k, n);
      TESSERA_CHECK(e >= 0 && e % tp == 0, "tp::split: a block of ", e, " along dimension ", dim,
                    " does not divide over ", tp, " tensor-parallel ranks (heads, kv heads, the MLP's width and the "
                    "padded vocabulary must divide by tp)");
      sum += e;
    }
    TESSERA_CHECK(sum == n, "tp::split: packed blocks of ", sum, " along dimension ", dim, " of a tensor ", n, " long");
  }
};

//! An initializer of a tp slice: local element i takes the value the global
//! tensor's initializer gives its global index, so every tp size initialises
//! the same global tensor (and tp 1 is the unsplit model).
template <initializer I>
struct sliced {
  static constexpr bool on_device = device_initializer<I>;
  I init;
  split s;
  std::int64_t rows = 1, cols = 1;
  sliced(I i, split sp, const shape& global) : init(i), s(sp) {
    (void)s.local(global);  // the split's checks
    const auto [R, C] = split::extents(global);
    rows = R, cols = C;
  }
  [[nodiscard]] TESSERA_HOST_DEVICE float value(std::uint64_t key, std::size_t i) const
    requires device_initializer<I> { return init.value(key, s.global_index(rows, cols, i)); }
  [[nodiscard]] float value(std::uint64_t key, std::size_t i) const
    requires(!device_initializer<I>) { return init.value(key, s.global_index(rows, cols, i)); }
  //! The global initializer's digest and this rank's split (set_param_digest
  //! compares it over the data-parallel ranks, which share a tp rank).
  [[nodiscard]] std::uint64_t digest() const noexcept {
    std::uint64_t d = splitmix64(init::initializer_digest(init) ^ 0x7470u);
    for (std::int64_t v : {std::int64_t(s.dim), std::int64_t(s.tp), std::int64_t(s.rank), std::int64_t(s.blocks), s.block[0],
                           s.block[1], s.block[2], s.block[3], rows, cols})
      d = splitmix64(d ^ std::uint64_t(v));
    return d;
  }
};

}  // namespace tessera::tp
