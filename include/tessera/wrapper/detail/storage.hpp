#pragma once
//! \file What a config stores per unit and rank, and how many bytes: the
//! rules the engine allocates by and the memory plan reports, in one place so
//! the two cannot drift apart.
//!
//! Vocabulary, per unit and rank:
//! - compute weights (C): the full padded unit when parameters are replicated,
//!   the rank's shard under optim_grads_params (gathered into a pool slot on use);
//! - optimizer range: what this rank's optimizer updates. The full padded unit
//!   for no_shard (every rank updates identically), the rank's shard otherwise,
//!   and under outer<optim> on a mesh one of the shard's L.splits() equal
//!   parts: part j for the rank of replica group j;
//! - main weights (M) over the optimizer range. When M == C they alias the
//!   compute weights, so full_precision holds each weight once;
//! - gradients (G): a persistent full buffer for no_shard and optim (they
//!   accumulate micro-batches locally and communicate once), reduction-pool
//!   slots for optim_grads and optim_grads_params, which reduce-scatter every
//!   micro-batch and accumulate into a persistent shard.
#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/policy/config.hpp"
#include "tessera/shard/layout.hpp"
#include "tessera/shard/row_copy.hpp"
#include "tessera/wrapper/detail/exact_sum.hpp"
#include "tessera/wrapper/options.hpp"

namespace tessera::detail {

//! Which units wrapper_options::offload_optimizer moves to host memory: whole
//! units from the last backwards until at least `fraction` of all padded
//! elements are offloaded (the same on every rank: padded sizes are).
inline std::vector<bool> offloaded_units(const std::vector<unit_layout>& units, double fraction) {
  std::vector<bool> out(units.size(), false);
  if (!(fraction > 0)) return out;
  std::size_t total = 0, moved = 0;
  for (auto& u : units) total += u.padded_numel();
  const double want = std::min(fraction, 1.0) * double(total);
  for (std::size_t i = units.size(); i-- > 0 && double(moved) < want;) {
    out[i] = true;
    moved += units[i].padded_numel();
  }
  return out;
}

template <config_type Cfg>
struct storage {
  using strategy = typename Cfg::strategy;
  using C = typename Cfg::compute_type;
  using M = typename Cfg::main_type;
  using G = typename Cfg::grad_type;
  using W = typename Cfg::wire_type;
  static constexpr bool main_aliases_compute = std::is_same_v<C, M>;
  static constexpr bool wire_is_grad = std::is_same_v<W, G>;
  static constexpr bool persistent_full_grads = !strategy::shards_grads;
  static constexpr bool exact = Cfg::reduction::exact;

  //! One rank and gradients already in the wire type: nothing to communicate,
  //! so the shard is the whole unit and gather / reduce become views.
  static constexpr bool solo(int world) noexcept { return world == 1 && wire_is_grad; }

  //! [first element, count) of rank r's optimizer range in unit L (part
  //! `part` of its shard where the layout splits shards: outer<optim>).
  static std::pair<std::size_t, std::size_t> opt_range(const unit_layout& L, int r, int part = 0) noexcept {
    if constexpr (strategy::shards_optimizer) {
      const std::size_t n = L.shard_numel() / L.splits();
      return {L.shard_begin(r) + std::size_t(part) * n, n};
    } else {
      return {0, L.padded_numel()};
    }
  }
  //! Where rank r's optimizer range starts in the compute weights it holds:
  //! its shard under optim_grads_params, the whole unit otherwise.
  static std::size_t range_in_weights(const unit_layout& L, int r, int part = 0) noexcept {
    const std::size_t lo = opt_range(L, r, part).first;
    return strategy::shards_params ? lo - L.shard_begin(r) : lo;
  }

  //! Tensor t's part of rank r's optimizer range: tensor elements
  //! [tensor_begin, +count) at range elements [shard_begin, +count). The rank's
  //! piece where the optimizer is sharded, the whole tensor at its offset under
  //! no_shard (the range is the whole unit then).
  static piece range_piece(const unit_layout& L, std::size_t t, int r, int part = 0) {
    if constexpr (strategy::shards_optimizer) {
      const std::size_t n = L.shard_numel() / L.splits();
      return clip(L.piece_of(t, r), std::size_t(part) * n, n);
    } else {
      const auto& s = L.tensors().at(t);
      return s.numel ? piece{0, s.offset, s.numel} : piece{};
    }
  }

