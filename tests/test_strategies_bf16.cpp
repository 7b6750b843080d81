// Every strategy and wrapper with bf16 compute weights (fp32 main weights and
// gradients), and with a bf16 reduction wire, against single-rank no_shard.
#define BOOST_TEST_MODULE tessera_strategies_bf16
#include "common/mpi_test_main.hpp"
#include "common/strategy_suite.hpp"

using namespace tessera;
using MP = mixed_precision<bf16, float>;
using MPW = mixed_precision<bf16, float, float, bf16>;
using configs = std::tuple<
    config<no_shard, ddp, MP>, config<optim, ddp, MP>, config<optim_grads, ddp, MP>,
    config<no_shard, fsdp, MP>, config<optim, fsdp, MP>, config<optim_grads, fsdp, MP>, config<optim_grads_params, fsdp, MP>,
    config<optim_grads_params, fsdp, MPW>, config<optim, ddp, MPW, post_divide>, config<no_shard, ddp, MPW, pre_divide>,
    config<optim_grads, fsdp, MPW, sum>, config<optim_grads_params, fsdp2, MP>, config<optim_grads_params, fsdp2, MPW>,
    config<optim_grads_params, fsdp2, MPW, pre_divide>>;

BOOST_AUTO_TEST_CASE_TEMPLATE(matches_single_rank_no_shard, Cfg, configs) {
  comm::mpi c;
  tessera_test::check_matches_single_rank_no_shard<Cfg>(c);
}
