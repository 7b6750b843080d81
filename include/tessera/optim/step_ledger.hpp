#pragma once
//! \file The host's side of the device's step decisions: step_result,
//! step_handle, and detail::step_ledger, which numbers the decisions, writes
//! the ring of step scalars ahead of the device, and reads the decisions
//! back in order as they land, so the host never waits for a step's outcome
//! before it issues the next one (optim/global_norm.hpp has the device's side).
#include <algorithm>
#include <deque>
#include <memory>
#include <vector>

#include "tessera/backend/ops.hpp"
#include "tessera/core/error.hpp"
#include "tessera/optim/global_norm.hpp"

namespace tessera {

//! What one step did.
struct step_result {
  bool skipped = false;    //!< non-finite gradients on some rank: nothing updated on any rank
  double grad_norm = 0.0;  //!< global L2 norm before clipping (inf / nan when skipped)
  double clip_coef = 1.0;  //!< factor applied to the gradients
  double lr = 0.0;         //!< learning rate used
  long step = 0;           //!< steps applied so far
};

namespace detail {

// One step's outcome on its way to the host: the device writes its decision
// into the results ring (slot index % size) before the marker; the ledger
// resolves records in order before a slot is reused, so a handle read late
// still has its own result.
template <class B>
struct step_record {
  typename backend_ops<B>::marker ready;
  const step_control* slot = nullptr;  // results[index % size]
  long long index = 0;                 // 0-based decision number
  bool marked = false;                 // ready recorded (a captured step's is recorded after its launch)
  bool resolved = false;
  step_result r;
  const step_result& resolve() {
    if (!resolved) {
      TESSERA_CHECK(marked, "step_handle::get() on a step still being captured into a graph");
      ready.wait();
      const step_control c = *slot;
      TESSERA_CHECK(!c.stale, "internal: the device found no learning rate for step ", c.step,
                    " in the host's ring (decision ", index, ")");
      TESSERA_CHECK(c.issued == index + 1, "internal: decision ", index, " read from a ring slot holding decision ",
                    c.issued - 1);
      r.skipped = c.skip != 0;
      r.grad_norm = c.grad_norm;
      r.clip_coef = c.clip_coef;
      r.lr = r.skipped ? 0.0 : c.lr;
      r.step = r.skipped ? long(c.step) - 1 : long(c.step);
      resolved = true;
    }
    return r;
  }
};

}  // namespace detail

//! A step issued by ShardedOptimizer::step(): its result is read when asked
//! for (get() waits for the device's decision, not for the update), so a
//! trainer that reads it every N steps synchronises once per N steps.
template <class B>
class step_handle {
public:
  step_handle() = default;
  //! Whether the result is known without waiting.
  [[nodiscard]] bool ready() const { return !rec_ || rec_->resolved || rec_->ready.done(); }
  //! The step's result (waits for the device's decision where needed).
  [[nodiscard]] const step_result& get() const {
    TESSERA_CHECK(rec_ != nullptr, "step_handle::get() on a handle no step() returned");
    return rec_->resolve();
  }
  //! Reading a handle as a step_result waits for it: `step_result r = opt.step();`.
  operator step_result() const { return get(); }  // NOLINT: implicit on purpose
  explicit step_handle(std::shared_ptr<detail::step_record<B>> r) noexcept : rec_(std::move(r)) {}

private:
  std::shared_ptr<detail::step_record<B>> rec_;
};

namespace detail {

//! The optimizer's book of decisions: the host's ring of step scalars (what
//! the device reads for each step number it reaches) and the device's ring
//! of decisions, both in host memory the device reads and writes
//! (step_book), and the records of decisions issued and not yet counted.
//! At most max_outstanding decisions stay unread, so the ring's window of
//! step numbers [applied + 1, applied + max_outstanding + 2] never wraps
//! onto one the device may still read, and no results slot is reused unread.
template <class B>
class step_ledger {
  using ops = backend_ops<B>;
  using record = std::shared_ptr<step_record<B>>;

public:
  static constexpr long long ring_size = 16, max_outstanding = 8;