  //! Whether a reduction needs its own wire buffer: to convert gradients to
  //! the wire type, or to copy them into the gathered order (rows layout).
  static bool needs_wire(bool permuted) noexcept { return !wire_is_grad || permuted; }

  //! exact_reduction's accumulator of each unit, in gradients: the full unit
  //! where gradients accumulate locally (no_shard, optim, one rank), the
  //! shard where every micro-batch is reduce-scattered.
  static std::vector<std::size_t> exact_sizes(const std::vector<unit_layout>& units, int world) {
    std::vector<std::size_t> n;
    for (const auto& u : units) n.push_back(persistent_full_grads || solo(world) ? u.padded_numel() : u.shard_numel());
    return n;
  }
  //! ... and on a mesh under outer<optim>, the replica's part of each shard
  //! (what the reduce-scatter across replicas leaves here), else 0.
  static std::vector<std::size_t> exact_part_sizes(const std::vector<unit_layout>& units) {
    std::vector<std::size_t> n;
    for (const auto& u : units) n.push_back(u.splits() > 1 ? u.shard_numel() / u.splits() : 0);
    return n;
  }

  //! Bytes of one reduction-pool slot for units of `padded` elements.
  static std::size_t slot_bytes(std::size_t padded, std::size_t shard, bool permuted) noexcept {
    std::size_t b = 0;
    if (strategy::shards_grads) b += padded * sizeof(G);
    if (needs_wire(permuted)) b += padded * sizeof(W);
    if (strategy::shards_optimizer && !wire_is_grad) b += shard * sizeof(W);  // staging for the conversion back
    constexpr std::size_t limb_bytes = fixed::limbs_per_element * sizeof(std::int64_t);  // per element
    if (exact && strategy::shards_grads) b += padded * limb_bytes;     // the unit's limbs
    if (exact && strategy::shards_optimizer) b += shard * limb_bytes;  // the reduced shard's
    return b;
  }

  //! What one rank will hold, from the layouts alone.
  static memory_plan plan(const std::vector<unit_layout>& units, int world, const wrapper_options& o) {
    memory_plan p;
    std::size_t max_padded = 0;
    const bool alone = solo(world);
    const bool permuted = !units.empty() && units.front().permuted();
    const std::vector<bool> offloaded = offloaded_units(units, o.offload_optimizer);
    for (std::size_t i = 0; i < units.size(); ++i) {
      const unit_layout& u = units[i];
      const std::size_t full = u.padded_numel(), shard = u.shard_numel();
      const std::size_t opt_n = strategy::shards_optimizer ? shard / u.splits() : full;
      max_padded = std::max(max_padded, full);
      p.compute_weights += (strategy::shards_params ? shard : full) * sizeof(C);
      if (!main_aliases_compute) (offloaded[i] ? p.host_main_weights : p.main_weights) += opt_n * sizeof(M);
      if (persistent_full_grads || alone) p.grads += full * sizeof(G);
      if (strategy::shards_optimizer && !alone && !o.lend_grad_shards) p.grads += shard * sizeof(G);
      if (u.splits() > 1) p.grads += opt_n * sizeof(G);  // outer<optim>: the part reduce-scattered across replicas
    }
    if constexpr (exact) {
      std::size_t n = 0;
      for (std::size_t k : exact_sizes(units, world)) n += k;
      for (std::size_t k : exact_part_sizes(units)) n += k;
      p.grads += exact_sums<G, typename Cfg::backend_type>::bytes(n, units.size());
    }
    if (alone) return p;  // no gather or reduction buffers: nothing is communicated
    // A rows layout gathers into a buffer in shard order and copies out into
    // one in the compute layout, by a table of every unit's tensors.
    if (strategy::shards_params)
      p.gathered_buffers = std::size_t(o.gather_buffers) * max_padded * sizeof(C) * (permuted ? 2 : 1);
    if (permuted)
      for (auto& u : units) p.gathered_buffers += u.tensors().size() * sizeof(row_segment);
    p.reduction_buffers = std::size_t(o.grad_buffers) * slot_bytes(max_padded, max_padded / std::size_t(world), permuted);
    return p;
  }
};

}  // namespace tessera::detail
