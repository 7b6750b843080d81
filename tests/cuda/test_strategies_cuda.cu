// The strategy property on the CUDA backend: every strategy and wrapper matches
// single-rank no_shard (comm::local<cuda>) over MPI staged through the host
// (several ranks may share one GPU) and over NCCL wherever each rank has its
// own GPU (always at world size 1); fp32 on the GPU matches the host backend
// within 1e-6 relative. Step graphs give the eager steps' bits and refuse
// what they cannot capture.
#define BOOST_TEST_MODULE tessera_strategies_cuda
#include "common/mpi_test_main.hpp"
#include "common/init_suite.hpp"
#include "common/staged_gather.hpp"
#include "common/strategy_suite.hpp"
#include "tessera/optim/step_graph.cuh"

using namespace tessera;
using B = backend::cuda;

namespace {
// One GPU per rank where there are enough (then NCCL can run at this world
// size too); otherwise every rank shares device 0 through staged MPI.
struct pick_device {
  pick_device() {
    int n = 0;
    cudaGetDeviceCount(&n);
    if (n > 0) cudaSetDevice(tessera_test::world_rank() % n);
  }
};
BOOST_TEST_GLOBAL_FIXTURE(pick_device);

bool nccl_possible(int world) {
  int n = 0;
  cudaGetDeviceCount(&n);
  return world == 1 || n >= world;  // NCCL refuses two ranks on one GPU
}
}  // namespace
using F = full_precision<float>;
using MP = mixed_precision<bf16, float>;
using MPW = mixed_precision<bf16, float, float, bf16>;
using fp32_configs = std::tuple<
    config<no_shard, ddp, F, average_in_collective, B>, config<optim, ddp, F, average_in_collective, B>,
    config<optim_grads, ddp, F, average_in_collective, B>, config<no_shard, fsdp, F, average_in_collective, B>,
    config<optim, fsdp, F, average_in_collective, B>, config<optim_grads, fsdp, F, average_in_collective, B>,
    config<optim_grads_params, fsdp, F, average_in_collective, B>, config<optim_grads_params, fsdp, F, pre_divide, B>,
    config<optim_grads, ddp, F, post_divide, B>, config<optim_grads_params, fsdp, F, sum, B>,
    config<optim_grads_params, fsdp2, F, average_in_collective, B>, config<optim_grads_params, fsdp2, F, pre_divide, B>>;
using bf16_configs = std::tuple<
    config<no_shard, ddp, MP, average_in_collective, B>, config<optim, ddp, MP, average_in_collective, B>,
    config<optim_grads, fsdp, MP, average_in_collective, B>, config<optim_grads_params, fsdp, MP, average_in_collective, B>,
    config<optim_grads_params, fsdp, MPW, average_in_collective, B>, config<optim, fsdp, MPW, post_divide, B>,
    config<optim_grads_params, fsdp2, MP, average_in_collective, B>, config<optim_grads_params, fsdp2, MPW, sum, B>>;

// Over staged MPI at every world size, and over NCCL where it can run.
template <class Cfg>
void check_on_every_transport() {
  comm::mpi_device c;
  tessera_test::check_matches_single_rank_no_shard<Cfg>(c);
  if (nccl_possible(c.size())) {
    comm::mpi boot;
    comm::nccl n(boot);
    tessera_test::check_matches_single_rank_no_shard<Cfg>(n);
    // Gather buffers and parameter shards in symmetric windows, all-gathers on copy engines.
    if constexpr (Cfg::strategy::shards_params)
      if (c.size() > 1) {
        comm::nccl ce(boot, comm::nccl_options{.copy_engine_gathers = true});
        tessera_test::check_matches_single_rank_no_shard<Cfg>(ce);
      }
  }
}

// An all-gather between symmetric windows (copy engines) delivers every rank's piece.
// init_param on the device (tests/common/init_suite.hpp): each rank's
// elements drawn in a kernel equal the host's draws, at every world size.
using init_configs = std::tuple<config<no_shard, ddp, F, average_in_collective, B>,
                                config<optim, ddp, F, average_in_collective, B>,
                                config<optim_grads_params, fsdp, F, average_in_collective, B>,
                                config<optim_grads_params, fsdp2, MP, average_in_collective, B>,
                                config<optim, fsdp, MPW, post_divide, B>>;
BOOST_AUTO_TEST_CASE_TEMPLATE(init_param_on_the_device_is_the_hosts, Cfg, init_configs) {
  comm::mpi_device c;
  tessera_test::check_init_param<Cfg>(c);
}

