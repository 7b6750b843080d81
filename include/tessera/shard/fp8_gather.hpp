#pragma once
//! \file fp8_gather<F, Backend>: a tensor's shards gathered in fp8, half the
//! bytes of bf16 on the wire (torchao's and Megatron FSDP's fp8 weight gather).
//!
//! Each gather: every rank takes the largest magnitude of its shard, one
//! all-reduce (max) of that one value agrees the tensor's amax over the group,
//! each rank computes the same scale from it (fp8_scaling.hpp, under the
//! chosen recipe), casts its shard into its block of the output, and one
//! in-place all-gather of the fp8 codes fills the rest. Because every rank
//! casts with the agreed scale, the gathered codes equal, bit for bit, what
//! casting the gathered full-precision tensor with that scale gives
//! (tests/test_fp8.cpp holds them to it at 1-4 ranks on shapes that do not
//! divide). The padding of a flat shard is zero, so it does not move the amax.
//!
//! A shard that is not finite (the optimizer's non-finite skip should have
//! kept it from being published) has an infinite amax: the scale stays what it
//! was and the cast saturates, so the codes stay finite and the caller's own
//! checks of the weights see the problem.
#include <cstddef>
#include <span>

#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/comm/label.hpp"
#include "tessera/core/fp8_scaling.hpp"

namespace tessera {

namespace detail {
//! y[i] = fp8(x[i] * scale[0]).
template <fp8_format F, class T>
struct fp8_cast_fn {
  const T* x;
  F* y;
  const float* scale;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const { y[i] = fp8::cast<F>(x[i], *scale); }
};
}  // namespace detail

template <fp8_format F, backend_available Backend>
class fp8_gather {
  using ops = backend_ops<Backend>;

public:
  using format = F;
  using backend_type = Backend;

  //! Gathers of shards of `shard_numel` elements over comm's ranks; comm must outlive it.
  template <class Comm>
  fp8_gather(Comm& comm, std::size_t shard_numel, fp8::scaling s = {})
      : comm_(comm), opt_(checked(s)), shard_numel_(shard_numel), full_(shard_numel * std::size_t(comm.size())),
        amax_(1), scale_(2), history_(std::size_t(opt_.kind == fp8::recipe::delayed ? opt_.history : 0)) {
    ops::fill(scale_.span(), 1.0f);
    ops::fill(history_.span(), 0.0f);
  }

  //! Casts this rank's shard (shard_numel elements of T) with the agreed scale
  //! and gathers every rank's codes into full(). Collective over the group.
  template <floating_element T>
  void gather(std::span<const T> shard) {
    TESSERA_CHECK(shard.size() == shard_numel_, "fp8_gather: a shard of ", shard.size(),
                  " elements where the gather was built for ", shard_numel_, " (rank ", comm_.rank(), " of ",
                  comm_.size(), ")");
    comm::label l("fp8_gather");
    ops::fill(amax_.span(), 0.0);
    ops::max_abs_into(shard, amax_.data());
    comm_.all_reduce(amax_.data(), amax_.data(), 1, dtype::f64, comm::reduce_op::max);
    ops::for_each(1, fp8::scale_update<F, double>{amax_.data(), scale_.data(), history_.data(), opt_.history, steps_,
                                                  opt_.kind, opt_.margin});
    F* mine = full_.data() + std::size_t(comm_.rank()) * shard_numel_;
    ops::for_each(shard_numel_, detail::fp8_cast_fn<F, T>{shard.data(), mine, scale_.data()});
    comm_.all_gather(mine, full_.data(), shard_numel_, dtype_of_v<F>);
    ++steps_;
  }

  //! Every rank's codes, in rank order (world x shard_numel, backend memory).
  [[nodiscard]] std::span<const F> full() const noexcept { return full_.span(); }
  //! Backend memory: [0] the scale the last gather cast with, [1] its inverse.
  [[nodiscard]] const float* scale() const noexcept { return scale_.data(); }
  //! Backend memory: the amax the last gather agreed on.
  [[nodiscard]] const double* amax() const noexcept { return amax_.data(); }
  [[nodiscard]] std::size_t steps() const noexcept { return steps_; }
  [[nodiscard]] const fp8::scaling& scaling() const noexcept { return opt_; }
  //! Bytes each rank receives per gather (the wire's share; bf16 would be twice).
  [[nodiscard]] std::size_t bytes_gathered() const noexcept { return full_.size() - shard_numel_; }

private:
  // Before any buffer is sized from them (a negative history would ask for 2^64 floats).
  static fp8::scaling checked(const fp8::scaling& s) {
    s.check();
    return s;
  }
  comm::handle<Backend> comm_;
  fp8::scaling opt_;
  std::size_t shard_numel_;
  typename ops::template buffer<F> full_;
  typename ops::template buffer<double> amax_;
  typename ops::template buffer<float> scale_;
  typename ops::template buffer<float> history_;
  std::size_t steps_ = 0;
};

}  // namespace tessera