  step_ledger() {
    ring_.reserve(std::size_t(ring_size));
    results_.reserve(std::size_t(ring_size));
    for (long long i = 0; i < ring_size; ++i) ring_.data()[i] = step_scalars{-1, 0.0, {}};  // no step numbered yet
  }

  //! The rings as the device's decision reads and writes them.
  [[nodiscard]] step_book book() { return {ring_.data(), results_.data(), ring_size}; }
  //! Steps applied and skipped, as counted so far (settle() first for the last decision's).
  [[nodiscard]] long applied() const noexcept { return step_; }
  [[nodiscard]] long skipped() const noexcept { return skipped_; }

  //! The host half of a decision: resolves what it can, bounds what stays
  //! unread, writes the ring ahead for every step number the device may
  //! give the decisions in flight and this one (`fill(s, entry)` sets entry's
  //! lr and scalars for step s), and returns the decision's record.
  template <class Fill>
  record issue(Fill&& fill) {
    resolve_ready();
    if (outstanding_.size() >= std::size_t(max_outstanding)) resolve_through(outstanding_.front()->index);
    const long long first = step_ + 1, last = step_ + 1 + (long long)(outstanding_.size());
    for (long long s = std::max(first, ring_hi_ + 1); s <= last + 1; ++s) {
      step_scalars& e = ring_.data()[s % ring_size];
      e = step_scalars{s, 0.0, {}};
      fill(s, e);
      ring_hi_ = s;
    }
    auto rec = next_record();
    rec->index = issued_++;
    rec->slot = results_.data() + rec->index % ring_size;
    outstanding_.push_back(rec);
    return rec;
  }
  //! Marks every decision issued so far as reachable: their results are
  //! there once the current stream passes this point.
  void mark() {
    for (auto& rec : outstanding_)
      if (!rec->marked) {
        rec->ready.record();
        rec->marked = true;
      }
  }
  //! Resolves, in order, decisions up to `index` (waits for the device); the last one's result.
  step_result resolve_through(long long index) {
    step_result last{};
    while (!outstanding_.empty() && outstanding_.front()->index <= index) {
      last = outstanding_.front()->resolve();
      count(outstanding_.front());
    }
    return last;
  }
  //! Resolves every decision issued (waits for the last one); the last one's result.
  step_result settle() { return resolve_through(issued_ - 1); }
  //! The ring entries from the next step on are stale (a new schedule): issue() rewrites them.
  void rewrite_ahead() { ring_hi_ = step_; }
  //! Sets the counters when resuming from a checkpoint (after settle()).
  void restore(long steps, long skipped) {
    step_ = steps;
    skipped_ = skipped;
    ring_hi_ = steps;
  }

private:
  // Resolves, in order, every outstanding decision the device is already past.
  void resolve_ready() {
    while (!outstanding_.empty() && outstanding_.front()->marked &&
           (outstanding_.front()->resolved || outstanding_.front()->ready.done()))
      count(outstanding_.front());
  }
  void count(const record& rec) {
    const step_result& r = rec->resolve();
    (r.skipped ? skipped_ : step_)++;
    TESSERA_CHECK(r.skipped || r.step == step_, "internal: the device applied step ", r.step, " where the host counted ",
                  step_);
    outstanding_.pop_front();
  }
  // A record nobody holds any more (handles keep theirs alive).
  record next_record() {
    for (auto& rec : records_)
      if (rec.use_count() == 1) {
        rec->r = step_result{};
        rec->resolved = rec->marked = false;
        return rec;
      }
    return records_.emplace_back(std::make_shared<step_record<B>>());
  }

  typename ops::template staging<step_scalars> ring_;
  typename ops::template staging<step_control> results_;
  long long ring_hi_ = 0;  // the highest step number written into the ring
  long long issued_ = 0;   // decisions issued
  std::deque<record> outstanding_;  // issued, not yet counted, oldest first
  std::vector<record> records_;
  long step_ = 0, skipped_ = 0;
};

}  // namespace detail
}  // namespace tessera
