// Optimizer: the element updates against float64 on fresh random data of
// awkward sizes, the non-finite skip on every rank, the schedule hook, the
// memory plan against what was allocated.
#define BOOST_TEST_MODULE tessera_optim
#include "common/mpi_test_main.hpp"
#include "common/training_harness.hpp"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <cstdlib>
#include <string>
#include <optional>
#include <random>
#include <type_traits>
#include <vector>

#include "tessera/tessera.hpp"
#include "tessera/checkpoint/checkpoint.hpp"

using namespace tessera;

// The fused AdamW pass (fp32 state, bf16 gradients in, bf16 weights out, a
// no-decay range) against float64, through both the scalar and the 4-wide path.
BOOST_AUTO_TEST_CASE(adamw_pass_against_float64) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> nd;
  for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(33), std::size_t(1001)}) {
    std::vector<float> w(n), m(n), v(n);
    std::vector<bf16> g(n), out(n, bf16(std::nanf("")));
    std::vector<double> wd(n), md(n), vd(n), gd(n);
    for (std::size_t i = 0; i < n; ++i) {
      w[i] = float(nd(rng)); m[i] = float(0.1 * nd(rng)); v[i] = float(std::abs(0.01 * nd(rng)));
      g[i] = bf16(float(nd(rng)));
      wd[i] = w[i]; md[i] = m[i]; vd[i] = v[i]; gd[i] = double(float(g[i]));
    }
    // One no-decay range [n/3, n/3 + n/4): a bit per element (granule 1).
    std::vector<std::uint32_t> bits((n + 31) / 32, ~0u);
    for (std::size_t i = n / 3; i < n / 3 + n / 4; ++i) bits[i / 32] &= ~(1u << (i % 32));
    const double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, decay = 0.1, scale = 0.7;
    const long t = 5;
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    const float fscale = float(scale);
    adamw_kernel<float, bf16, bf16> k{w.data(), g.data(), m.data(), v.data(), out.data(),
                                      {bits.data(), 0}, &fscale, float(lr), float(b1), float(b2), float(eps),
                                      float(decay), float(1 / bc1), float(1 / std::sqrt(bc2))};
    const std::size_t vec_end = n / 4 * 4;
    for (std::size_t i = 0; i < vec_end; i += 4) k.run<4>(i);
    for (std::size_t i = vec_end; i < n; ++i) k(i);
    for (std::size_t i = 0; i < n; ++i) {
      const double gi = gd[i] * scale;
      const bool decays = !(i >= n / 3 && i < n / 3 + n / 4);
      if (decays) wd[i] -= lr * decay * wd[i];
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      wd[i] -= lr * (md[i] / bc1) / (std::sqrt(vd[i] / bc2) + eps);
      BOOST_TEST_CONTEXT("n " << n << " i " << i) {
        BOOST_TEST(std::abs(w[i] - wd[i]) <= 4e-7 * std::max(1.0, std::abs(wd[i])));
        BOOST_TEST(std::abs(m[i] - md[i]) <= 4e-7 * std::max(1.0, std::abs(md[i])));
        BOOST_TEST(std::abs(v[i] - vd[i]) <= 4e-7 * std::max(1e-3, std::abs(vd[i])));
        BOOST_TEST(out[i].bits == bf16(w[i]).bits);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(nonfinite_gradient_on_one_rank_skips_the_step_everywhere) {
  comm::mpi c;
  tessera_test::run_params p;
  p.global_samples = 2 * c.size();
  p.nonfinite_at_step1_on_last_rank = true;
  using Cfg = config<optim_grads_params, fsdp>;
  tessera_test::check_only_step1_skipped(tessera_test::train<Cfg>(c, tessera_test::test_adamw(), p));
}

BOOST_AUTO_TEST_CASE(schedule_hook_sets_the_learning_rate) {
  comm::mpi c;
  data_parallel_t<config<optim, ddp>> m(c);
  auto u = m.add_unit("u");
  auto w = m.add_param(u, "w", {3});
  m.finalize();
  std::vector<float> ones(3, 1.0f);
  m.set_param(w, ones);
  ShardedOptimizer opt(m, sgd{.lr = 1.0});
  opt.set_schedule([](long step, double base) { return base * 0.5 * double(step); });
  for (int s = 1; s <= 2; ++s) {
    {
      auto scope = m.gather(u);
      auto g = scope.grad(w);
      for (auto& x : g) x = 1.0f;
    }
    const step_result r = opt.step();
    BOOST_TEST(r.lr == 0.5 * s);
  }
  // w = 1 - 0.5*1 - 1.0*1 (averaged gradient 1 on every rank)
  for (float x : m.get_param(w)) BOOST_TEST(x == -0.5f);
}

// The memory plan is what gets allocated: the host backend counts every byte.
template <class Cfg>
void check_plan() {
  comm::mpi c;
  const std::size_t before = memory_of<backend::host>().current();
  {
    data_parallel_t<Cfg> m(c);
    for (auto& d : tessera_test::awkward_model()) {
      auto u = m.add_unit(d.name);
      for (auto& t : d.tensors) m.add_param(u, t.name, t.shape, t.weight_decay);
    }
    m.finalize();
    ShardedOptimizer opt(m, adamw{});
    const std::size_t held = memory_of<backend::host>().current() - before;
    BOOST_TEST_CONTEXT(Cfg::strategy::name << " world " << c.size()) {
      BOOST_TEST(held == m.planned().total() + opt.state_bytes());
    }
  }
  BOOST_TEST(memory_of<backend::host>().current() == before);
}
BOOST_AUTO_TEST_CASE(memory_plan_equals_allocation) {
  check_plan<config<no_shard, ddp, mixed_precision<bf16, float>>>();
  check_plan<config<optim, ddp>>();
  check_plan<config<optim_grads, fsdp, mixed_precision<bf16, float, float, bf16>>>();
  check_plan<config<optim_grads_params, fsdp, mixed_precision<bf16, float>>>();
  check_plan<config<optim_grads_params, fsdp2, mixed_precision<bf16, float>>>();
  check_plan<config<optim_grads_params, fsdp2>>();  // gradients in the wire type: a copy-in buffer still
  // exact_reduction: accumulators, limb buffers, the scales and the norm's limbs
  check_plan<config<no_shard, ddp, exact_reduction>>();
  check_plan<config<optim, fsdp, mixed_precision<bf16, float>, exact_reduction>>();
  check_plan<config<optim_grads, ddp, exact_reduction>>();
  check_plan<config<optim_grads_params, fsdp, mixed_precision<bf16, float>, exact_reduction>>();
  check_plan<config<optim_grads_params, fsdp2, exact_reduction>>();
}

// ---- the optimizer is open: a third algorithm written outside optim/ -------------

// Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023):
// w -= lr * (sign(b1 m + (1 - b1) g) + wd w); m = b2 m + (1 - b2) g. Nothing
// in include/tessera/optim knows it; it only satisfies optimizer_algorithm.
template <class M, class G, class C>
struct lion_kernel {
  M* w;
  const G* g;
  M* m;
  C* out;
  decay_mask decay;
  const float* grad_scale;  // backend memory: the clip coefficient the device decided
  float lr, beta1, beta2, weight_decay;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const {
    const float gi = convert<float>(g[i]) * *grad_scale;
    const float c = beta1 * float(m[i]) + (1 - beta1) * gi;
    float x = float(w[i]);
    if (decay.decays(i)) x -= lr * weight_decay * x;
    x -= lr * float((c > 0) - (c < 0));
    m[i] = M(beta2 * float(m[i]) + (1 - beta2) * gi);
    w[i] = M(x);
    if (out) out[i] = convert<C>(w[i]);
  }
};
struct lion {
  using tessera_algorithm = void;
  static constexpr int state_count = 1;
  static constexpr std::string_view name = "lion";
  static constexpr std::string_view state_names[state_count] = {"exp_avg"};
  double lr = 1e-2, beta1 = 0.9, beta2 = 0.99, weight_decay = 0.1;
  template <class M, class G, class C>
  lion_kernel<M, G, C> kernel(const update_args<M, G, C>& a) const {
    return {a.weights, a.grads, a.state[0], a.compute_out, a.decay, a.grad_scale, float(a.lr), float(beta1),
            float(beta2), float(weight_decay)};
  }
};
static_assert(optimizer_algorithm<lion>);
static_assert(!optimizer_algorithm<int>);

// Lion over every sharding of the optimizer trains to the single-rank no_shard
// result, and against its own float64 form on one rank.
template <class Cfg>
void check_lion_matches_no_shard() {
  comm::mpi c;
  comm::local<> solo;
  using Ref = config<no_shard, ddp, typename Cfg::precision, typename Cfg::averaging>;
  tessera_test::run_params p;
  p.global_samples = 2 * c.size();
  const auto ref = tessera_test::train<Ref>(solo, lion{}, p);
  const auto got = tessera_test::train<Cfg>(c, lion{}, p);
  BOOST_TEST_CONTEXT(Cfg::strategy::name << " / " << Cfg::wrapper::name << ", lion, rank " << c.rank() << " of "
                                         << c.size()) {
    BOOST_TEST(tessera_test::max_rel_diff(got, ref) <= 1e-5);
    // Lion moved every weight: a kernel that did nothing would also "match".
    const auto start = tessera_test::train<Ref>(solo, lion{.lr = 0.0, .weight_decay = 0.0}, p);
    BOOST_TEST(tessera_test::max_rel_diff(start, ref) > 1e-3);
  }
}
BOOST_AUTO_TEST_CASE(a_third_algorithm_defined_outside_the_library_trains_like_no_shard) {
  check_lion_matches_no_shard<config<optim_grads_params, fsdp>>();
  check_lion_matches_no_shard<config<optim, ddp>>();
  check_lion_matches_no_shard<config<optim_grads, fsdp, pre_divide>>();  // any order after the wrapper
}

// ---- the optimizer in the next forward's shadow ----------------------------------

// Updates deferred to each unit's next use give the same bits as updates at
// the end of step(), for every strategy and wrapper, with accumulation,
// clipping, lent shards and a skipped step; on the host backend a deferred
// update runs only where the wrapper settles it, so a use it missed would
// read stale weights here.
template <class Cfg>
void check_overlap_equals_eager(bool lend, bool nonfinite) {
  comm::mpi c;
  tessera_test::run_params p;
  p.global_samples = 2 * c.size() + 1;
  p.lend_grad_shards = lend;
  p.accum = lend && Cfg::strategy::shards_grads ? 1 : 2;
  p.nonfinite_at_step1_on_last_rank = nonfinite;
  p.steps = 4;
  p.overlap_updates = false;
  const auto eager = tessera_test::train<Cfg>(c, tessera_test::test_adamw(), p);
  p.overlap_updates = true;
  const auto shadow = tessera_test::train<Cfg>(c, tessera_test::test_adamw(), p);
  BOOST_TEST_CONTEXT(Cfg::strategy::name << " / " << Cfg::wrapper::name << ", " << c.size() << " ranks, lend " << lend
                                         << ", nonfinite " << nonfinite) {
    BOOST_TEST(shadow.steps_applied == eager.steps_applied);
    BOOST_TEST(shadow.steps_skipped == eager.steps_skipped);
    BOOST_TEST(shadow.steps_skipped == (nonfinite ? 1 : 0));
    for (std::size_t s = 0; s < eager.grad_norms.size(); ++s) {
      BOOST_TEST(shadow.skipped[s] == eager.skipped[s]);
      BOOST_TEST((shadow.grad_norms[s] == eager.grad_norms[s] ||
                  (std::isnan(shadow.grad_norms[s]) && std::isnan(eager.grad_norms[s]))));
    }
    BOOST_REQUIRE(shadow.params.size() == eager.params.size());
    for (std::size_t t = 0; t < eager.params.size(); ++t) BOOST_TEST(shadow.params[t] == eager.params[t]);
  }
}

BOOST_AUTO_TEST_CASE(updates_in_the_next_forwards_shadow_equal_updates_at_the_end_of_the_step) {
  for (bool nonfinite : {false, true}) {
    check_overlap_equals_eager<config<optim_grads_params, fsdp>>(false, nonfinite);
    check_overlap_equals_eager<config<optim_grads_params, fsdp, mixed_precision<bf16, float>>>(true, nonfinite);
    check_overlap_equals_eager<config<optim_grads_params, fsdp2, mixed_precision<bf16, float>>>(false, nonfinite);
    check_overlap_equals_eager<config<no_shard, ddp, mixed_precision<bf16, float>>>(false, nonfinite);
    check_overlap_equals_eager<config<optim_grads, ddp>>(true, nonfinite);  // publication all-gathers: not deferred
    check_overlap_equals_eager<config<optim, fsdp, pre_divide>>(false, nonfinite);
  }
}

// The deferral is real: after step() a unit's main weights in memory are
// still the old ones until something uses the unit (host backend: the update
// runs when settled); every door of the shard view settles it.
BOOST_AUTO_TEST_CASE(step_defers_each_update_until_the_unit_is_used) {
  comm::mpi c;
  data_parallel_t<config<optim_grads_params, fsdp>> m(c);
  const auto u0 = m.add_unit("a"), u1 = m.add_unit("b"), u2 = m.add_unit("c");
  const auto w0 = m.add_param(u0, "w", {5}), w1 = m.add_param(u1, "w", {7}), w2 = m.add_param(u2, "w", {6});
  m.finalize();
  for (auto w : {w0, w1, w2}) m.set_param(w, std::vector<float>(m.slot(w).numel, 1.0f));
  ShardedOptimizer opt(m, sgd{.lr = 0.5});
  BOOST_TEST(opt.options().overlap_updates);
  const auto view = m.shards();
  // Where this rank's range holds each tensor's elements, if it does.
  const piece q0 = view.range_piece(0, 0), q2 = view.range_piece(2, 0);
  const float* raw0 = view.main_weights(0).data() + q0.shard_begin;
  const float* raw2 = view.main_weights(2).data() + q2.shard_begin;
  for (auto [u, w] : {std::pair{u0, w0}, std::pair{u1, w1}, std::pair{u2, w2}}) {
    auto s = m.gather(u);
    for (auto& g : s.grad(w)) g = 1.0f;
    s.reduce_grads();
  }
  const auto h = opt.step();
  BOOST_TEST(h.ready());  // host: the decision is made when issued
  BOOST_TEST(h.get().step == 1);
  BOOST_TEST(!h.get().skipped);
  if (q0.count > 0) BOOST_TEST(raw0[0] == 1.0f);  // nothing updated yet
  if (q2.count > 0) BOOST_TEST(raw2[0] == 1.0f);
  { auto s = m.gather(u0); }  // the next forward reaches unit a (and prefetches b), not c
  if (q0.count > 0) BOOST_TEST(raw0[0] == 0.5f);
  if (q2.count > 0) BOOST_TEST(raw2[0] == 1.0f);
  for (float x : m.get_param(w2)) BOOST_TEST(x == 0.5f);  // get_param settles c
  BOOST_TEST(opt.steps() == 1);
}

// An optimizer may move (its deferred updates point into its state buffers,
// which move with it): the moved-to one finishes the step the other started.
BOOST_AUTO_TEST_CASE(a_moved_optimizer_keeps_its_deferred_updates) {
  static_assert(std::is_move_constructible_v<ShardedOptimizer<sgd, data_parallel_t<config<optim_grads_params, fsdp>>>>);
  comm::mpi c;
  data_parallel_t<config<optim_grads_params, fsdp>> m(c);
  const auto u = m.add_unit("a");
  const auto w = m.add_param(u, "w", {9});
  m.finalize();
  m.set_param(w, std::vector<float>(9, 1.0f));
  std::optional<ShardedOptimizer<sgd, data_parallel_t<config<optim_grads_params, fsdp>>>> first;
  first.emplace(m, sgd{.lr = 0.5});
  {
    auto s = m.gather(u);
    for (auto& g : s.grad(w)) g = 1.0f;
    s.reduce_grads();
  }
  (void)first->step();
  ShardedOptimizer second(std::move(*first));
  first.reset();
  for (float x : m.get_param(w)) BOOST_TEST(x == 0.5f);
  BOOST_TEST(second.steps() == 1);
}

// ---- offload (wrapper_options::offload_optimizer) ------------------------------

// host::pool covers [0, n) exactly once, in grain-aligned ranges, for sizes
// around its thread count and grain.
BOOST_AUTO_TEST_CASE(host_pool_covers_every_element_once) {
  host::pool pool(3);
  BOOST_TEST(pool.size() == 3u);
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(64), std::size_t(65),
                        std::size_t(1000), std::size_t(4097)}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, 16, [&](std::size_t b, std::size_t e) {
      BOOST_TEST(b % 16 == 0);
      for (std::size_t i = b; i < e; ++i) hits[i]++;
    });
    for (std::size_t i = 0; i < n; ++i) BOOST_TEST_REQUIRE(hits[i].load() == 1);
  }
}

