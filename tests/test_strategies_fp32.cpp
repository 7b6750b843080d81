// Every strategy and wrapper in fp32 (and every averaging policy on a few)
// against single-rank no_shard. bf16 lives in test_strategies_bf16.cpp so the
// two halves compile in parallel.
#define BOOST_TEST_MODULE tessera_strategies_fp32
#include "common/mpi_test_main.hpp"
#include "common/init_suite.hpp"
#include "common/strategy_suite.hpp"

using namespace tessera;
using F = full_precision<float>;
using configs = std::tuple<
    config<no_shard, ddp, F>, config<optim, ddp, F>, config<optim_grads, ddp, F>,
    config<no_shard, fsdp, F>, config<optim, fsdp, F>, config<optim_grads, fsdp, F>, config<optim_grads_params, fsdp, F>,
    config<optim_grads_params, fsdp, F, pre_divide>, config<optim_grads_params, fsdp, F, post_divide>,
    config<optim_grads_params, fsdp, F, sum>, config<optim_grads, ddp, F, pre_divide>, config<optim, ddp, F, sum>,
    config<no_shard, ddp, F, post_divide>, config<no_shard, fsdp, F, sum>,
    config<optim_grads_params, fsdp2, F>, config<optim_grads_params, fsdp2, F, pre_divide>,
    config<optim_grads_params, fsdp2, F, post_divide>, config<optim_grads_params, fsdp2, F, sum>>;

BOOST_AUTO_TEST_CASE_TEMPLATE(matches_single_rank_no_shard, Cfg, configs) {
  comm::mpi c;
  tessera_test::check_matches_single_rank_no_shard<Cfg>(c);
}

// The single-rank fp32 run itself against plain float64 arithmetic.
BOOST_AUTO_TEST_CASE(single_rank_matches_float64_oracle) {
  comm::local<> solo;
  tessera_test::run_params p;
  for (int alg = 0; alg < 2; ++alg) {
    const auto got = alg == 0 ? tessera_test::train<config<no_shard, ddp, F, sum>>(solo, tessera_test::test_adamw(), p)
                              : tessera_test::train<config<no_shard, ddp, F, sum>>(solo, tessera_test::test_sgd(), p);
    const auto ref = alg == 0 ? tessera_test::train_reference_f64(tessera_test::test_adamw(), p)
                              : tessera_test::train_reference_f64(tessera_test::test_sgd(), p);
    BOOST_TEST_CONTEXT((alg ? "sgd" : "adamw")) {
      BOOST_TEST(tessera_test::max_rel_diff(got, ref) <= 2e-6);
      for (std::size_t s = 0; s < ref.grad_norms.size(); ++s)
        BOOST_TEST(std::abs(got.grad_norms[s] - ref.grad_norms[s]) <= 1e-5 * ref.grad_norms[s]);
    }
  }
}

// init_param (tests/common/init_suite.hpp): the same bits at every world size.
using init_configs = std::tuple<config<no_shard, ddp, F>, config<optim, ddp, F>, config<optim_grads, fsdp, F>,
                                config<optim_grads_params, fsdp, F>, config<optim_grads_params, fsdp2, F>,
                                config<optim_grads_params, fsdp, mixed_precision<bf16, float>>,
                                config<optim, ddp, mixed_precision<bf16, float>>,
                                config<optim_grads_params, fsdp2, mixed_precision<bf16, float>>>;
BOOST_AUTO_TEST_CASE_TEMPLATE(init_param_is_the_same_at_every_world_size, Cfg, init_configs) {
  comm::mpi c;
  tessera_test::check_init_param<Cfg>(c);
  // Different names and seeds give different streams.
  const init::normal normal{.seed = 7, .stdev = 0.02}, other_seed{.seed = 8, .stdev = 0.02};
  BOOST_TEST(normal.value(key_of("embed.wte"), 0) != normal.value(key_of("embed.wpe"), 0));
  BOOST_TEST(normal.value(key_of("embed.wte"), 0) != other_seed.value(key_of("embed.wte"), 0));
}

// The normal initializer's moments on a million draws (a broken mixer shows
// as a biased mean or a wrong spread).
BOOST_AUTO_TEST_CASE(normal_initializer_moments) {
  const init::normal n{.seed = 3, .stdev = 2.0, .mean = 1.0};
  double s = 0, s2 = 0;
  const int N = 1 << 20;
  for (int i = 0; i < N; ++i) {
    const double v = n.value(key_of("x"), std::size_t(i));
    s += v, s2 += v * v;
  }
  const double mean = s / N, var = s2 / N - mean * mean;
  BOOST_TEST(std::abs(mean - 1.0) < 0.01);
  BOOST_TEST(std::abs(std::sqrt(var) - 2.0) < 0.01);
}
