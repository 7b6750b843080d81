#pragma once
//! \file The copies a rows layout (fsdp2) adds around its collectives, as
//! element functors for backend_ops<B>::for_each. An all-gather delivers the
//! shards one after the other, each holding a block of rows of every tensor;
//! `copy_out` rebuilds the compute layout from that (each tensor contiguous),
//! `copy_in` builds the shard order from the compute layout's gradients
//! before a reduce-scatter (converting to the wire type and scaling in the
//! same pass). Each walks its destination in order and writes every element,
//! padding as zero, so neither buffer needs clearing first. On the device
//! they move 8 elements per thread: a chunk that lies inside one row block
//! with both ends aligned (nearly all of a real model: row lengths are
//! multiples of 8) is one segment lookup and 16-byte loads and stores; any
//! other chunk goes element by element.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/backend/ops.hpp"
#include "tessera/core/config.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/vec.hpp"
#include "tessera/shard/layout.hpp"

namespace tessera::detail {

//! One tensor of a rows layout, as the copies see it (layout.hpp's tensor_slot fields).
struct row_segment {
  std::size_t offset = 0, numel = 0, block = 0, shard_offset = 0;
};

//! The segments of unit L, in tensor order (offsets and shard offsets ascend).
inline std::vector<row_segment> row_segments(const unit_layout& L) {
  std::vector<row_segment> v;
  for (const auto& t : L.tensors()) v.push_back({t.offset, t.numel, t.block, t.shard_offset});
  return v;
}

namespace rows {
// a / b, in 32 bits where both fit (a 64-bit division costs a GPU several times more).
TESSERA_HOST_DEVICE inline std::size_t div(std::size_t a, std::size_t b) {
  if ((a | b) >> 32 == 0) return std::uint32_t(a) / std::uint32_t(b);
  return a / b;
}
// The last segment whose field `key` is <= x (segments ascend in it); -1 if none.
template <std::size_t row_segment::*Key>
TESSERA_HOST_DEVICE inline int find(const row_segment* s, int n, std::size_t x) {
  int lo = 0, hi = n;  // answer in [lo - 1, hi)
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (s[mid].*Key <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}
}  // namespace rows

//! dst (compute layout, `padded` elements) from src (shard order): element c
//! of tensor t at row-block r = c / block comes from shard r.
template <class T>
struct copy_out {
  const T* src;
  T* dst;
  const row_segment* seg;
  int nseg;
  std::size_t shard;
  bool vector_ok = false;  //!< src and dst aligned for vector_width-wide accesses (see aligned())
  static constexpr int vector_width = 8;
  [[nodiscard]] copy_out aligned() const {
    copy_out f = *this;
    f.vector_ok = aligned_for<vector_width>(src, static_cast<const T*>(dst));
    return f;
  }
  template <int V, bool Stream = false>
  TESSERA_HOST_DEVICE void run(std::size_t c0) const {
    const int t = rows::find<&row_segment::offset>(seg, nseg, c0);
    if (t >= 0) {
      const row_segment& g = seg[t];
      const std::size_t i0 = c0 - g.offset;
      if (i0 + V <= g.numel) {  // inside the tensor: one row block, source aligned?
        const std::size_t r = rows::div(i0, g.block), d0 = i0 - r * g.block, s0 = r * shard + g.shard_offset + d0;
        if (d0 + V <= g.block && s0 % V == 0) return store_vec<V, Stream>(dst + c0, load_vec<V, Stream>(src + s0));
      } else if (i0 >= g.numel && (t + 1 == nseg || c0 + V <= seg[t + 1].offset)) {
        return store_vec<V, Stream>(dst + c0, vec<T, V>{});  // padding after the tensor
      }
    }
    for (int k = 0; k < V; ++k) (*this)(c0 + std::size_t(k));
  }
  TESSERA_HOST_DEVICE void operator()(std::size_t c) const {
    const int t = rows::find<&row_segment::offset>(seg, nseg, c);
    T v{};
    if (t >= 0 && c - seg[t].offset < seg[t].numel) {
      const std::size_t i = c - seg[t].offset, r = rows::div(i, seg[t].block);
      v = src[r * shard + seg[t].shard_offset + (i - r * seg[t].block)];
    }
    dst[c] = v;
  }
};

//! dst (shard order, `world x shard` elements, wire type) = src (compute
//! layout) converted and multiplied by s: shard r's block of tensor t holds
//! its rows [r x rows_per_rank, ...).
template <class To, class From>
struct copy_in {
  const From* src;
  To* dst;
  const row_segment* seg;
  int nseg;
  std::size_t shard;
  float s;
  bool vector_ok = false;  //!< src and dst aligned for vector_width-wide accesses (see aligned())
  static constexpr int vector_width = 8;
  [[nodiscard]] copy_in aligned() const {
    copy_in f = *this;
    f.vector_ok = aligned_for<vector_width>(src, static_cast<const To*>(dst));
    return f;
  }
  template <int V, bool Stream = false>
  TESSERA_HOST_DEVICE void run(std::size_t j0) const {
    const std::size_t r = rows::div(j0, shard), k0 = j0 - r * shard;
    if (k0 + V <= shard) {
      const int t = rows::find<&row_segment::shard_offset>(seg, nseg, k0);
      if (t >= 0) {
        const row_segment& g = seg[t];
        const std::size_t d0 = k0 - g.shard_offset, i0 = r * g.block + d0;
        if (d0 + V <= g.block && i0 + V <= g.numel && (g.offset + i0) % V == 0) {  // one row block, aligned
          const auto x = load_vec<V, Stream>(src + g.offset + i0);
          vec<To, V> y;
          for (int l = 0; l < V; ++l) y.v[l] = convert<To>(convert<float>(x.v[l]) * s);
          return store_vec<V, Stream>(dst + j0, y);
        }
        // All padding: past the block (alignment gap) or past the tensor's last
        // row, and short of the next tensor's block.
        if ((d0 >= g.block || i0 >= g.numel) && (t + 1 == nseg || k0 + V <= seg[t + 1].shard_offset))
          return store_vec<V, Stream>(dst + j0, vec<To, V>{});
      }
    }
    for (int k = 0; k < V; ++k) (*this)(j0 + std::size_t(k));
  }
  TESSERA_HOST_DEVICE void operator()(std::size_t j) const {
    const std::size_t r = rows::div(j, shard), k = j - r * shard;
    const int t = rows::find<&row_segment::shard_offset>(seg, nseg, k);
    float v = 0.0f;
    if (t >= 0 && k - seg[t].shard_offset < seg[t].block) {
      const std::size_t i = r * seg[t].block + (k - seg[t].shard_offset);
      if (i < seg[t].numel) v = convert<float>(src[seg[t].offset + i]) * s;
    }
    dst[j] = convert<To>(v);
  }
};

}  // namespace tessera::detail

namespace tessera {

//! What a wrapper needs for its rows-layout copies: every permuted unit's
//! segment table in backend memory, and the two copies over it. Public, so
//! that a benchmark times the very copies fsdp2 runs (bench/row_copy.cu).
template <class B>
class row_copies {
  using ops = backend_ops<B>;

public:
  //! Tables for the units whose layout is permuted (none where nothing is).
  void prepare(const std::vector<unit_layout>& layouts) {
    for (const auto& L : layouts) {
      const auto v = detail::row_segments(L);
      tables_.emplace_back(L.permuted() ? v.size() : 0);
      if (L.permuted() && !v.empty()) ops::copy_from_host(tables_.back().span(), std::span<const detail::row_segment>(v));
    }
  }
  //! Unit u's gathered buffer (shard order) into `out` (its compute layout), on the current stream.
  template <class T>
  void copy_out(std::size_t u, const unit_layout& L, const T* gathered, T* out) const {
    const auto& t = tables_.at(u);
    ops::for_each(L.padded_numel(), detail::copy_out<T>{gathered, out, t.data(), int(t.size()), L.shard_numel()}.aligned());
  }
  //! Unit u's gradients (compute layout) into `wire` (shard order), converted and multiplied by s.
  template <class To, class From>
  void copy_in(std::size_t u, const unit_layout& L, const From* grads, To* wire, float s) const {
    const auto& t = tables_.at(u);
    ops::for_each(L.padded_numel(),
                  detail::copy_in<To, From>{grads, wire, t.data(), int(t.size()), L.shard_numel(), s}.aligned());
  }

private:
  std::vector<typename ops::template buffer<detail::row_segment>> tables_;
};

}  // namespace tessera
