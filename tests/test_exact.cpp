// exact_reduction (policy/reduction.hpp): the same bits at any world size.
//
// One mpirun of W ranks trains the same model in groups of k ranks for every
// k that divides W (split communicators, each group a world of its own), on
// the same fixed micro-batches: K per step, rank r of a group takes r, r + k,
// ... Every group of every k must end with byte-identical weights and
// gradient norms, for every strategy and wrapper, fp32 and bf16 compute.
// Then: the exact gradients against a long-double reference on addends with
// a 1e-8 ... 1e2 dynamic range (at least as accurate as a float32 sum), and
// gradients beyond the fixed-point range (the step is skipped on every rank,
// the range adapts, and the next step applies).
#define BOOST_TEST_MODULE tessera_exact
#include "common/mpi_test_main.hpp"
#include "common/training_harness.hpp"

#include <cstring>

using namespace tessera;
using F = full_precision<float>;
using X = mixed_precision<bf16, float>;
using E = exact_reduction;
using configs = std::tuple<
    config<no_shard, ddp, F, sum, E>, config<optim, ddp, F, sum, E>, config<optim_grads, ddp, F, sum, E>,
    config<no_shard, fsdp, F, sum, E>, config<optim, fsdp, F, sum, E>, config<optim_grads, fsdp, F, sum, E>,
    config<optim_grads_params, fsdp, F, sum, E>, config<optim_grads_params, fsdp2, F, sum, E>,
    config<no_shard, ddp, X, sum, E>, config<optim_grads, ddp, X, sum, E>, config<optim_grads_params, fsdp, X, sum, E>,
    config<optim_grads_params, fsdp2, X, sum, E>>;

namespace {

constexpr int K = 12;  // micro-batches per step, over every rank: divisible by 1, 2, 3, 4 and 6

// Micro-batch j's gradient of element i: a weight-dependent term (so an
// update that differs shows in later gradients) at a magnitude anywhere in
// 1e-8 ... 1e2.
double addend(int step, int j, int u, int t, std::size_t i, double w) {
  const double mag = std::pow(10.0, -8.0 + 10.0 * (0.5 + 0.5 * tessera_test::uniform(step, j, u, t, i, 3)));
  return mag * (tessera_test::uniform(step, j, u, t, i, 4) + 0.5 * w);
}

struct outcome {
  std::vector<unsigned char> bytes;  // every parameter's main weights, then every step's norm and skip flag
  long skipped = 0;
};

// Trains Cfg over c for `steps` steps of K micro-batches; `big` puts one
// gradient of 2^20 into micro-batch 5 of steps 0 and 1 (beyond the initial
// fixed-point range of 2^16).
template <class Cfg, class Comm>
outcome run(Comm& c, int steps, bool big = false, comm::mesh<Comm>* mesh = nullptr) {
  using W = data_parallel_t<Cfg>;
  using G = typename W::grad_type;
  using ops = backend_ops<typename Cfg::backend_type>;
  std::optional<W> holder;  // over the mesh where given (c unused then)
  if (mesh) holder.emplace(*mesh);
  else holder.emplace(c);
  W& model = *holder;
  const auto [units, params] = tessera_test::build_awkward(model);
  ShardedOptimizer opt(model, tessera_test::test_adamw(), optimizer_options{.clip_norm = 0.05});
  const int N = mesh ? mesh->world_size() : c.size(), r = mesh ? mesh->world_rank() : c.rank(), per = K / N;
  BOOST_REQUIRE(K % N == 0);
  outcome out;
  auto put = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    out.bytes.insert(out.bytes.end(), b, b + n);
  };
  for (int step = 0; step < steps; ++step) {
    for (int m = 0; m < per; ++m) {
      const int j = r + m * N;  // the global micro-batch
      model.begin_micro_batch(m, per);
      for (std::size_t u = units.size(); u-- > 0;) {
        auto s = model.gather(units[u]);
        for (std::size_t t = 0; t < params[u].size(); ++t) {
          auto wd = s.weight(params[u][t]);
          auto gd = s.grad(params[u][t]);
          std::vector<typename W::compute_type> w(wd.size());
          std::vector<G> g(gd.size());
          ops::copy_to_host(std::span(w), wd);
          ops::copy_to_host(std::span(g), std::span<const G>(gd));
          for (std::size_t i = 0; i < g.size(); ++i)  // accumulate, as a trainer does (exact: zero every micro-batch)
            g[i] = convert<G>(convert<double>(g[i]) + addend(step, j, int(u), int(t), i, convert<double>(w[i])));
          if (big && step < 2 && j == 5 && u == 2 && t == 0) g[7] = convert<G>(1048576.0);
          ops::copy_from_host(gd, std::span<const G>(g));
        }
        s.reduce_grads();
      }
    }
    const step_result res = opt.step();
    put(&res.grad_norm, sizeof res.grad_norm);
    const char sk = res.skipped;
    put(&sk, 1);
  }
  out.skipped = opt.skipped_steps();
  for (auto& pu : params)
    for (auto pid : pu) {
      const auto v = model.get_param(pid);
      put(v.data(), v.size() * sizeof(v[0]));
    }
  return out;
}