// Which units are offloaded: the last first, whole units, at least the fraction.
BOOST_AUTO_TEST_CASE(offload_takes_the_last_units_first) {
  std::vector<unit_layout> ls;
  for (int u = 0; u < 4; ++u)
    ls.emplace_back("u" + std::to_string(u), std::vector<tensor_spec>{{"w", shape({100}), true}}, 1, 1);
  using V = std::vector<bool>;
  BOOST_TEST((detail::offloaded_units(ls, 0.0) == V{false, false, false, false}));
  BOOST_TEST((detail::offloaded_units(ls, 0.25) == V{false, false, false, true}));
  BOOST_TEST((detail::offloaded_units(ls, 0.3) == V{false, false, true, true}));
  BOOST_TEST((detail::offloaded_units(ls, 1.0) == V{true, true, true, true}));
}

// Offload that the host cannot hold: a clear error before anything is
// allocated; a fraction outside [0, 1] too.
BOOST_AUTO_TEST_CASE(offload_beyond_host_memory_is_a_clear_error) {
  comm::mpi c;
  using W = data_parallel_t<config<optim_grads_params, fsdp, mixed_precision<bf16, float>>>;
  const std::size_t before = memory_of<backend::host>().current() + memory_of<host_resident>().current();
  ::setenv("TESSERA_HOST_MEMORY_BYTES", "1000000", 1);
  {
    W model(c, wrapper_options{.offload_optimizer = 1.0});
    model.add_param(model.add_unit("big"), "w", shape({1 << 20}));
    try {
      model.finalize();
      BOOST_ERROR("no error for offload beyond host memory");
    } catch (const tessera::error& e) {
      BOOST_TEST(std::string(e.what()).find("host memory") != std::string::npos);
    }
  }
  ::unsetenv("TESSERA_HOST_MEMORY_BYTES");
  BOOST_TEST(memory_of<backend::host>().current() + memory_of<host_resident>().current() == before);
  BOOST_CHECK_THROW(W(c, wrapper_options{.offload_optimizer = 1.5}), tessera::error);
}