// init::normal drawn on the device against the host's draws over 2^24
// elements: Box-Muller in double through CUDA's log, sqrt and cos and
// glibc's agree to about 1e-16, so after rounding to float they are equal
// except where a value lands that close to a rounding boundary (then one float
// ulp apart; a few in 10^8 are expected). Printed, and held to that.
BOOST_AUTO_TEST_CASE(device_normals_round_like_the_hosts) {
  const std::size_t n = std::size_t(1) << 24;
  const init::normal normal{.seed = 11, .stdev = 0.02};
  const auto key = key_of("block7.fc.w");
  tessera::cuda::buffer<float> d(n);
  cudaEvent_t t0, t1;
  TESSERA_CUDA(cudaEventCreate(&t0));
  TESSERA_CUDA(cudaEventCreate(&t1));
  TESSERA_CUDA(cudaEventRecord(t0, tessera::cuda::current_stream()));
  backend_ops<B>::for_each(n, detail::drawn_into<float, float, detail::drawn<init::normal>>{d.data(), {normal, key}, 0});
  TESSERA_CUDA(cudaEventRecord(t1, tessera::cuda::current_stream()));
  TESSERA_CUDA(cudaEventSynchronize(t1));
  float ms = 0;
  TESSERA_CUDA(cudaEventElapsedTime(&ms, t0, t1));
  std::printf("init::normal on the device: %.3f ms for %zu values\n", double(ms), n);
  std::vector<float> got(n);
  backend_ops<B>::copy_to_host(std::span<float>(got), std::span<const float>(d.data(), n));
  std::size_t differ = 0, far = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float want = normal.value(key, i);
    if (got[i] != want) ++differ, far += std::nextafter(want, got[i]) != got[i];
  }
  BOOST_TEST_MESSAGE("init::normal on the device: " << differ << " of " << n << " floats differ from the host's");
  std::printf("init::normal on the device: %zu of %zu floats differ from the host's (%zu by more than one ulp)\n",
              differ, n, far);
  BOOST_TEST(far == 0u);
  BOOST_TEST(differ <= 8u);
}

