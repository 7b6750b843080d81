#pragma once
//! \file reduction_pool: the fixed set of full-size gradient / wire buffers
//! that reductions in flight hold, and what each reduction does when its
//! collective completes (convert from the wire dtype, post-divide, accumulate
//! into the unit's gradients). Reductions complete in the order they were
//! issued, so every rank waits on the same sequence. Under
//! wrapper_options::poison_released it also checks that nobody wrote a slot's
//! gradients while its reduction was in flight or after it landed.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/backend/convert.hpp"
#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/core/checksum.hpp"
#include "tessera/wrapper/detail/exact_sum.hpp"
#include "tessera/wrapper/detail/late_writes.hpp"

namespace tessera::detail {

template <class G, class W, class B>
class reduction_pool {
  using ops = backend_ops<B>;
  template <class T> using buffer = typename ops::template buffer<T>;

public:
  //! Where a completed reduction lands.
  enum class landing {
    all_reduced,  //!< the wire buffer holds the reduced full unit: into `dst` (n elements)
    direct,       //!< the collective wrote `dst` itself (the unit's gradient shard)
    staged,       //!< wire_shard holds the reduced shard: converted and added into `dst`
    limbs,        //!< exact_reduction: limbs_shard holds reduced limbs: added into (overwrite: copied to) `limbs_dst`
    none,         //!< the collective wrote its final place itself (limbs all-reduced in place)
  };
  struct slot {
    buffer<G> grad;        // full gradients (sharded gradients only)
    buffer<W> wire;        // full wire buffer (when W != G)
    buffer<W> wire_shard;  // reduced shard before conversion (sharded optimizer, W != G)
    buffer<std::int64_t> limbs, limbs_shard;  // exact_reduction: a unit's limbs, and the reduced shard's
    int unit = -1;         // the unit whose gradients or reduction it holds; -1: free
  };

  reduction_pool() = default;
  //! `count` slots, each with grad_n gradient, wire_n wire and shard_n staging
  //! elements, and limb_n, limb_shard_n int64 limbs (exact_reduction).
  reduction_pool(int count, std::size_t grad_n, std::size_t wire_n, std::size_t shard_n, std::size_t limb_n = 0,
                 std::size_t limb_shard_n = 0) {
    for (int i = 0; i < count; ++i) {
      slots_.push_back({buffer<G>(grad_n), buffer<W>(wire_n), buffer<W>(shard_n), buffer<std::int64_t>(limb_n),
                        buffer<std::int64_t>(limb_shard_n), -1});
      flight_.emplace_back();
      poison_.emplace_back();
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return slots_.size(); }
  [[nodiscard]] slot& operator[](int i) { return slots_[std::size_t(i)]; }
  //! A slot no unit holds, or -1.
  [[nodiscard]] int free_slot() const noexcept {
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].unit < 0) return int(i);
    return -1;
  }
  //! The slot whose reduction was issued first among those in flight, or -1.
  [[nodiscard]] int oldest_pending() const noexcept {
    int best = -1;
    for (std::size_t i = 0; i < flight_.size(); ++i)
      if (flight_[i].pending && (best < 0 || flight_[i].order < flight_[std::size_t(best)].order)) best = int(i);
    return best;
  }

