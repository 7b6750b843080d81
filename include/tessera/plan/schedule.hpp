#pragma once
//! \file The time of one training step as the engine issues it, from the
//! collectives' cost model (cost.hpp) and each unit's compute time; no GPU.
//!
//! Three streams, as on CUDA: compute, the shard group's communicator and
//! the replica group's (meshes). Each collective is issued where the engine
//! issues it and starts once its stream is free and the compute issued
//! before it is done (NCCL's stream waits on an event of the compute
//! stream); compute waits where the engine waits:
//!  - optim_grads_params: a unit's all-gather when it is first used, the next
//!    unit's prefetched when a buffer is free (gather_buffers, least recently
//!    used, as gather_pool), gathered copies kept until the weights change;
//!  - gradients: a reduction per unit after its backward (every micro-batch
//!    where gradients are sharded, else the last), into one of grad_buffers
//!    slots (a unit's backward waits for the oldest reduction when none is
//!    free); a completed reduction's replica traffic is issued then;
//!  - the step: every reduction and replica collective complete, the norm's
//!    all-reduce, the optimizer, and for optim / optim_grads the new weights'
//!    all-gather, which the next forward waits for unit by unit.
//! Compute loses topology::interference of its throughput while a collective
//! runs on SMs (copy-engine gathers take none). The step is the third of three
//! simulated (steady state: the first has no publication to wait for).
//!
//! Not modelled: the optimizer's updates in the next forward's shadow
//! (optimizer_options::overlap_updates) run on the compute stream here, as
//! they share the same SMs and memory (on one H200 the shadow saved 0.2%);
//! host work (launches, the loss copy) is not counted; collectives do not
//! slow each other.
#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/plan/cost.hpp"
#include "tessera/shard/layout.hpp"
#include "tessera/wrapper/detail/storage.hpp"

