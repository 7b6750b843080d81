#pragma once
// A small synthetic training run used by the strategy suites: awkward shapes
// (tensors that do not divide the world size, tensors smaller than it, an
// empty one, a 0-d one, fewer rows than ranks), gradient accumulation, clipping and weight decay. Per-sample
// gradients are deterministic functions of the compute weights and the global
// sample index, so any world size that splits the same global batch must
// reproduce the single-rank no_shard result.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "common/util.hpp"
#include "tessera/tessera.hpp"

namespace tessera_test {

struct unit_def {
  std::string name;
  std::vector<tessera::tensor_spec> tensors;
};

inline std::vector<unit_def> awkward_model() {
  using tessera::shape;
  return {
      {"embed", {{"table", shape({7, 5}), true}, {"bias", shape({3}), false}, {"scale", shape({}), false}}},
      {"tiny", {{"one", shape({1}), false}, {"empty", shape({2, 0}), true}, {"m", shape({13}), true}}},
      {"big", {{"w", shape({33, 3}), true}, {"few", shape({2, 2, 3}), true}, {"b", shape({2}), false}}},
  };
}

struct run_params {
  int steps = 3;
  int accum = 2;
  int global_samples = 6;      // per micro-batch, over all ranks
  double clip = 0.5;
  std::size_t alignment = 16;
  bool nonfinite_at_step1_on_last_rank = false;
  // Write gradients through grads_for_write(): assign when the unit is fresh
  // (its buffer holds garbage), accumulate otherwise, as the GPU trainer does.
  bool assign_when_fresh = false;
  // Reduced gradient shards live in memory lent per unit, which "forward"
  // overwrites with junk each micro-batch, as a trainer's activations would.
  bool lend_grad_shards = false;
  // optimizer_options::overlap_updates: updates deferred to the next use of
  // each unit (the host backend runs them there, so a use the wrapper does not
  // settle reads stale weights and fails the comparison).
  bool overlap_updates = true;
  // wrapper_options::offload_optimizer and where offloaded units update.
  double offload = 0.0;
  tessera::update_site offload_on = tessera::update_site::host;
};

//! Initial value of element i of tensor t in unit u (the same on every rank).
inline double init_value(int u, int t, std::size_t i) { return 0.5 * uniform(u, t, i, 77); }

//! d loss_k / d w_i for sample k: a_k,i (w_i - target_k,i) + 0.25 w_{i+1}
//! (neighbour coupling, so a scrambled layout shows).
inline double sample_grad(long k, int step, int mb, int u, int t, std::size_t i, double wi, double wnext) {
  const double a = 1.0 + uniform(k, step, mb, u, t, i, 1);
  const double target = uniform(k, step, mb, u, t, i, 2);
  return a * (wi - target) + 0.25 * wnext;
}

//! The samples of micro-batch `mb` that rank r of N owns: a contiguous,
//! possibly uneven and possibly empty block of the global batch.
inline std::pair<long, long> local_samples(int K, int r, int N) {
  return {long(K) * r / N, long(K) * (r + 1) / N};
}

//! The awkward model's units and parameters in a wrapper.
struct awkward_ids {
  std::vector<tessera::unit_id> units;
  std::vector<std::vector<tessera::param_id>> params;
};
//! Registers the awkward model in `model`, finalizes it and sets every
//! parameter to init_value (the same on every rank).
template <class W>
awkward_ids build_awkward(W& model) {
  awkward_ids ids;
  const auto defs = awkward_model();
  for (auto& d : defs) {
    ids.units.push_back(model.add_unit(d.name));
    ids.params.emplace_back();
    for (auto& t : d.tensors) ids.params.back().push_back(model.add_param(ids.units.back(), t.name, t.shape, t.weight_decay));
  }
  model.finalize();
  for (std::size_t u = 0; u < defs.size(); ++u)
    for (std::size_t t = 0; t < defs[u].tensors.size(); ++t) {
      std::vector<typename W::main_type> v(defs[u].tensors[t].shape.numel());
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = typename W::main_type(init_value(int(u), int(t), i));
      model.set_param(ids.params[u][t], v);
    }
  return ids;
}

struct run_result {
  std::vector<std::vector<double>> params;  // per registered parameter, full values
  std::vector<double> grad_norms;
  std::vector<bool> skipped;
  long steps_applied = 0, steps_skipped = 0;  // the optimizer's counters at the end
};

//! Trains Cfg with algorithm `alg` over communicator c (or, given m, over
//! the mesh m: c is then unused) and returns the final main weights.
template <class Cfg, class Alg, class Comm>
run_result train(Comm& c, Alg alg, const run_params& p, tessera::comm::mesh<Comm>* m = nullptr) {
  using namespace tessera;
  using W = data_parallel_t<Cfg>;
  using ops = backend_ops<typename Cfg::backend_type>;
  // The batch is split over the whole world; the shards over the group.
  const int N = m ? m->world_size() : c.size(), r = m ? m->world_rank() : c.rank();
  using G = typename W::grad_type;
  const wrapper_options wo{.alignment = p.alignment, .lend_grad_shards = p.lend_grad_shards,
                           .offload_optimizer = p.offload};
  std::optional<W> holder;
  if (m) holder.emplace(*m, wo);
  else holder.emplace(c, wo);
  W& model = *holder;
  const int S = model.world(), rs_rank = model.rank();
  const auto [units, params] = build_awkward(model);
  ShardedOptimizer opt(model, alg,
                       optimizer_options{.clip_norm = p.clip, .overlap_updates = p.overlap_updates,
                                         .offload_update = p.offload_on});
  std::vector<typename ops::template buffer<G>> activations;  // lent to the shards when p.lend_grad_shards
  if (p.lend_grad_shards)
    for (std::size_t u = 0; u < units.size(); ++u) {
      activations.emplace_back(model.shards().layout(u).shard_numel() + 3);
      model.lend_grad_shard(units[u], activations.back().span());
    }

  // With a sum, the trainer divides by the global batch; with an average, by
  // its local batch (every rank holds the same number of samples then).
  constexpr bool sums = std::is_same_v<typename Cfg::averaging, tessera::sum>;
  const auto [k0, k1] = local_samples(p.global_samples, r, N);
  const double scale = sums ? 1.0 / (double(p.global_samples) * p.accum) : 1.0 / (double(k1 - k0) * p.accum);

  run_result out;
  for (int step = 0; step < p.steps; ++step) {
    for (int mb = 0; mb < p.accum; ++mb) {
      model.begin_micro_batch(mb, p.accum);
      for (std::size_t u = 0; u < units.size(); ++u) {  // "forward": gather in order (prefetch runs ahead)
        auto s = model.gather(units[u]);
        BOOST_REQUIRE(!s.weights().empty());
        if (p.lend_grad_shards) ops::fill(activations[u].span(), convert<G>(1e4));  // "activations"
      }
      for (std::size_t u = units.size(); u-- > 0;) {  // backward, last unit first
        auto s = model.gather(units[u]);
        std::span<typename W::grad_type> all;
        bool fresh = false;
        if (p.assign_when_fresh) {
          const auto target = s.grads_for_write();
          all = target.grads;
          fresh = target.fresh;
          // Every step's first micro-batch holds no gradient yet, the very
          // first step's included (nothing to zero: a writer may assign).
          if (mb == 0) BOOST_TEST(fresh);
        }
        for (std::size_t t = 0; t < params[u].size(); ++t) {
          // Through host copies, so the same code drives every backend.
          auto wd = s.weight(params[u][t]);
          const auto& slot = model.slot(params[u][t]);
          auto gd = p.assign_when_fresh ? all.subspan(slot.offset, slot.numel) : s.grad(params[u][t]);
          BOOST_REQUIRE_EQUAL(wd.size(), gd.size());
          std::vector<typename W::compute_type> w(wd.size());
          std::vector<typename W::grad_type> g(gd.size());
          ops::copy_to_host(std::span(w), wd);
          if (fresh) std::fill(g.begin(), g.end(), typename W::grad_type{});  // the buffer's garbage is not read
          else ops::copy_to_host(std::span(g), std::span<const typename W::grad_type>(gd));
          const std::size_t n = w.size();
          for (long k = k0; k < k1; ++k)
            for (std::size_t i = 0; i < n; ++i) {
              const double gi = sample_grad(k, step, mb, int(u), int(t), i, convert<double>(w[i]),
                                            convert<double>(w[(i + 1) % n]));
              g[i] = convert<typename W::grad_type>(convert<double>(g[i]) + scale * gi);
            }
          if (p.nonfinite_at_step1_on_last_rank && step == 1 && r == N - 1 && u == 1 && t == 2 && n > 0)
            g[n / 2] = convert<typename W::grad_type>(std::nan(""));
          ops::copy_from_host(gd, std::span<const typename W::grad_type>(g));
        }
        s.reduce_grads();
      }
    }
    const step_result res = opt.step();
    out.grad_norms.push_back(res.grad_norm);
    out.skipped.push_back(res.skipped);
  }
  out.steps_applied = opt.steps();
  out.steps_skipped = opt.skipped_steps();
  for (auto& pu : params)
    for (auto pid : pu) {
      auto v = model.get_param(pid);
      // This rank's part of the parameter, through the public shard view: its
      // whole rows under fsdp2.
      const auto view = model.shards();
      const piece q = view.range_piece(std::size_t(pid.unit), std::size_t(pid.index));
      const auto local = view.local_main(pid);
      std::vector<typename W::main_type> mine(local.size());
      ops::copy_to_host(std::span(mine), std::span<const typename W::main_type>(local));
      for (std::size_t i = 0; i < mine.size(); ++i) BOOST_TEST(mine[i] == v[q.tensor_begin + i]);
      if constexpr (Cfg::wrapper::row_shards) {
        const auto& slot = model.slot(pid);
        const row_shard rs = view.rows(pid);
        BOOST_TEST(rs.first_row == std::min(std::size_t(rs_rank) * ((slot.rows + S - 1) / S), slot.rows));
        BOOST_TEST(rs.local_shape.numel() == local.size());
        if (!q.empty()) BOOST_TEST(q.tensor_begin == rs.first_row * slot.row_numel);  // whole rows, from row first_row
        if (slot.spec.shape.rank() >= 2)
          for (std::size_t d = 1; d < slot.spec.shape.rank(); ++d) BOOST_TEST(rs.local_shape[d] == slot.spec.shape[d]);
      }
      out.params.emplace_back(v.begin(), v.end());
    }
  return out;
}

//! A run with nonfinite_at_step1_on_last_rank: step 1 skipped with a NaN
//! norm on this rank, steps 0 and 2 applied, and every weight finite (the
//! skipped step changed nothing it could poison).
inline void check_only_step1_skipped(const run_result& got) {
  BOOST_TEST(got.steps_skipped == 1);
  BOOST_TEST(got.steps_applied == long(got.skipped.size()) - 1);
  BOOST_TEST(!got.skipped[0]);
  BOOST_TEST(got.skipped[1]);
  BOOST_TEST(std::isnan(got.grad_norms[1]));
  BOOST_TEST(!got.skipped[2]);
  for (auto& t : got.params)
    for (double x : t) BOOST_TEST(std::isfinite(x));
}

//! The same training in plain float64, without the library: the oracle for
//! the single-rank fp32 run.
template <class Alg>
run_result train_reference_f64(const Alg& alg, const run_params& p) {
  const auto defs = awkward_model();
  std::vector<std::vector<double>> w, m, v;
  std::vector<bool> decay;
  for (std::size_t u = 0; u < defs.size(); ++u)
    for (std::size_t t = 0; t < defs[u].tensors.size(); ++t) {
      const std::size_t n = defs[u].tensors[t].shape.numel();
      w.emplace_back(n);
      for (std::size_t i = 0; i < n; ++i) w.back()[i] = init_value(int(u), int(t), i);
      m.emplace_back(n, 0.0);
      v.emplace_back(n, 0.0);
      decay.push_back(defs[u].tensors[t].weight_decay);
    }
  run_result out;
  long applied = 0;
  for (int step = 0; step < p.steps; ++step) {
    std::vector<std::vector<double>> g;
    for (auto& x : w) g.emplace_back(x.size(), 0.0);
    for (int mb = 0; mb < p.accum; ++mb) {
      std::size_t flat = 0;
      for (std::size_t u = 0; u < defs.size(); ++u)
        for (std::size_t t = 0; t < defs[u].tensors.size(); ++t, ++flat) {
          const std::size_t n = w[flat].size();
          for (long k = 0; k < p.global_samples; ++k)
            for (std::size_t i = 0; i < n; ++i)
              g[flat][i] += sample_grad(k, step, mb, int(u), int(t), i, w[flat][i], w[flat][(i + 1) % n]) /
                            (double(p.global_samples) * p.accum);
        }
    }
    double sq = 0;
    for (auto& x : g)
      for (double e : x) sq += e * e;
    const double norm = std::sqrt(sq);
    const double coef = (p.clip > 0 && norm > p.clip) ? p.clip / (norm + 1e-6) : 1.0;
    out.grad_norms.push_back(norm);
    out.skipped.push_back(false);
    ++applied;
    for (std::size_t f = 0; f < w.size(); ++f)
      for (std::size_t i = 0; i < w[f].size(); ++i) {
        const double gi = g[f][i] * coef;
        if constexpr (std::is_same_v<Alg, tessera::adamw>) {
          const double wd = decay[f] ? alg.weight_decay : 0.0;
          w[f][i] -= alg.lr * wd * w[f][i];
          m[f][i] = alg.beta1 * m[f][i] + (1 - alg.beta1) * gi;
          v[f][i] = alg.beta2 * v[f][i] + (1 - alg.beta2) * gi * gi;
          const double mh = m[f][i] / (1 - std::pow(alg.beta1, double(applied)));
          const double vh = v[f][i] / (1 - std::pow(alg.beta2, double(applied)));
          w[f][i] -= alg.lr * mh / (std::sqrt(vh) + alg.eps);
        } else {
          const double wd = decay[f] ? alg.weight_decay : 0.0;
          double d = gi + wd * w[f][i];
          if (alg.momentum != 0) {
            m[f][i] = alg.momentum * m[f][i] + d;
            d = alg.nesterov ? d + alg.momentum * m[f][i] : m[f][i];
          }
          w[f][i] -= alg.lr * d;
        }
      }
  }
  out.params = w;
  return out;
}

inline tessera::adamw test_adamw() { return {.lr = 0.05, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1}; }
inline tessera::sgd test_sgd() { return {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.05, .nesterov = true}; }

//! Largest |a - b| / max(1, |b|) over all parameters.
inline double max_rel_diff(const run_result& a, const run_result& b) {
  double worst = 0;
  for (std::size_t f = 0; f < b.params.size(); ++f)
    for (std::size_t i = 0; i < b.params[f].size(); ++i)
      worst = std::max(worst, std::abs(a.params[f][i] - b.params[f][i]) / std::max(1.0, std::abs(b.params[f][i])));
  return worst;
}

}  // namespace tessera_test
