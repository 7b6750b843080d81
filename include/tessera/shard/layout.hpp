#pragma once
//! \file Unit layouts: tensors packed into units, each unit one flat buffer
//! padded to a multiple of world_size x alignment and split into equal,
//! contiguous shards, one per rank (what the collectives move).
//!
//! Two kinds. `flat` (fsdp, ddp): the shards are consecutive ranges of the
//! tensors packed end to end, so a tensor's piece on a rank is the
//! intersection of its range with the rank's shard and may start mid-row.
//! `rows` (fsdp2, PyTorch FSDP2's layout): every tensor is split on dim 0 into
//! world blocks of ceil(rows / world) rows (a 0-d or 1-d tensor as a vector),
//! and each shard holds one block of every tensor, so a rank's piece is whole
//! rows. The gathered buffer (rank 0's shard, rank 1's, ...) then interleaves
//! the tensors; the *compute* layout the trainer sees (tensor_slot::offset)
//! keeps each tensor contiguous, and the wrapper copies between the two.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/math.hpp"
#include "tessera/core/shape.hpp"

namespace tessera {

//! What a trainer declares about one parameter.
struct tensor_spec {
  std::string name;
  tessera::shape shape;
  bool weight_decay = true;  //!< false for biases and norms (AdamW / SGD skip decay on it)
};

//! How a unit's tensors are split over ranks (see the file comment).
enum class layout_kind { flat, rows };

//! A tensor's place in its unit's buffers.
struct tensor_slot {
  tensor_spec spec;
  std::size_t offset = 0;  //!< first element in the unit's (gathered, compute) buffer (aligned)
  std::size_t numel = 0;
  // rows layout only:
  std::size_t rows = 0;           //!< dim 0 (the element count for 0-d and 1-d tensors)
  std::size_t row_numel = 1;      //!< elements per row (0 where a trailing extent is 0)
  std::size_t rows_per_rank = 0;  //!< ceil(rows / world): rank r holds rows [r x this, ...) that exist
  std::size_t block = 0;          //!< elements of the tensor's block in every shard: rows_per_rank rows
  std::size_t shard_offset = 0;  //!< where that block starts in each shard (aligned)
};

//! The part of one tensor that one rank's shard holds: tensor elements
//! [tensor_begin, tensor_begin + count) at shard elements [shard_begin, ...).
struct piece {
  std::size_t tensor_begin = 0, shard_begin = 0, count = 0;
  [[nodiscard]] bool empty() const noexcept { return count == 0; }
};

//! The part of piece p that falls in [lo, lo + n) of its shard, relative to lo.
[[nodiscard]] inline piece clip(const piece& p, std::size_t lo, std::size_t n) noexcept {
  const std::size_t b = std::max(p.shard_begin, lo), e = std::min(p.shard_begin + p.count, lo + n);
  if (p.empty() || b >= e) return {};
  return {p.tensor_begin + (b - p.shard_begin), b - lo, e - b};
}

//! One unit: named tensors in one flat buffer, and its split over `world`
//! ranks. With `splits` > 1 every shard is padded so that it also cuts into
//! `splits` equal parts of whole alignment granules (outer<optim> splits a
//! rank's optimizer range across the replica groups of a mesh).
class unit_layout {
public:
  unit_layout(std::string name, std::vector<tensor_spec> specs, int world, std::size_t alignment,
              layout_kind kind = layout_kind::flat, std::size_t splits = 1)
      : name_(std::move(name)), world_(world), alignment_(alignment), splits_(splits), kind_(kind) {
    TESSERA_CHECK(world >= 1, "world size ", world, " for unit '", name_, "'");
    TESSERA_CHECK(alignment >= 1, "alignment 0 for unit '", name_, "'");
    TESSERA_CHECK(splits >= 1, "0 splits for unit '", name_, "'");
    std::size_t off = 0, in_shard = 0;
    for (auto& s : specs) {
      tensor_slot t{std::move(s), round_up(off, alignment), 0};
      t.numel = t.spec.shape.numel();
      off = t.offset + t.numel;
      if (kind == layout_kind::rows) {
        const auto& e = t.spec.shape.extents();
        t.rows = e.size() <= 1 ? t.numel : std::size_t(e[0]);
        t.row_numel = 1;
        for (std::size_t d = 1; d < e.size(); ++d) t.row_numel *= std::size_t(e[d]);
        t.rows_per_rank = ceil_div(t.rows, std::size_t(world));
        t.block = t.rows_per_rank * t.row_numel;
        t.shard_offset = round_up(in_shard, alignment);
        in_shard = t.shard_offset + t.block;
      }
      tensors_.push_back(std::move(t));
    }
    numel_ = off;
    if (kind == layout_kind::rows) {
      // N blocks of ceil(rows / N) rows hold every tensor, so N x shard >= the compute layout's numel.
      shard_ = round_up(std::max<std::size_t>(in_shard, 1), alignment * splits);
      padded_ = shard_ * std::size_t(world);
    } else {
      padded_ = round_up(std::max<std::size_t>(off, 1), std::size_t(world) * alignment * splits);
      shard_ = padded_ / std::size_t(world);
    }
  }

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] const std::vector<tensor_slot>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] int world() const noexcept { return world_; }
  [[nodiscard]] std::size_t alignment() const noexcept { return alignment_; }
  //! Equal parts each shard cuts into (1 but under outer<optim>).
  [[nodiscard]] std::size_t splits() const noexcept { return splits_; }
  [[nodiscard]] layout_kind kind() const noexcept { return kind_; }
  //! Whether the gathered buffer differs from the compute layout (rows over
  //! several ranks), so gathers are copied out and gradients copied in.
  [[nodiscard]] bool permuted() const noexcept { return kind_ == layout_kind::rows && world_ > 1; }
  //! Elements up to the end of the last tensor in the compute layout.
  [[nodiscard]] std::size_t numel() const noexcept { return numel_; }
  //! Flat buffer size: numel rounded up to world x alignment x splits (never 0).
  [[nodiscard]] std::size_t padded_numel() const noexcept { return padded_; }
  //! Elements per rank.
  [[nodiscard]] std::size_t shard_numel() const noexcept { return shard_; }
  //! First flat element of rank r's shard.
  [[nodiscard]] std::size_t shard_begin(int r) const noexcept { return std::size_t(r) * shard_; }

  //! Tensor t's piece on rank r.
  [[nodiscard]] piece piece_of(std::size_t t, int r) const {
    const auto& s = tensors_.at(t);
    if (kind_ == layout_kind::rows) {
      const std::size_t begin = std::size_t(r) * s.block;  // == first row x row_numel
      if (begin >= s.numel) return {};
      return {begin, s.shard_offset, std::min(s.block, s.numel - begin)};
    }
    const std::size_t lo = std::max(s.offset, shard_begin(r));
    const std::size_t hi = std::min(s.offset + s.numel, shard_begin(r) + shard_);
    if (lo >= hi) return {};
    return {lo - s.offset, lo - shard_begin(r), hi - lo};
  }
  //! Index of the tensor called name, or -1.
  [[nodiscard]] std::ptrdiff_t find(std::string_view name) const noexcept {
    for (std::size_t i = 0; i < tensors_.size(); ++i)
      if (tensors_[i].spec.name == name) return std::ptrdiff_t(i);
    return -1;
  }

private:
  std::string name_;
  std::vector<tensor_slot> tensors_;
  int world_;
  std::size_t alignment_, splits_ = 1, numel_ = 0, padded_ = 0, shard_ = 0;
  layout_kind kind_ = layout_kind::flat;
};

//! A 64-bit FNV-1a digest of the layout (names, shapes, decay flags, world),
//! used to prove that every rank registered the same model.
[[nodiscard]] inline std::uint64_t digest(const std::vector<unit_layout>& units) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, std::size_t n) {
    auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const auto& u : units) {
    mix(u.name().data(), u.name().size() + 0);
    mix("\0", 1);
    for (const auto& t : u.tensors()) {
      mix(t.spec.name.data(), t.spec.name.size());
      mix("\0", 1);
      for (auto e : t.spec.shape.extents()) mix(&e, sizeof e);
      const char d = t.spec.weight_decay;
      mix(&d, 1);
    }
    const char k = char(u.kind());
    mix(&k, 1);
    mix("\1", 1);
  }
  return h;
}

}  // namespace tessera