  //! Slot i's reduction is in flight as `r`; on completion it lands as `how`
  //! in dst[0, n), scaled by `post` (and, staged, replacing dst when `overwrite`).
  void issue(int i, comm::request r, landing how, G* dst, std::size_t n, float post, bool overwrite) {
    flight_[std::size_t(i)] = {std::move(r), ++order_, how, dst, n, post, overwrite, true};
  }
  //! Slot i's limbs are in flight as `r`; on completion n limbs land in dst
  //! as `how` (landing::limbs or landing::none).
  void issue_limbs(int i, comm::request r, landing how, std::int64_t* dst, std::size_t n, bool overwrite) {
    flight_[std::size_t(i)] = {std::move(r), ++order_, how, nullptr, n, 1.0f, overwrite, true, dst};
  }
  //! Waits for slot i's reduction without landing it (complete() still does).
  void wait(int i) { flight_[std::size_t(i)].req.wait(); }
  //! Waits for slot i's reduction, lands it, frees the slot; returns its unit.
  int complete(int i) {
    auto& f = flight_[std::size_t(i)];
    auto& sl = slots_[std::size_t(i)];
    f.req.wait();
    f.pending = false;
    switch (f.how) {
      case landing::all_reduced:
        if constexpr (!std::is_same_v<W, G>) ops::for_each(f.n, scale_convert<G, W>{sl.wire.data(), f.dst, f.post});
        else if (f.post != 1.0f) ops::for_each(f.n, scale_convert<G, G>{f.dst, f.dst, f.post});
        break;
      case landing::direct:
        if (f.post != 1.0f) ops::for_each(f.n, scale_convert<G, G>{f.dst, f.dst, f.post});
        break;
      case landing::staged:
        ops::for_each(f.n, accumulate_convert<G, W>{sl.wire_shard.data(), f.dst, f.post, f.overwrite});
        break;
      case landing::limbs:
        ops::for_each(f.n, add_limbs_fn{sl.limbs_shard.data(), f.limbs_dst, f.overwrite});
        break;
      case landing::none:
        break;
    }
    return std::exchange(sl.unit, -1);
  }
  // ---- poison_released: gradients written after reduce_grads are caught ---------
  //! Slot i's gradients `g` were just sent to its reduction: remember them.
  void note_sent(int i, std::span<G> g) { poison_[std::size_t(i)].sent = checksum_of(g); }
  //! Before slot i's reduction lands: whether its first n gradients are still
  //! as sent (false: written while in flight); then they become NaN.
  bool poison_on_landing(int i, std::size_t n) {
    auto& sl = slots_[std::size_t(i)];
    const auto g = sl.grad.span().first(n);
    wait(i);
    const bool intact = checksum_of(g) == poison_[std::size_t(i)].sent;
    ops::fill(g, convert<G>(std::numeric_limits<float>::quiet_NaN()));
    poison_[std::size_t(i)].unit = sl.unit;
    return intact;
  }
  //! The unit whose gradients slot i held when they became NaN, or -1.
  [[nodiscard]] int poisoned_unit(int i) const noexcept { return poison_[std::size_t(i)].unit; }
  //! Before slot i is reused: whether its first n gradients are all still NaN
  //! (false: written after their reduction completed). Forgets the unit.
  bool still_poisoned(int i, std::size_t n) {
    poison_[std::size_t(i)].unit = -1;
    std::vector<G> host(n);
    ops::copy_to_host(std::span<G>(host), std::span<const G>(slots_[std::size_t(i)].grad.span().first(n)));
    for (const G& v : host)
      if (!std::isnan(float(v))) return false;
    return true;
  }

  //! Frees every slot (nothing may be in flight).
  void clear() noexcept {
    for (auto& s : slots_) s.unit = -1;
  }

private:
  struct flight {
    comm::request req;
    std::uint64_t order = 0;
    landing how = landing::direct;
    G* dst = nullptr;
    std::size_t n = 0;
    float post = 1.0f;
    bool overwrite = false;
    bool pending = false;  // issued and not completed (a request may finish before its wait)
    std::int64_t* limbs_dst = nullptr;  // landing::limbs
  };
  // What a slot held when its reduction was issued (poison_released).
  struct poison_state {
    std::uint64_t sent = 0;  // checksum of the gradients as sent
    int unit = -1;           // the unit whose reduction it held, now NaN; -1: nothing to check
  };
  static std::uint64_t checksum_of(std::span<G> x) { return backend_checksum<B>(std::span<const G>(x)); }
  std::vector<slot> slots_;
  std::vector<flight> flight_;
  std::vector<poison_state> poison_;
  std::uint64_t order_ = 0;
};

}  // namespace tessera::detail
