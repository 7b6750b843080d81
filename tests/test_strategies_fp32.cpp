// Every strategy and wrapper in fp32 (and every averaging policy on a few)
// against single-rank no_shard. bf16 lives in test_strategies_bf16.cpp so the
// two halves compile in parallel.
#define BOOST_TEST_MODULE tessera_strategies_fp32
#include "common/mpi_test_main.hpp"
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
