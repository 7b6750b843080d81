#pragma once
//! \file Parts of one unit's update kernel that ShardedOptimizer assembles:
//! the guard that turns an algorithm's functor into nothing on a step the
//! device decided to skip, and the weight-decay mask of a unit's optimizer
//! range (a bit per alignment granule, cleared where a tensor without weight
//! decay lies).
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/core/config.hpp"
#include "tessera/shard/layout.hpp"

namespace tessera {
namespace detail {

// An algorithm's update functor that does nothing where the device decided
// to skip the step (one cached load per element or vector chunk).
template <class F, bool Vector = requires { F::vector_width; }>
struct unless_skipped {
  F f;
  const int* skip;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const {
    if (!*skip) f(i);
  }
};
template <class F>
struct unless_skipped<F, true> {
  F f;
  const int* skip;
  bool vector_ok = f.vector_ok;
  static constexpr int vector_width = F::vector_width;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const {
    if (!*skip) f(i);
  }
  template <int V, bool Stream = false>
  TESSERA_HOST_DEVICE void run(std::size_t base) const {
    if (!*skip) f.template run<V, Stream>(base);
  }
};

// The weight-decay mask of one unit's optimizer range of n elements: a bit
// per granule of the layout's alignment (a power of two; else per element),
// cleared where a tensor without weight decay lies (piece_of(t): tensor t's
// part of the range); empty when every tensor decays. `shift` receives log2
// of the granule.
template <class PieceOf>
std::vector<std::uint32_t> decay_mask_bits(const unit_layout& L, std::size_t n, PieceOf piece_of, unsigned& shift) {
  const std::size_t A = L.alignment();
  shift = (A & (A - 1)) == 0 ? unsigned(std::countr_zero(A)) : 0u;
  const std::size_t granules = (n + (std::size_t(1) << shift) - 1) >> shift;
  std::vector<std::uint32_t> bits((granules + 31) / 32, ~0u);
  bool any_exempt = false;
  for (std::size_t t = 0; t < L.tensors().size(); ++t) {
    const piece p = piece_of(t);  // range-relative
    if (p.empty() || L.tensors()[t].spec.weight_decay) continue;
    any_exempt = true;
    for (std::size_t gi = p.shard_begin >> shift; gi <= (p.shard_begin + p.count - 1) >> shift; ++gi)
      bits[gi >> 5] &= ~(1u << (gi & 31));
  }
  if (!any_exempt) bits.clear();
  return bits;
}

}  // namespace detail

}  // namespace tessera