BOOST_AUTO_TEST_CASE(copy_engine_all_gather) {
  comm::mpi boot;
  if (boot.size() < 2 || !nccl_possible(boot.size())) return;
  comm::nccl plain(boot);
  BOOST_TEST(plain.alloc_symmetric(4096) == nullptr);  // not asked for: the caller allocates
  comm::nccl ce(boot, comm::nccl_options{.copy_engine_gathers = true});
  const std::size_t n = (std::size_t(3) << 20) + 5;  // elements per rank, not a round size
  auto* send = static_cast<float*>(ce.alloc_symmetric(n * sizeof(float)));
  auto* recv = static_cast<float*>(ce.alloc_symmetric(n * boot.size() * sizeof(float)));
  BOOST_REQUIRE(send != nullptr && recv != nullptr);
  std::vector<float> mine(n), all(n * std::size_t(boot.size()));
  for (std::size_t i = 0; i < n; ++i) mine[i] = float(boot.rank() * 1000003 + int(i % 997)) * 0.5f;
  TESSERA_CUDA(cudaMemcpy(send, mine.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  ce.all_gather(send, recv, n, dtype::f32);
  TESSERA_CUDA(cudaStreamSynchronize(tessera::cuda::current_stream()));
  TESSERA_CUDA(cudaMemcpy(all.data(), recv, all.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::size_t wrong = 0;
  for (int r = 0; r < boot.size(); ++r)
    for (std::size_t i = 0; i < n; ++i)
      wrong += all[std::size_t(r) * n + i] != float(r * 1000003 + int(i % 997)) * 0.5f;
  BOOST_TEST(wrong == 0u);
  ce.free_symmetric(recv);
  ce.free_symmetric(send);
  // One rank cannot allocate: every rank gets the error, nobody waits in the registration.
  const bool last = boot.rank() == boot.size() - 1;
  tessera_test::expect_error([&] { (void)ce.alloc_symmetric(last ? std::size_t(1) << 52 : 4096); },
                             last ? "ncclMemAlloc failed on this rank" : "ncclMemAlloc failed on another rank");
  void* again = ce.alloc_symmetric(4096);  // the communicator still works
  BOOST_TEST(again != nullptr);
  ce.free_symmetric(again);
}

// Host values gathered through device memory (gather_main, checkpoints' shards) in chunks of at most
// a bound: every rank's piece lands in its place, at counts and bounds that do not divide, over staged
// MPI and over NCCL where it can run.
template <class Comm>
void check_all_gather_host_in_chunks(Comm& c) {
  for (const std::size_t n : tessera_test::staged_gather_counts)
    for (const std::size_t stage : tessera_test::staged_gather_bounds)
      BOOST_TEST(tessera_test::misplaced_by_all_gather_host(c, n, stage) == 0u,
                 "n " << n << ", stage " << stage << " B, " << c.size() << " ranks");
}
BOOST_AUTO_TEST_CASE(all_gather_host_in_chunks) {
  comm::mpi_device c;
  check_all_gather_host_in_chunks(c);
  if (nccl_possible(c.size())) {
    comm::mpi boot;
    comm::nccl n(boot);
    check_all_gather_host_in_chunks(n);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(fp32_matches_single_rank_no_shard, Cfg, fp32_configs) {
  check_on_every_transport<Cfg>();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(bf16_matches_single_rank_no_shard, Cfg, bf16_configs) {
  check_on_every_transport<Cfg>();
}

BOOST_AUTO_TEST_CASE_TEMPLATE(fp32_gpu_matches_host_backend, Cfg, fp32_configs) {
  comm::mpi_device dc;
  comm::mpi hc;
  tessera_test::run_params p;
  p.global_samples = tessera_test::global_samples<Cfg>(dc.size());
  const auto gpu = tessera_test::train<Cfg>(dc, tessera_test::test_adamw(), p);
  const auto cpu = tessera_test::train<tessera_test::on_backend<Cfg, backend::host>>(hc, tessera_test::test_adamw(), p);
  BOOST_TEST_CONTEXT(Cfg::strategy::name << " / " << Cfg::wrapper::name << " rank " << dc.rank() << " of " << dc.size()) {
    BOOST_TEST(tessera_test::max_rel_diff(gpu, cpu) <= 1e-6);
  }
}

// Hybrid sharding on the device: every mesh R x S of the world, over staged
// MPI and over NCCL (ncclCommSplit) where each rank has its own GPU.
using mesh_configs = std::tuple<
    config<optim_grads_params, fsdp, F, average_in_collective, B>,
    config<optim_grads_params, fsdp, F, average_in_collective, B, outer<optim>>,
    config<optim_grads_params, fsdp, MP, average_in_collective, B, outer<optim>>,
    config<optim_grads, ddp, F, sum, B, outer<optim>>, config<optim_grads_params, fsdp2, MPW, pre_divide, B>>;

BOOST_AUTO_TEST_CASE_TEMPLATE(mesh_matches_single_rank_no_shard, Cfg, mesh_configs) {
  comm::mpi_device c;
  comm::mpi boot;
  std::optional<comm::nccl> n;
  if (nccl_possible(c.size())) n.emplace(boot);
  for (int S = 1; S <= c.size(); ++S) {
    if (c.size() % S) continue;
    BOOST_TEST_CONTEXT("mesh " << c.size() / S << " x " << S << ", outer " << Cfg::outer_type::name) {
      auto m = comm::make_mesh(c, S);
      tessera_test::check_matches_single_rank_no_shard<Cfg>(m);
      if (n) {
        auto mn = comm::make_mesh(*n, S);
        tessera_test::check_matches_single_rank_no_shard<Cfg>(mn);
      }
    }
  }
}

// ---- step graphs (optim/step_graph.cuh) ------------------------------------------

namespace {
// A backward that reads the compute weights on the device (so every step's
// gradients differ) and writes each unit's gradients from fixed memory:
// what a captured step needs. g_i = (w_i - 0.1 (i % 11)) * scale.
template <class C>
struct grad_from_weights {
  float* g;
  const C* w;
  float scale;
  __device__ void operator()(std::size_t i) const { g[i] = (convert<float>(w[i]) - 0.1f * float(i % 11)) * scale; }
};
struct graph_run_result {
  std::vector<float> weights;
  std::vector<double> norms;
  std::vector<long> steps;
  bool captured = false;
  long launches = 0;
};
// Six steps of a three-unit model (odd sizes) on one rank, clipping at 0.5,
// with step graphs on or off, from the same start.
template <class Cfg>
graph_run_result graph_run(bool graphs) {
  using C = typename Cfg::compute_type;
  comm::local<B> solo;
  data_parallel_t<Cfg> m(solo);
  const std::int64_t sizes[] = {1000, 4099, 77};
  std::vector<unit_id> units;
  std::vector<param_id> params;
  for (int u = 0; u < 3; ++u) {
    units.push_back(m.add_unit("u" + std::to_string(u)));
    params.push_back(m.add_param(units.back(), "w", {sizes[u]}));
  }
  m.finalize();
  for (int u = 0; u < 3; ++u) {
    std::vector<float> w(static_cast<std::size_t>(sizes[u]));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(tessera_test::init_value(u, 0, i));
    m.set_param(params[std::size_t(u)], w);
  }
  ShardedOptimizer opt(m, adamw{.lr = 1e-2, .weight_decay = 0.1}, optimizer_options{.clip_norm = 0.5});
  const auto fb = [&] {
    for (int u = 3; u-- > 0;) {
      auto s = m.gather(units[std::size_t(u)]);
      const auto w = s.weight(params[std::size_t(u)]);
      auto g = s.grad(params[std::size_t(u)]);
      backend_ops<B>::for_each(g.size(), grad_from_weights<C>{g.data(), w.data(), 1.0f + 0.5f * float(u)});
      s.reduce_grads();
    }
  };
  step_graph g(opt, graphs);
  std::vector<step_handle<B>> handles;
  for (int s = 0; s < 6; ++s) handles.push_back(g.step(fb));
  g.finish();
  graph_run_result r;
  for (auto& h : handles) {
    r.norms.push_back(h.get().grad_norm);
    r.steps.push_back(h.get().step);
  }
  for (auto p : params)
    for (float x : m.get_param(p)) r.weights.push_back(x);
  r.captured = g.captured();
  r.launches = g.launches();
  return r;
}
template <class Cfg>
void check_graph_equals_eager() {
  tessera::cuda::stream st;  // a graph cannot capture the legacy default stream
  graph_run_result eager, graph;
  {
    const tessera::cuda::scoped_stream on(st.get());
    eager = graph_run<Cfg>(false);
    graph = graph_run<Cfg>(true);
  }
  BOOST_TEST(!eager.captured);
  BOOST_TEST(graph.captured);
  BOOST_TEST(graph.launches == 4);  // steps 3-6 (two eager steps first)
  BOOST_TEST(graph.steps == eager.steps, boost::test_tools::per_element());
  BOOST_TEST(graph.steps.back() == 6);
  BOOST_REQUIRE(graph.norms.size() == eager.norms.size());
  for (std::size_t s = 0; s < eager.norms.size(); ++s) {
    BOOST_TEST(graph.norms[s] == eager.norms[s], boost::test_tools::tolerance(1e-12));  // atomics in the sum
    BOOST_TEST(graph.norms[s] > 0.5);  // every step clips
  }
  BOOST_REQUIRE(graph.weights.size() == eager.weights.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < eager.weights.size(); ++i) differ += graph.weights[i] != eager.weights[i];
  BOOST_TEST(differ == 0u);
}
}  // namespace

BOOST_AUTO_TEST_CASE(step_graph_gives_the_eager_steps_bits) {
  check_graph_equals_eager<config<optim_grads_params, fsdp, F, average_in_collective, B>>();
  check_graph_equals_eager<config<optim_grads_params, fsdp, MP, average_in_collective, B>>();
  check_graph_equals_eager<config<no_shard, ddp, MP, average_in_collective, B>>();
}

// What a step graph cannot capture is refused when it is made, with the reason.
BOOST_AUTO_TEST_CASE(step_graph_refusals_are_clear_errors) {
  using Cfg = config<optim_grads_params, fsdp, F, average_in_collective, B>;
  {
    comm::local<B> solo;
    data_parallel_t<Cfg> m(solo);
    (void)m.add_param(m.add_unit("a"), "w", {10});
    m.finalize();
    ShardedOptimizer opt(m, adamw{});
    const tessera::cuda::scoped_stream on(nullptr);
    tessera_test::expect_error([&] { step_graph g(opt); }, "step graphs cannot capture the legacy default stream");
    step_graph off(opt, false);  // turned off, it runs anywhere
    BOOST_TEST(!off.enabled());
    tessera_test::expect_error([&] { step_graph g(opt, true, 0); }, "eager_steps 0");
  }
  comm::mpi_device c;
  if (c.size() == 1) return;
  data_parallel_t<Cfg> m(c);
  (void)m.add_param(m.add_unit("a"), "w", {10});
  m.finalize();
  ShardedOptimizer opt(m, adamw{});
  tessera::cuda::stream st;
  const tessera::cuda::scoped_stream on(st.get());
  tessera_test::expect_error([&] { step_graph g(opt); }, "step graphs run on one rank for now");
}