namespace tessera::plan {

//! One unit's traffic (nccl-tests' sizes, bytes) and work (microseconds at full speed).
struct unit_work {
  double gather_bytes = 0;  //!< all-gather of its compute weights over the shard group (padded unit)
  double reduce_bytes = 0;  //!< gradient reduction over the shard group (padded unit, wire dtype)
  double outer_bytes = 0;   //!< across replicas: the group's reduced gradients (shard, or unit under no_shard)
  double part_bytes = 0;    //!< outer<optim>: the replicas' parts gathered back into the shard after the step
  double forward_us = 0, backward_us = 0;  //!< one micro-batch
  double update_us = 0;     //!< the optimizer over this rank's range (and the norm's pass)
};

//! What the schedule depends on besides the units.
struct step_shape {
  bool shards_optimizer = false, shards_grads = false, shards_params = false;
  bool outer_splits = false;  //!< outer<optim>
  int group = 1, replicas = 1, micro_batches = 1;
  int gather_buffers = 2, grad_buffers = 2;
  bool prefetch = true;
  bool copy_engine_gathers = false;  //!< all-gathers on copy engines (nccl_options::copy_engine_gathers; inside a node)
};

//! One step, microseconds.
struct step_time {
  double step_us = 0;
  double compute_us = 0;    //!< forward + backward alone
  double optimizer_us = 0;  //!< the optimizer alone
  double comm_us = 0;       //!< every collective of the step alone, back to back
  double exposed_us = 0;    //!< step - compute - optimizer
  int collectives = 0;      //!< issued per step
};

namespace detail {

class timeline {
public:
  explicit timeline(const topology& t) : t_(t) {}
  double now = 0;  // the compute stream
  // Compute work of `us` at full speed, slowed where collectives run on SMs.
  void run(double us) {
    while (us > 1e-12) {
      double load = 0, next = std::numeric_limits<double>::infinity();
      for (const auto& b : busy_) {
        if (b.end <= now) continue;
        if (b.start <= now) load += t_.interference, next = std::min(next, b.end);
        else next = std::min(next, b.start);
      }
      const double rate = 1.0 - std::min(load, 0.95), span = next - now;
      if (span * rate >= us) {
        now += us / rate;
        return;
      }
      us -= span * rate;
      now = next;
    }
  }
  // A collective of `us` on a stream free at `free`, after the compute issued so far.
  double issue(double& free, double us, bool on_sms) {
    const double start = std::max(free, now);
    free = start + us;
    if (on_sms && us > 0) busy_.push_back({start, free});
    busy_.erase(std::remove_if(busy_.begin(), busy_.end(), [this](const auto& b) { return b.end <= now; }),
                busy_.end());
    ++issued;
    total += us;
    return free;
  }
  void wait(double until) { now = std::max(now, until); }
  int issued = 0;
  double total = 0;

private:
  struct interval {
    double start, end;
  };
  const topology& t_;
  std::vector<interval> busy_;
};

}  // namespace detail

//! Simulates steps of `units` under `s` on topology `t` (see the file comment).
[[nodiscard]] inline step_time simulate(const topology& t, const step_shape& s, const std::vector<unit_work>& units) {
  TESSERA_CHECK(!units.empty(), "plan::simulate: no unit");
  TESSERA_CHECK(s.group >= 1 && s.replicas >= 1 && s.micro_batches >= 1 && s.gather_buffers >= 1 && s.grad_buffers >= 1,
                "plan::simulate: group ", s.group, ", replicas ", s.replicas, ", micro-batches ", s.micro_batches,
                ", gather buffers ", s.gather_buffers, ", grad buffers ", s.grad_buffers);
  const std::size_t U = units.size();
  const int S = s.group, R = s.replicas;
  const bool solo = S == 1, gathers = s.shards_params && !solo;
  // Copy engines carry NVLink traffic only: a shard group across nodes gathers on SMs.
  const bool ce = s.copy_engine_gathers && place(t, S).nodes == 1;
  detail::timeline tl(t);
  double inner = 0, outer = 0;  // when each communicator's stream is free
  const auto on_inner = [&](collective c, double bytes, bool sms = true) {
    return tl.issue(inner, collective_us(t, c, bytes, S, 1), sms);
  };
  const auto on_outer = [&](collective c, double bytes) { return tl.issue(outer, collective_us(t, c, bytes, R, S), true); };

  std::vector<double> weights_ready(U, 0.0);  // publication (optim, optim_grads; outer<optim> parts)
  // The gather pool: which unit each buffer holds, its last use, when it lands.
  struct slot {
    long unit = -1;
    long last = 0;
    double ready = 0;
  };
  std::vector<slot> pool(std::size_t(s.gather_buffers));
  long clock = 0;
  const auto find = [&](std::size_t u) -> slot* {
    for (auto& g : pool)
      if (g.unit == long(u)) return &g;
    return nullptr;
  };
  const auto start_gather = [&](std::size_t u, long held) -> bool {
    tl.wait(weights_ready[u]);
    slot* best = nullptr;
    for (auto& g : pool) {
      if (g.unit < 0) { best = &g; break; }
      if (g.unit != held && (!best || g.last < best->last)) best = &g;
    }
    if (!best) return false;
    best->unit = long(u), best->last = ++clock;
    best->ready = on_inner(collective::all_gather, units[u].gather_bytes, !ce);
    return true;
  };
  long last_gathered = -1;
  const auto acquire = [&](std::size_t u) {
    if (!gathers) return tl.wait(weights_ready[u]);
    if (!find(u)) (void)start_gather(u, -1);
    slot* g = find(u);
    tl.wait(g->ready);
    g->last = ++clock;
    const long dir = (last_gathered < 0 || long(u) > last_gathered) ? 1 : -1, next = long(u) + dir;
    last_gathered = long(u);
    if (s.prefetch && next >= 0 && std::size_t(next) < U && !find(std::size_t(next))) (void)start_gather(std::size_t(next), long(u));
  };
  // Reduction slots: (unit, when it lands), in issue order.
  struct pending {
    std::size_t unit;
    double done;
  };
  std::vector<pending> flight;
  int mb = 0;
  const auto last_mb = [&] { return mb == s.micro_batches - 1; };
  const auto issue_outer = [&](std::size_t u) {
    if (R > 1) (void)on_outer(s.outer_splits ? collective::reduce_scatter : collective::all_reduce, units[u].outer_bytes);
  };
  const auto complete_oldest = [&] {
    tl.wait(flight.front().done);
    if (last_mb()) issue_outer(flight.front().unit);
    flight.erase(flight.begin());
  };
  const auto complete_all = [&] {
    while (!flight.empty()) complete_oldest();
  };
  const auto reduce = [&](std::size_t u) {
    if (solo) return last_mb() ? issue_outer(u) : void();
    if (!s.shards_grads && !last_mb()) return;
    if (int(flight.size()) >= s.grad_buffers) complete_oldest();
    flight.push_back({u, on_inner(s.shards_optimizer ? collective::reduce_scatter : collective::all_reduce,
                                  units[u].reduce_bytes)});
  };

  double compute = 0, optimizer = 0;
  for (const auto& u : units) compute += u.forward_us + u.backward_us, optimizer += u.update_us;
  double starts[4] = {};
  int issued_before = 0, issued_in = 0;
  double comm_before = 0, comm_in = 0;
  for (int step = 0; step < 3; ++step) {
    starts[step] = tl.now;
    if (step == 2) issued_before = tl.issued, comm_before = tl.total;
    for (mb = 0; mb < s.micro_batches; ++mb) {
      if (mb > 0) complete_all();
      for (std::size_t u = 0; u < U; ++u) acquire(u), tl.run(units[u].forward_us);
      for (std::size_t u = U; u-- > 0;) {
        acquire(u);
        if (s.shards_grads && !solo && int(flight.size()) >= s.grad_buffers) complete_oldest();  // its slot, before backward writes
        tl.run(units[u].backward_us);
        reduce(u);
      }
    }
    mb = s.micro_batches - 1;
    complete_all();
    tl.wait(outer);
    // The norm: one all-reduce of two doubles in each communicator.
    if (!solo) tl.wait(on_inner(collective::all_reduce, 16));
    if (R > 1) tl.wait(on_outer(collective::all_reduce, 16));
    tl.run(optimizer);
    for (auto& g : pool) g = slot{};  // the weights changed
    last_gathered = -1;
    for (std::size_t u = 0; u < U; ++u) {
      weights_ready[u] = 0;
      if (s.outer_splits && R > 1) weights_ready[u] = on_outer(collective::all_gather, units[u].part_bytes);
      if (s.shards_optimizer && !s.shards_params && !solo) {
        tl.wait(weights_ready[u]);  // the shard is whole before the group gathers it
        weights_ready[u] = on_inner(collective::all_gather, units[u].gather_bytes);
      }
    }
    if (step == 2) issued_in = tl.issued - issued_before, comm_in = tl.total - comm_before;
  }
  // The third step ends where a fourth could start its first compute (the
  // first unit's new weights published; its gather is the fourth step's own).
  tl.wait(weights_ready[0]);
  starts[3] = tl.now;
  step_time r;
  r.step_us = starts[3] - starts[2];
  r.compute_us = compute * s.micro_batches;
  r.optimizer_us = optimizer;
  r.comm_us = comm_in;
  r.exposed_us = std::max(0.0, r.step_us - r.compute_us - r.optimizer_us);
  r.collectives = issued_in;
  return r;
}

//! The traffic and optimizer bytes of config Cfg's units (layouts as
//! plan::layouts builds them), with no compute: the caller adds each unit's
//! forward and backward time. `copy_gbs` prices the optimizer's pass.
template <config_type Cfg, class A>
[[nodiscard]] std::vector<unit_work> unit_traffic(const std::vector<unit_layout>& ls, double copy_gbs) {
  using rules = tessera::detail::storage<Cfg>;
  using C = typename Cfg::compute_type;
  using M = typename Cfg::main_type;
  using G = typename Cfg::grad_type;
  using W = typename Cfg::wire_type;
  using St = typename Cfg::strategy;
  // Per element of the optimizer's range: main weights and state read and
  // written, the gradient read twice (norm, update), the compute copy written.
  constexpr double per_elem = 2.0 * sizeof(M) * (1 + A::state_count) + 2.0 * sizeof(G) +
                              (rules::main_aliases_compute ? 0.0 : double(sizeof(C)));
  // exact_reduction sends two 64-bit limbs per element (fixed_point.hpp).
  constexpr double wire = rules::exact ? 16.0 : double(sizeof(W));
  std::vector<unit_work> out;
  for (const auto& L : ls) {
    unit_work w;
    const double padded = double(L.padded_numel()), shard = double(L.shard_numel());
    w.gather_bytes = padded * sizeof(C);
    w.reduce_bytes = padded * wire;
    w.outer_bytes = (St::shards_optimizer ? shard : padded) * (rules::exact ? 16.0 : double(sizeof(G)));
    w.part_bytes = shard * sizeof(C);
    const double range = St::shards_optimizer ? shard / double(L.splits()) : padded;
    w.update_us = range * per_elem / (copy_gbs * 1e3);
    out.push_back(w);
  }
  return out;
}

//! The schedule's shape for config Cfg.
template <config_type Cfg>
[[nodiscard]] step_shape shape_of(int group, int replicas, int micro_batches, int gather_buffers, int grad_buffers = 2,
                                  bool copy_engine_gathers = false) {
  using St = typename Cfg::strategy;
  return {.shards_optimizer = St::shards_optimizer, .shards_grads = St::shards_grads, .shards_params = St::shards_params,
          .outer_splits = Cfg::outer_type::splits_optimizer, .group = group, .replicas = replicas,
          .micro_batches = micro_batches, .gather_buffers = gather_buffers, .grad_buffers = grad_buffers,
          .copy_engine_gathers = copy_engine_gathers};
}

}  // namespace tessera::plan
