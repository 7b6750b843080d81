#pragma once
//! \file ShardedTensor<T, Backend>: one tensor split over the ranks of a
//! communicator as one flat range padded to world x alignment.
#include <span>
#include <vector>

#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/shard/layout.hpp"

namespace tessera {

template <element_type T, backend_available Backend>
class ShardedTensor {
  using ops = backend_ops<Backend>;

public:
  using value_type = T;
  using backend_type = Backend;

  //! A zero-filled tensor of global shape `s` over comm's ranks. comm must outlive it.
  template <class Comm>
  ShardedTensor(Comm& comm, tessera::shape s, std::size_t alignment = 16)
      : comm_(comm), layout_("tensor", {tensor_spec{"tensor", std::move(s)}}, comm.size(), alignment),
        local_(layout_.shard_numel()) {
    ops::fill(local_.span(), T{});
  }

  [[nodiscard]] const tessera::shape& shape() const noexcept { return layout_.tensors()[0].spec.shape; }
  [[nodiscard]] std::size_t numel() const noexcept { return layout_.numel(); }
  [[nodiscard]] std::size_t padded_numel() const noexcept { return layout_.padded_numel(); }
  [[nodiscard]] int rank() const { return comm_.rank(); }
  [[nodiscard]] int world() const noexcept { return layout_.world(); }
  //! The whole local shard, padding included (shard_numel elements).
  [[nodiscard]] std::span<T> shard() noexcept { return local_.span(); }
  [[nodiscard]] std::span<const T> shard() const noexcept { return local_.span(); }
  //! Global flat index of the shard's first element.
  [[nodiscard]] std::size_t global_offset() const { return layout_.shard_begin(comm_.rank()); }
  //! The real (unpadded) elements of this rank: possibly empty.
  [[nodiscard]] std::span<T> local() noexcept { return local_.span().first(layout_.piece_of(0, comm_.rank()).count); }

  //! Every rank's shard into `full` (padded_numel elements): one all-gather, no copy.
  void gather_padded(std::span<T> full) {
    check_size(full.size(), padded_numel(), "gather_padded");
    comm_.all_gather(local_.data(), full.data(), local_.size(), dtype_of_v<T>);
  }
  //! Non-blocking gather_padded; `full` stays untouched until the request completes.
  [[nodiscard]] comm::request igather_padded(std::span<T> full) {
    check_size(full.size(), padded_numel(), "igather_padded");
    return comm_.iall_gather(local_.data(), full.data(), local_.size(), dtype_of_v<T>);
  }
  //! The full tensor into `full` (numel elements); goes through a padded temporary
  //! only when the tensor does not divide evenly.
  void gather(std::span<T> full) {
    check_size(full.size(), numel(), "gather");
    if (numel() == padded_numel()) return gather_padded(full);
    typename ops::template buffer<T> tmp(padded_numel());
    gather_padded(tmp.span());
    ops::copy(full, std::span<const T>(tmp.span().first(numel())));
  }
  //! This rank's shard = op over ranks of `full` (padded_numel elements).
  void reduce_scatter_padded(std::span<const T> full, comm::reduce_op op = comm::reduce_op::sum) {
    check_size(full.size(), padded_numel(), "reduce_scatter_padded");
    comm_.reduce_scatter(full.data(), local_.data(), local_.size(), dtype_of_v<T>, op);
  }
  [[nodiscard]] comm::request ireduce_scatter_padded(std::span<const T> full,
                                                     comm::reduce_op op = comm::reduce_op::sum) {
    check_size(full.size(), padded_numel(), "ireduce_scatter_padded");
    return comm_.ireduce_scatter(full.data(), local_.data(), local_.size(), dtype_of_v<T>, op);
  }
  //! Takes this rank's piece of a full tensor (numel elements) that every rank holds.
  void scatter_from(std::span<const T> full) {
    check_size(full.size(), numel(), "scatter_from");
    const piece p = layout_.piece_of(0, comm_.rank());
    ops::fill(local_.span(), T{});
    ops::copy(local_.span().subspan(p.shard_begin, p.count), full.subspan(p.tensor_begin, p.count));
  }

private:
  void check_size(std::size_t got, std::size_t want, const char* op) const {
    TESSERA_CHECK(got == want, "ShardedTensor::", op, ": buffer of ", got, " elements for a tensor of shape ",
                  shape().str(), " needs ", want, " (rank ", comm_.rank(), " of ", world(), ")");
  }
  comm::handle<Backend> comm_;
  unit_layout layout_;
  typename ops::template buffer<T> local_;
};

}  // namespace tessera
