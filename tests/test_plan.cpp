// The memory planner (tessera/plan/memory.hpp) against real runs: for every
// valid strategy x wrapper, both precisions, both alignments, lent shards
// and more gather buffers, the plan made without a communicator or an
// allocation equals the wrapper's planned() and the optimizer's
// state_bytes() on the busiest rank, byte for byte, at this world size and,
// where it divides, on meshes (HSDP and HFSDP).
#define BOOST_TEST_MODULE tessera_plan
#include "common/mpi_test_main.hpp"
#include "common/training_harness.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <optional>
#include <tuple>
#include <vector>

#include "tessera/plan/memory.hpp"
#include "tessera/tessera.hpp"

using namespace tessera;

namespace {
using MP = mixed_precision<bf16, float>;
using MPW = mixed_precision<bf16, float, float, bf16>;
using F = full_precision<float>;
using configs = std::tuple<config<no_shard, ddp, F>, config<optim, ddp, MP>, config<optim_grads, ddp, MPW>,
                           config<no_shard, fsdp, MP>, config<optim, fsdp, F>, config<optim_grads, fsdp, MP>,
                           config<optim_grads_params, fsdp, F>, config<optim_grads_params, fsdp, MPW>,
                           config<optim_grads_params, fsdp2, MP>, config<optim_grads_params, fsdp2, F>>;

// The awkward model, registered on anything with add_unit / add_param.
template <class M>
void register_awkward(M& m) {
  for (auto& d : tessera_test::awkward_model()) {
    const auto u = m.add_unit(d.name);
    for (auto& t : d.tensors) (void)m.add_param(u, t.name, t.shape, t.weight_decay);
  }
}

template <class Cfg, class A = adamw, class Comm>
void check_plan(Comm& c, const wrapper_options& wo, comm::mesh<Comm>* m = nullptr, const optimizer_options& oo = {}) {
  using W = data_parallel_t<Cfg>;
  std::optional<W> holder;
  if (m) holder.emplace(*m, wo);
  else holder.emplace(c, wo);
  W& model = *holder;
  register_awkward(model);
  model.finalize();
  const std::size_t held0 = memory_of<host_resident>().current();
  ShardedOptimizer opt(model, A{}, oo);
  // The busiest rank of the world (shards pad equally; masks may differ).
  const memory_plan& pl = model.planned();
  std::int64_t real[10] = {std::int64_t(pl.compute_weights),   std::int64_t(pl.main_weights),
                           std::int64_t(pl.grads),             std::int64_t(pl.gathered_buffers),
                           std::int64_t(pl.reduction_buffers), std::int64_t(opt.state_bytes()),
                           std::int64_t(pl.total()),           std::int64_t(pl.host_main_weights),
                           std::int64_t(opt.offloaded_bytes()), 0};
  // The offloaded bytes the optimizer counts are the ones it allocated as
  // host-resident (its staging's std::vector mask is counted by hand).
  BOOST_TEST(memory_of<host_resident>().current() - held0 <= opt.offloaded_bytes());
  real[9] = std::int64_t(opt.offloaded_bytes() - (memory_of<host_resident>().current() - held0));
  comm::all_reduce(c, std::span<std::int64_t>(real, 10), comm::reduce_op::max);
  plan::model_recorder rec;
  register_awkward(rec);
  const auto p = plan::memory<Cfg, A>(rec.units(), model.world(), wo, model.replicas(), oo);
  BOOST_TEST_CONTEXT(Cfg::strategy::name << " / " << Cfg::wrapper::name << " / " << Cfg::outer_type::name << ", "
                                         << model.replicas() << " x " << model.world() << ", alignment "
                                         << wo.alignment << ", gather buffers " << wo.gather_buffers << ", lend "
                                         << wo.lend_grad_shards << ", offload " << wo.offload_optimizer << " on "
                                         << (oo.offload_update == update_site::host ? "host" : "device")) {
    BOOST_TEST(std::int64_t(p.model.compute_weights) == real[0]);
    BOOST_TEST(std::int64_t(p.model.main_weights) == real[1]);
    BOOST_TEST(std::int64_t(p.model.grads) == real[2]);
    BOOST_TEST(std::int64_t(p.model.gathered_buffers) == real[3]);
    BOOST_TEST(std::int64_t(p.model.reduction_buffers) == real[4]);
    BOOST_TEST(std::int64_t(p.optimizer) == real[5]);
    BOOST_TEST(std::int64_t(p.model.total()) == real[6]);
    BOOST_TEST(std::int64_t(p.model.host_main_weights) == real[7]);
    BOOST_TEST(std::int64_t(p.optimizer_host) == real[8]);
    BOOST_TEST(real[9] <= 64);  // the host update's decay masks, a few words
    if (wo.offload_optimizer > 0) BOOST_TEST(p.host_total() > 0);
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(plan_equals_the_wrappers_and_optimizers_own_count, Cfg, configs) {
  comm::mpi c;
  for (std::size_t align : {std::size_t(1), std::size_t(16)})
    for (int gathers : {2, 3})
      for (bool lend : {false, true}) {
        const wrapper_options wo{.alignment = align, .gather_buffers = gathers, .lend_grad_shards = lend};
        check_plan<Cfg>(c, wo);
      }
  check_plan<Cfg, sgd>(c, wrapper_options{});
  // Offload: a part (the last unit), everything, either update.
  for (double f : {0.3, 1.0})
    for (auto where : {update_site::host, update_site::device}) {
      const wrapper_options wo{.offload_optimizer = f};
      check_plan<Cfg, adamw, comm::mpi>(c, wo, nullptr, optimizer_options{.offload_update = where});
    }
}

using mesh_configs =
    std::tuple<config<optim_grads_params, fsdp, MP, outer<optim>>, config<optim_grads, ddp, F, outer<optim>>,
               config<optim_grads_params, fsdp, MP>, config<optim_grads_params, fsdp2, MP>>;

BOOST_AUTO_TEST_CASE_TEMPLATE(plan_on_meshes, Cfg, mesh_configs) {
  comm::mpi world;
  for (int S = 1; S <= world.size(); ++S) {
    if (world.size() % S) continue;
    auto m = comm::make_mesh(world, S);
    check_plan<Cfg>(world, wrapper_options{}, &m);
  }
}

BOOST_AUTO_TEST_CASE(bad_plans_are_clear_errors) {
  plan::model_recorder rec;
  register_awkward(rec);
  const auto fails = [](auto f, const char* what) {
    try {
      f();
    } catch (const tessera::error& e) {
      BOOST_TEST(std::string(e.what()).find(what) != std::string::npos);
      return;
    }
    BOOST_ERROR("no error for " << what);
  };
  fails([&] { (void)plan::memory<config<optim_grads_params, fsdp>>(rec.units(), 0); }, "ranks per group");
  fails([&] { (void)plan::memory<config<optim_grads_params, fsdp>>({}, 2); }, "no unit");
}
