// Hybrid sharding on a mesh of R replica groups x S shard-group ranks: every
// valid (strategy, wrapper, outer policy) in fp32 (each averaging policy on
// some), several with bf16 compute and a bf16 wire, on every mesh
// the world size allows (1 x N, ..., N x 1), with accumulation, clipping,
// lent shards, uneven batches and tensors smaller than S, equals single-rank
// no_shard. Also: a bad shard group size fails on every rank, and get_param
// and the checkpoints see the whole model from any mesh.
#define BOOST_TEST_MODULE tessera_mesh
#include "common/mpi_test_main.hpp"
#include "common/strategy_suite.hpp"

#include <csignal>
#include <memory>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

using namespace tessera;
using F = full_precision<float>;
using MP = mixed_precision<bf16, float>;
using MPW = mixed_precision<bf16, float, float, bf16>;
using HF = outer<optim>;
using configs = std::tuple<
    // HSDP (outer<no_shard>, the default) with each strategy and wrapper
    config<no_shard, ddp, F>, config<optim, ddp, F, post_divide>, config<optim_grads, ddp, F>,
    config<optim_grads_params, fsdp, F>, config<optim_grads_params, fsdp, F, pre_divide>,
    config<optim_grads_params, fsdp2, F, sum>, config<optim_grads_params, fsdp, MPW>,
    config<optim_grads_params, fsdp2, MP>, config<no_shard, fsdp, F, sum>, config<optim, fsdp, F>,
    config<optim_grads, fsdp, F, post_divide>,
    // HFSDP (outer<optim>)
    config<optim_grads, ddp, F, HF>, config<optim_grads, fsdp, F, HF, sum>, config<optim_grads_params, fsdp, F, HF>,
    config<optim_grads_params, fsdp, F, HF, pre_divide>, config<optim_grads_params, fsdp, F, HF, post_divide>,
    config<optim_grads_params, fsdp, MP, HF>, config<optim_grads_params, fsdp, MPW, HF, sum>>;

BOOST_AUTO_TEST_CASE_TEMPLATE(matches_single_rank_no_shard_on_every_mesh, Cfg, configs) {
  comm::mpi world;
  for (int S = 1; S <= world.size(); ++S) {
    if (world.size() % S) continue;
    auto m = comm::make_mesh(world, S);
    BOOST_TEST_CONTEXT("mesh " << m.replicas() << " x " << S << " (" << Cfg::outer_type::name << " outside)") {
      tessera_test::check_matches_single_rank_no_shard<Cfg>(m);
    }
  }
}

// A shard group size that does not divide the world, is 0, or differs
// between ranks: the same error on every rank, nobody left waiting.
BOOST_AUTO_TEST_CASE(bad_shard_group_size_fails_everywhere) {
  comm::mpi world;
  const int N = world.size();
  auto fails = [&](int S, const char* what) {
    try {
      (void)comm::make_mesh(world, S);
    } catch (const tessera::error& e) {
      BOOST_TEST_MESSAGE(e.what());
      BOOST_TEST(std::string(e.what()).find(what) != std::string::npos);
      return;
    }
    BOOST_ERROR("make_mesh(" << S << ") on " << N << " ranks did not fail");
  };
  fails(0, "does not divide the world");
  if (N > 1) fails(N + 1, "does not divide the world");
  if (N > 1) fails(world.rank() == 0 ? 1 : N, "ranks disagree on the shard group size");
  // After the failures the world still works, and a good mesh still forms.
  auto m = comm::make_mesh(world, N);
  BOOST_TEST(m.world_rank() == world.rank());
  BOOST_TEST(m.world_size() == N);
}