// The offloaded bytes are where the counters say: with everything offloaded
// under mixed precision the backend holds no main weights and no AdamW state.
BOOST_AUTO_TEST_CASE(offloaded_state_is_counted_as_host_memory) {
  comm::mpi c;
  using W = data_parallel_t<config<optim_grads_params, fsdp, mixed_precision<bf16, float>>>;
  for (auto where : {update_site::host, update_site::device}) {
    W model(c, wrapper_options{.offload_optimizer = 1.0});
    model.add_param(model.add_unit("a"), "w", shape({1000}));
    model.add_param(model.add_unit("b"), "w", shape({333}));
    model.finalize();
    BOOST_TEST(model.planned().main_weights == 0u);
    BOOST_TEST(model.planned().host_main_weights > 0u);
    const std::size_t h0 = memory_of<host_resident>().current();
    ShardedOptimizer opt(model, adamw{}, optimizer_options{.offload_update = where});
    BOOST_TEST(opt.shards().offloaded(0));
    BOOST_TEST(opt.state_bytes() == 2 * sizeof(double) + sizeof(step_control));  // the norm and the decision only
    BOOST_TEST(memory_of<host_resident>().current() - h0 == opt.offloaded_bytes());  // no decay mask: all decay
  }
}

// The device numbers the steps it applies and takes each one's learning rate
// from the host's ring: across a skipped step the schedule and the step count
// follow the applied steps, and handles read long after their step (more than
// the ring holds) still give their own results. decide() + apply() is step().
BOOST_AUTO_TEST_CASE(the_device_numbers_steps_and_late_handles_keep_their_results) {
  comm::mpi c;
  using Cfg = config<optim_grads_params, fsdp>;
  auto run = [&](bool split) {
    data_parallel_t<Cfg> m(c);
    auto u = m.add_unit("u");
    auto w = m.add_param(u, "w", {5});
    m.finalize();
    m.set_param(w, std::vector<float>(5, 1.0f));
    ShardedOptimizer opt(m, adamw{.lr = 0.01});
    opt.set_schedule([](long step, double base) { return base * double(step); });
    std::vector<step_handle<backend::host>> handles;
    for (int s = 0; s < 40; ++s) {
      {
        auto scope = m.gather(u);
        auto g = scope.grad(w);
        for (std::size_t i = 0; i < g.size(); ++i)
          g[i] = s == 3 && c.rank() == c.size() - 1 ? std::numeric_limits<float>::quiet_NaN() : 0.1f * float(i + 1);
        scope.reduce_grads();
      }
      if (split) {
        handles.push_back(opt.decide());
        BOOST_TEST(opt.decided());
        opt.apply();
      } else {
        handles.push_back(opt.step());
      }
      BOOST_TEST(!opt.decided());
    }
    for (int s = 0; s < 40; ++s) {
      const step_result& r = handles[std::size_t(s)].get();
      BOOST_TEST_CONTEXT("step " << s) {
        BOOST_TEST(r.skipped == (s == 3));
        const long applied = s < 3 ? s + 1 : s;  // step 3 skipped: later ones are numbered one lower
        BOOST_TEST(r.step == applied);
        BOOST_TEST(r.lr == (s == 3 ? 0.0 : 0.01 * double(applied)));
      }
    }
    BOOST_TEST(opt.steps() == 39);
    BOOST_TEST(opt.skipped_steps() == 1);
    return m.get_param(w);
  };
  const auto a = run(false), b = run(true);
  BOOST_TEST(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// apply() needs a decide() before it, and decide() an apply() after it; a
// checkpoint refuses a step half done.
BOOST_AUTO_TEST_CASE(decide_and_apply_alternate) {
  comm::mpi c;
  data_parallel_t<config<optim, ddp>> m(c);
  auto u = m.add_unit("u");
  auto w = m.add_param(u, "w", {3});
  m.finalize();
  ShardedOptimizer opt(m, sgd{.lr = 1.0});
  tessera_test::expect_error([&] { opt.apply(); }, "apply() without a decide()");
  {
    auto scope = m.gather(u);
    for (auto& x : scope.grad(w)) x = 1.0f;
  }
  (void)opt.decide();
  tessera_test::expect_error([&] { (void)opt.decide(); }, "decide() twice");
  tessera_test::expect_error([&] { (void)tessera::checkpoint::save(opt, "/tmp/tessera-never-written", 1); }, "decided and not applied");
  opt.apply();
  BOOST_TEST(opt.steps() == 1);
}

// What a step graph replays, [apply() of the last step, forward and
// backward, decide()], is step() shifted by half a step: the same weights
// bit for bit, with gradients that depend on the weights, updates in the
// shadow, for each strategy.
template <class Cfg>
void check_rotated_steps_equal_steps() {
  comm::mpi c;
  auto run = [&](bool rotated) {
    data_parallel_t<Cfg> m(c);
    auto u0 = m.add_unit("a"), u1 = m.add_unit("b");
    auto w0 = m.add_param(u0, "w", {7}), w1 = m.add_param(u1, "w", {5, 3});
    m.finalize();
    m.set_param(w0, std::vector<float>(7, 0.5f));
    m.set_param(w1, std::vector<float>(15, -0.25f));
    ShardedOptimizer opt(m, adamw{.lr = 0.05}, optimizer_options{.clip_norm = 0.3});
    auto forward_backward = [&] {
      for (auto [u, w] : {std::pair{u0, w0}, std::pair{u1, w1}}) {
        auto s = m.gather(u);
        const auto x = s.weight(w);
        auto g = s.grad(w);
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.5f * float(x[i]) + 0.1f * float(i + 1);
        s.reduce_grads();
      }
    };
    for (int s = 0; s < 6; ++s) {
      if (rotated) {
        if (s > 0) opt.apply();
        forward_backward();
        (void)opt.decide();
      } else {
        forward_backward();
        (void)opt.step();
      }
    }
    if (rotated) opt.apply();
    BOOST_TEST(opt.steps() == 6);
    auto a = m.get_param(w0), b = m.get_param(w1);
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const auto plain = run(false), rotated = run(true);
  BOOST_TEST_CONTEXT(Cfg::strategy::name) {
    BOOST_TEST(std::memcmp(plain.data(), rotated.data(), plain.size() * sizeof(float)) == 0);
    BOOST_TEST(plain[0] != 0.5f);  // it trained
  }
}
BOOST_AUTO_TEST_CASE(rotated_steps_equal_steps) {
  check_rotated_steps_equal_steps<config<no_shard, ddp>>();
  check_rotated_steps_equal_steps<config<optim, ddp>>();
  check_rotated_steps_equal_steps<config<optim_grads, fsdp>>();
  check_rotated_steps_equal_steps<config<optim_grads_params, fsdp>>();
  check_rotated_steps_equal_steps<config<optim_grads_params, fsdp2, mixed_precision<bf16, float>>>();
}