std::uint64_t hash_of(const std::vector<unsigned char>& b) { return tessera::checksum64::of(b.data(), b.size()); }

// Runs f(group communicator) in groups of k ranks for each k dividing the
// world (and K); every group's hash must equal the single-rank group's.
template <class F>
void across_group_sizes(F&& f) {
  comm::mpi world;
  const int W = world.size();
  std::int64_t reference = 0;
  for (int k = 1; k <= W; ++k) {
    if (W % k != 0 || K % k != 0) continue;
    comm::mpi group = world.split(world.rank() / k, world.rank());
    const std::int64_t h = std::int64_t(f(group));
    std::vector<std::int64_t> all(static_cast<std::size_t>(W));
    comm::all_gather_host(world, std::span<const std::int64_t>(&h, 1), std::span<std::int64_t>(all));
    if (k == 1) reference = all[0];
    BOOST_TEST_CONTEXT("groups of " << k << " ranks") {
      for (int q = 0; q < W; ++q) BOOST_TEST(all[std::size_t(q)] == reference, "rank " << q);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(same_bits_at_every_world_size, Cfg, configs) {
  across_group_sizes([](comm::mpi& g) { return hash_of(run<Cfg>(g, 3).bytes); });
}

// Meshes of R replica groups x S ranks (HSDP, HFSDP) give the single rank's
// bits too: the reduction across replicas sums the same integer limbs.
using mesh_configs = std::tuple<config<optim_grads_params, fsdp, F, sum, E>, config<no_shard, ddp, F, sum, E>,
                                config<optim_grads_params, fsdp, X, sum, E, outer<optim>>,
                                config<optim_grads, fsdp, F, sum, E, outer<optim>>,
                                config<optim_grads_params, fsdp2, X, sum, E>>;
BOOST_AUTO_TEST_CASE_TEMPLATE(meshes_give_the_same_bits, Cfg, mesh_configs) {
  comm::mpi world;
  const int W = world.size();
  if (K % W != 0) return;
  comm::mpi solo = world.split(world.rank(), 0);
  std::int64_t reference = std::int64_t(hash_of(run<Cfg>(solo, 3).bytes));
  for (int S = 1; S < W; ++S) {
    if (W % S != 0) continue;
    auto m = comm::make_mesh(world, S);
    const std::int64_t h = std::int64_t(hash_of(run<Cfg>(world, 3, false, &m).bytes));
    std::vector<std::int64_t> all(static_cast<std::size_t>(W));
    comm::all_gather_host(world, std::span<const std::int64_t>(&h, 1), std::span<std::int64_t>(all));
    BOOST_TEST_CONTEXT("mesh " << W / S << " x " << S) {
      for (int q = 0; q < W; ++q) BOOST_TEST(all[std::size_t(q)] == reference, "rank " << q);
    }
  }
}

// With an averaging policy the exact sum is divided by N once, so a world
// size gives its own bits (the trainer's scaling depends on N then too), but
// every strategy and wrapper at that N gives the same ones.
BOOST_AUTO_TEST_CASE(averaging_policies_agree_across_strategies) {
  comm::mpi c;
  if (K % c.size() != 0) return;
  const auto a = hash_of(run<config<no_shard, ddp, F, E>>(c, 2).bytes);
  BOOST_TEST(a == hash_of(run<config<optim, fsdp, F, E>>(c, 2).bytes));
  BOOST_TEST(a == hash_of(run<config<optim_grads_params, fsdp, F, E, post_divide>>(c, 2).bytes));
  BOOST_TEST(a == hash_of(run<config<optim_grads_params, fsdp2, F, E, pre_divide>>(c, 2).bytes));
}

// The float path on the same micro-batches differs across world sizes
// (the test above would catch a plain float sum), while exact does not.
BOOST_AUTO_TEST_CASE(float_reduction_differs_across_world_sizes) {
  comm::mpi world;
  if (world.size() < 2 || K % world.size() != 0) return;
  comm::mpi solo = world.split(world.rank(), 0);
  const auto one = world.rank() == 0 ? hash_of(run<config<optim_grads_params, fsdp, F, sum>>(solo, 2).bytes) : 0;
  const auto all = hash_of(run<config<optim_grads_params, fsdp, F, sum>>(world, 2).bytes);
  if (world.rank() == 0) BOOST_TEST(one != all);
}

// Gradients beyond the grid's range: the step is skipped on every rank of
// every world size alike, the scale adapts, and the next step applies.
BOOST_AUTO_TEST_CASE(out_of_range_gradients_skip_and_adapt) {
  across_group_sizes([](comm::mpi& g) {
    const auto o = run<config<optim_grads_params, fsdp, F, sum, E>>(g, 3, /*big=*/true);
    BOOST_TEST(o.skipped == 1);  // step 0; step 1 has the same gradient and fits the adapted range
    return hash_of(o.bytes);
  });
  across_group_sizes([](comm::mpi& g) {
    const auto o = run<config<no_shard, ddp, F, sum, E>>(g, 3, /*big=*/true);
    BOOST_TEST(o.skipped == 1);
    return hash_of(o.bytes);
  });
}

// The exact gradients against a long-double sum of the same float addends:
// within a float's rounding of the exact value (plus the grid's 2^-66 of
// the unit's largest addend per addend), and no worse than a float32 sum.
using accuracy_configs = std::tuple<config<no_shard, ddp, F, sum, E>, config<optim_grads_params, fsdp, F, sum, E>>;
BOOST_AUTO_TEST_CASE_TEMPLATE(gradients_as_accurate_as_a_float32_sum, Cfg, accuracy_configs) {
  comm::mpi c;
  if (K % c.size() != 0) return;
  using W = data_parallel_t<Cfg>;
  W model(c);
  const auto u0 = model.add_unit("u");
  const std::size_t n = 1000;
  const auto p = model.add_param(u0, "w", shape({n}), true);
  model.finalize();
  const int N = c.size(), r = c.rank(), per = K / N;
  // Two steps: the first sets the grid from its largest addend, the second is checked.
  for (int step = 0; step < 2; ++step) {
    for (int m = 0; m < per; ++m) {
      model.begin_micro_batch(m, per);
      auto s = model.gather(u0);
      auto g = s.grad(p);
      for (std::size_t i = 0; i < n; ++i) g[i] = float(addend(0, r + m * N, 0, 0, i, 0.0));
      s.reduce_grads();
    }
    model.finish_grad_sync();
    if (step == 0) model.zero_grad();
  }
  const auto view = model.shards();
  const auto got = view.norm_grads(0);
  const std::size_t lo = model.shards().layout(0).shard_begin(r);
  double worst_exact = 0, worst_float = 0, largest = 0;
  for (int j = 0; j < K; ++j)
    for (std::size_t i = 0; i < n; ++i) largest = std::max(largest, std::abs(double(float(addend(0, j, 0, 0, i, 0.0)))));
  for (std::size_t e = 0; e < got.size(); ++e) {
    const std::size_t i = lo + e;
    if (i >= n) break;  // padding
    long double ref = 0;
    float f32 = 0;
    for (int j = 0; j < K; ++j) {
      const float a = float(addend(0, j, 0, 0, i, 0.0));
      ref += a;
      f32 += a;
    }
    const double err = std::abs(double(got[e]) - double(ref));
    BOOST_TEST(err <= 0x1p-24 * std::abs(double(ref)) + K * largest * 0x1p-60, "element " << i << ": " << got[e]
                                                                                       << " against " << double(ref));
    worst_exact = std::max(worst_exact, err / std::abs(double(ref)));
    worst_float = std::max(worst_float, std::abs(double(f32) - double(ref)) / std::abs(double(ref)));
  }
  BOOST_TEST(worst_exact <= worst_float);
  BOOST_TEST(worst_exact <= 0x1p-24);
}

// One rank, one micro-batch: each sum has a single addend, passed through
// bit for bit (even where the grid could not hold it); a non-finite one
// still skips the step.
BOOST_AUTO_TEST_CASE(one_addend_is_its_own_sum) {
  comm::local<> solo;
  data_parallel_t<config<optim_grads_params, fsdp, F, sum, E>> model(solo);
  const auto u0 = model.add_unit("u");
  const std::size_t n = 100;
  const auto p = model.add_param(u0, "w", shape({n}), true);
  model.finalize();
  ShardedOptimizer opt(model, tessera_test::test_adamw());
  for (int step = 0; step < 2; ++step) {
    std::vector<float> want(n);
    for (std::size_t i = 0; i < n; ++i) want[i] = float(addend(step, 0, 0, 0, i, 0.0) * (i == 3 ? 1e-30 : 1.0));
    if (step == 1) want[5] = std::numeric_limits<float>::quiet_NaN();
    model.begin_micro_batch(0, 1);
    {
      auto s = model.gather(u0);
      auto g = s.grad(p);
      std::copy(want.begin(), want.end(), g.begin());
      s.reduce_grads();
    }
    model.finish_grad_sync();
    const auto got = model.shards().norm_grads(0);
    for (std::size_t i = 0; i < n; ++i)
      if (i != 5 || step == 0) BOOST_TEST(std::memcmp(&got[i], &want[i], sizeof(float)) == 0, "element " << i);
    const step_result r = opt.step();
    BOOST_TEST(r.skipped == (step == 1));
  }
}