// The wrappers built on a mesh hold its communicators: the mesh counts them,
// and destroying it first ends the process with a tessera: line (checked in
// a forked child, which makes no MPI call) instead of calling through freed
// communicators.
BOOST_AUTO_TEST_CASE(a_mesh_outlives_its_wrappers) {
  comm::mpi world;
  auto m = comm::make_mesh(world, world.size());
  BOOST_TEST(m.users.count() == 0);
  {
    FullyShardedDataParallel<config<optim_grads_params, fsdp>> a(m);
    DistributedDataParallel<config<no_shard, ddp>> b(m);
    BOOST_TEST(m.users.count() == 2);
  }
  BOOST_TEST(m.users.count() == 0);
  int pipe_fd[2];
  BOOST_REQUIRE(::pipe(pipe_fd) == 0);
  const pid_t child = ::fork();
  BOOST_REQUIRE(child >= 0);
  if (child == 0) {
    ::dup2(pipe_fd[1], 2);
    auto users = std::make_unique<comm::detail::mesh_users>();
    comm::detail::mesh_users::claim c(*users);
    users.reset();  // the mesh goes first
    ::_exit(0);     // not reached
  }
  ::close(pipe_fd[1]);
  std::string said;
  char buf[512];
  for (ssize_t n; (n = ::read(pipe_fd[0], buf, sizeof buf)) > 0;) said.append(buf, std::size_t(n));
  ::close(pipe_fd[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  BOOST_TEST((WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT));
  BOOST_TEST(said.find("tessera: a comm::mesh was destroyed or replaced while 1 wrapper(s)") != std::string::npos, said);
}

// Replica groups that registered different models fail at finalize on every rank.
BOOST_AUTO_TEST_CASE(replicas_that_disagree_fail_at_finalize) {
  comm::mpi world;
  if (world.size() < 2) return;
  auto m = comm::make_mesh(world, 1);  // N replica groups of one rank
  FullyShardedDataParallel<config<optim_grads_params, fsdp, F>> model(m);
  const auto u = model.add_unit("u");
  (void)model.add_param(u, "w", shape({m.replica.rank() == 0 ? 4 : 5}));
  BOOST_CHECK_EXCEPTION(model.finalize(), tessera::error, [](const tessera::error& e) {
    return std::string(e.what()).find("replica groups of the mesh disagree") != std::string::npos;
  });
}

// A non-finite gradient on the last rank only skips the step on every rank
// of every mesh, HSDP and HFSDP alike; the other steps apply everywhere.
using skip_configs = std::tuple<config<optim_grads_params, fsdp, F>, config<optim_grads_params, fsdp, F, HF>,
                                config<optim_grads, ddp, F, HF>, config<no_shard, ddp, F>>;
BOOST_AUTO_TEST_CASE_TEMPLATE(nonfinite_gradient_skips_everywhere, Cfg, skip_configs) {
  comm::mpi world;
  for (int S = 1; S <= world.size(); ++S) {
    if (world.size() % S) continue;
    auto m = comm::make_mesh(world, S);
    tessera_test::run_params p;
    p.global_samples = 2 * world.size();
    p.nonfinite_at_step1_on_last_rank = true;
    BOOST_TEST_CONTEXT("mesh " << m.replicas() << " x " << S << ", " << Cfg::strategy::name << " / outer "
                               << Cfg::outer_type::name) {
      tessera_test::check_only_step1_skipped(tessera_test::train<Cfg>(m.shard, tessera_test::test_adamw(), p, &m));
    }
  }
}

// The memory plan on a mesh: outer<optim> holds 1/R of the main weights and
// the optimizer's range, plus the part it reduces into; outer<no_shard> the
// same as one shard group alone.
BOOST_AUTO_TEST_CASE(outer_optim_divides_the_optimizer_range) {
  comm::mpi world;
  const int N = world.size();
  if (N < 2) return;
  auto flat = comm::make_mesh(world, N);       // one group of N
  auto split = comm::make_mesh(world, N / 2);  // 2 groups of N/2 (N even) or N groups of 1
  using MPC = config<optim_grads_params, fsdp, MP, HF>;
  auto build = [](auto& model) {
    const auto u = model.add_unit("u");
    (void)model.add_param(u, "w", shape({1000, 3}));
    model.finalize();
    return std::make_pair(model.shards().opt_range(0).second, model.planned().main_weights);
  };
  FullyShardedDataParallel<MPC> a(flat), b(split);
  const auto [na, ma] = build(a);
  const auto [nb, mb] = build(b);
  const std::size_t R = std::size_t(split.replicas());
  BOOST_TEST(a.replicas() == 1);
  BOOST_TEST(b.replicas() == int(R));
  // The same 3000 elements over N ranks in both: N/2 x 2 parts or N x 1.
  BOOST_TEST(nb * std::size_t(b.world()) * R >= 3000u);
  BOOST_TEST(na * std::size_t(N) >= 3000u);
  BOOST_TEST(nb <= na + 16 * R);  // equal up to the alignment padding
  BOOST_TEST(mb == nb * sizeof(float));
  BOOST_TEST(ma == na * sizeof(float));
}
