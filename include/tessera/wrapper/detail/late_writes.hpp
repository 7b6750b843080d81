#pragma once
//! \file late_writes: wrapper_options::poison_released for gradients that stay
//! in full on every rank (no_shard and optim, and any strategy at one rank).
//!
//! There the unit's gradient buffer outlives its reduction: a write through a
//! span kept past reduce_grads is not caught by the reduction slots' NaN
//! poisoning (reduction_pool.hpp), which only sharded gradients pass through.
//! Such a write is half-applied (no_shard: on this rank only, after the
//! all-reduce) or dropped (optim: after the reduce-scatter read the buffer).
//! This remembers a checksum of the unit's gradients once they are final:
//! when sent, where the reduction's landing leaves the buffer alone (optim, an
//! exact sum, one rank), or when the landing has written them (no_shard). A
//! landing that finds them changed since sent, and finish_grad_sync finding
//! them changed since either point, is the misuse. Meshes are not covered:
//! the replicas' reduction lands in the same buffer later.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tessera/backend/ops.hpp"
#include "tessera/core/checksum.hpp"

namespace tessera::detail {

//! checksum64 of a span in backend memory (copied to the host first).
template <class B, class T>
std::uint64_t backend_checksum(std::span<const T> x) {
  std::vector<T> host(x.size());
  backend_ops<B>::copy_to_host(std::span<T>(host), x);
  return checksum64::of(host.data(), host.size() * sizeof(T));
}

template <class G, class B>
class late_writes {
public:
  void resize(std::size_t units) { units_.assign(units, {}); }

  //! Unit u's gradients are final now and nothing of the library writes them
  //! again this step: remember them.
  void sent(std::size_t u, std::span<const G> g) { units_[u] = {state::sent, backend_checksum<B>(g)}; }
  //! Unit u's gradients become final when its reduction lands in them.
  void awaits_landing(std::size_t u) { units_[u] = {state::awaits_landing, 0}; }
  //! Unit u's reduction landed: false when its gradients changed since sent
  //! (written while the reduction was in flight).
  bool landed(std::size_t u, std::span<const G> g) {
    auto& s = units_[u];
    if (s.now == state::awaits_landing) return s = {state::sent, backend_checksum<B>(g)}, true;
    return s.now != state::sent || backend_checksum<B>(g) == s.sum;
  }
  //! At finish_grad_sync: the first unit whose gradients changed since they
  //! were final, or -1 (grads_of(u): unit u's gradients). Forgets every unit.
  template <class GradsOf>
  int changed(GradsOf&& grads_of) {
    int first = -1;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (units_[u].now == state::sent && first < 0 && backend_checksum<B>(grads_of(u)) != units_[u].sum)
        first = int(u);
      units_[u] = {};
    }
    return first;
  }

private:
  enum class state : std::uint8_t { none, awaits_landing, sent };
  struct unit {
    state now = state::none;
    std::uint64_t sum = 0;
  };
  std::vector<unit> units_;
};

}  // namespace tessera::detail
