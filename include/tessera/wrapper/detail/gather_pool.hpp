#pragma once
//! \file gather_pool: the fixed set of buffers optim_grads_params gathers
//! units into, and which unit each holds. A gathered copy stays valid until
//! the weights change, so a unit gathered again soon (forward, then backward)
//! costs nothing; a new gather takes a free buffer, else the least recently
//! used one that no live scope holds. Under a rows layout (fsdp2) each buffer
//! has a second one in the compute layout, which a copy-out fills as soon as
//! the all-gather lands (backend_ops::after), off the compute stream.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "tessera/backend/ops.hpp"

#include "tessera/comm/communicator.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/wrapper/detail/comm_buffer.hpp"
#include "tessera/wrapper/detail/page_guard.hpp"

namespace tessera::detail {

template <class C, class B>
class gather_pool {
public:
  gather_pool() = default;
  //! `buffers` buffers of `max_padded` elements, in shared memory where the
  //! communicator offers it (all-gathers between such buffers may skip SMs).
  //! `permuted`: units are gathered in shard order and copied out into a
  //! second buffer per slot (the compute layout).
  gather_pool(comm::handle<B> c, int buffers, std::size_t max_padded, std::size_t units, bool permuted = false)
      : comm_(c), slot_of_(units, -1) {
    for (int i = 0; i < buffers; ++i)
      slots_.push_back({comm_buffer<C, B>(c, max_padded, true), buffer(permuted ? max_padded : 0), {}, -1, 0, {}});
  }

  [[nodiscard]] std::size_t size() const noexcept { return slots_.size(); }
  //! Whether unit u has a gathered copy (complete or in flight).
  [[nodiscard]] bool holds(std::size_t u) const { return slot_of_.at(u) >= 0; }

  //! Starts the all-gather of unit u (every rank's `shard_n` elements from
  //! `shard`) into a free buffer, else into the least recently used one whose
  //! unit `held(unit)` says no scope holds. False when every buffer is held.
  //! Where the pool is permuted, `copy_out(gathered, compute)` then fills the
  //! slot's compute-layout buffer.
  template <class Held, class CopyOut>
  [[nodiscard]] bool start(std::size_t u, const C* shard, std::size_t shard_n, Held held, CopyOut copy_out) {
    int best = -1;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      const auto& g = slots_[i];
      if (g.unit < 0) { best = int(i); break; }
      if (!held(std::size_t(g.unit)) && (best < 0 || g.last_use < slots_[std::size_t(best)].last_use)) best = int(i);
    }
    if (best < 0) return false;
    auto& g = slots_[std::size_t(best)];
    g.ready.wait();
    g.guard.lift();  // about to be written
    if (g.unit >= 0) slot_of_[std::size_t(g.unit)] = -1;
    g.unit = int(u);
    g.last_use = ++clock_;
    slot_of_[u] = best;
    g.ready = comm_.iall_gather(shard, g.data.data(), shard_n, dtype_of_v<C>);
    if (g.out.size() != 0) {
      auto landed = std::make_shared<comm::request>(std::move(g.ready));
      g.ready = comm::request(backend_ops<B>::after([landed] { landed->wait(); },
                                                    [copy_out, from = g.data.data(), to = g.out.data()] {
                                                      copy_out(static_cast<const C*>(from), to);
                                                    }));
    }
    return true;
  }
  //! Waits for unit u's all-gather (started before) and marks the use.
  void wait(std::size_t u) {
    auto& g = slots_[std::size_t(slot_of_.at(u))];
    g.ready.wait();
    g.last_use = ++clock_;
  }
  //! Unit u's gathered weights in the compute layout (the first `padded` elements of its buffer).
  [[nodiscard]] std::span<const C> data(std::size_t u, std::size_t padded) const {
    return visible(slots_[std::size_t(slot_of_.at(u))]).first(padded);
  }
  //! Waits for every gather in flight and forgets every copy (weights changed).
  void drop_all() {
    for (auto& g : slots_) {
      g.ready.wait();
      if (g.unit >= 0) slot_of_[std::size_t(g.unit)] = -1;
      g.unit = -1;
    }
  }
  //! Forgets unit u's gathered copy and fills its buffer with NaN
  //! (wrapper_options::poison_released); on the host its whole pages also
  //! become inaccessible until the next gather into it (page_guard.hpp), so
  //! a span kept past the scope faults with a line naming `name` (unit u's).
  void poison(std::size_t u, std::size_t padded, const char* name) {
    if (u >= slot_of_.size() || slot_of_[u] < 0) return;
    auto& g = slots_[std::size_t(slot_of_[u])];
    g.ready.wait();
    backend_ops<B>::fill(visible(g).first(padded), convert<C>(std::numeric_limits<float>::quiet_NaN()));
    if constexpr (std::is_same_v<B, backend::host>) g.guard.protect(visible(g).data(), padded * sizeof(C), name);
    slot_of_[u] = -1;
    g.unit = -1;
  }
  void wait_all() {
    for (auto& g : slots_) g.ready.wait();
  }

private:
  using buffer = typename backend_ops<B>::template buffer<C>;
  struct slot {
    comm_buffer<C, B> data;  // what the all-gather writes (shard order)
    buffer out;              // the compute layout, where the pool is permuted; else empty
    comm::request ready;
    int unit = -1;
    std::uint64_t last_use = 0;
    page_guard guard;  // last: lifted before the buffers are freed
  };
  static std::span<C> visible(slot& g) { return g.out.size() == 0 ? g.data.span() : g.out.span(); }
  static std::span<const C> visible(const slot& g) { return g.out.size() == 0 ? g.data.span() : g.out.span(); }
  comm::handle<B> comm_;
  std::vector<slot> slots_;
  std::vector<int> slot_of_;  // per unit: its buffer, or -1
  std::uint64_t clock_ = 0;
};

}  // namespace tessera::detail
