// The strategy property on the CUDA backend: every strategy and wrapper matches
// single-rank no_shard (comm::local<cuda>) over MPI staged through the host
// (several ranks share the one GPU) and over NCCL at world size 1; fp32 on the
// GPU matches the host backend within 1e-6 relative.
#define BOOST_TEST_MODULE tessera_strategies_cuda
#include "common/mpi_test_main.hpp"
#include "common/strategy_suite.hpp"

using namespace tessera;
using B = backend::cuda;
using F = full_precision<float>;
using MP = mixed_precision<bf16, float>;
using MPW = mixed_precision<bf16, float, float, bf16>;
using fp32_configs = std::tuple<
    config<no_shard, ddp, F, average_in_collective, B>, config<optim, ddp, F, average_in_collective, B>,
    config<optim_grads, ddp, F, average_in_collective, B>, config<no_shard, fsdp, F, average_in_collective, B>,
    config<optim, fsdp, F, average_in_collective, B>, config<optim_grads, fsdp, F, average_in_collective, B>,
    config<optim_grads_params, fsdp, F, average_in_collective, B>, config<optim_grads_params, fsdp, F, pre_divide, B>,
    config<optim_grads, ddp, F, post_divide, B>, config<optim_grads_params, fsdp, F, sum, B>>;
using bf16_configs = std::tuple<
    config<no_shard, ddp, MP, average_in_collective, B>, config<optim, ddp, MP, average_in_collective, B>,
    config<optim_grads, fsdp, MP, average_in_collective, B>, config<optim_grads_params, fsdp, MP, average_in_collective, B>,
    config<optim_grads_params, fsdp, MPW, average_in_collective, B>, config<optim, fsdp, MPW, post_divide, B>>;

BOOST_AUTO_TEST_CASE_TEMPLATE(fp32_matches_single_rank_no_shard, Cfg, fp32_configs) {
  comm::mpi_device c;
  tessera_test::check_matches_single_rank_no_shard<Cfg>(c);
  if (c.size() == 1) {  // NCCL refuses two ranks on one GPU: world size 1 only here
    comm::nccl n;
    tessera_test::check_matches_single_rank_no_shard<Cfg>(n);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(bf16_matches_single_rank_no_shard, Cfg, bf16_configs) {
  comm::mpi_device c;
  tessera_test::check_matches_single_rank_no_shard<Cfg>(c);
  if (c.size() == 1) {
    comm::nccl n;
    tessera_test::check_matches_single_rank_no_shard<Cfg>(n);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(fp32_gpu_matches_host_backend, Cfg, fp32_configs) {
  comm::mpi_device dc;
  comm::mpi hc;
  tessera_test::run_params p;
  p.global_samples = std::is_same_v<typename Cfg::averaging, tessera::sum> ? 7 : 2 * dc.size();
  const auto gpu = tessera_test::train<Cfg>(dc, tessera_test::test_adamw(), p);
  const auto cpu = tessera_test::train<tessera_test::on_backend<Cfg, backend::host>>(hc, tessera_test::test_adamw(), p);
  BOOST_TEST_CONTEXT(Cfg::strategy::name << " / " << Cfg::wrapper::name << " rank " << dc.rank() << " of " << dc.size()) {
    BOOST_TEST(tessera_test::max_rel_diff(gpu, cpu) <= 1e-6);
  }
}
