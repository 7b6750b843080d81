#pragma once
// The property every (strategy, wrapper, precision, averaging) combination
// must have: after several steps with accumulation, clipping and weight decay,
// its weights equal those of single-rank no_shard with the same precision, on
// every world size, for AdamW and SGD, at alignments 1 and 16.
#include <tuple>
#include <type_traits>

#include "common/training_harness.hpp"

namespace tessera_test {

//! Allowed |difference| / max(1, |w|): fp32 within 1e-5; a bf16 compute weight
//! may round to the neighbouring bf16 value when the fp32 main weights differ
//! in the last bit, which moves that step's gradient by one bf16 ulp.
template <class Cfg>
constexpr double tolerance() {
  using C = typename Cfg::compute_type;
  using Wi = typename Cfg::wire_type;
  if constexpr (std::is_same_v<C, float> && std::is_same_v<Wi, float>) return 1e-5;
  else return 8 * tessera::epsilon_of<tessera::bf16>;
}

//! Cfg over communicator c against no_shard over comm::local of the same backend.
//! Samples per micro-batch for Cfg on N ranks: a sum allows any split of the
//! batch (7: uneven, some ranks may get none); an average needs the same number
//! on every rank.
template <class Cfg>
int global_samples(int N) {
  return std::is_same_v<typename Cfg::averaging, tessera::sum> ? 7 : 2 * N;
}

template <class Comm> struct mesh_of { using comm_type = Comm; static constexpr bool is_mesh = false; };
template <class Comm> struct mesh_of<tessera::comm::mesh<Comm>> { using comm_type = Comm; static constexpr bool is_mesh = true; };

//! Cfg over communicator c, or over the mesh c, against single-rank no_shard.
template <class Cfg, class Comm>
void check_matches_single_rank_no_shard(Comm& c) {
  using namespace tessera;
  using Ref = config<no_shard, ddp, typename Cfg::precision, typename Cfg::averaging, typename Cfg::backend_type>;
  comm::local<typename Cfg::backend_type> solo;
  // train() over a flat communicator or a mesh; N and rank over the whole world.
  auto run = [&c](auto alg, const run_params& p) {
    if constexpr (mesh_of<Comm>::is_mesh) return train<Cfg>(c.shard, alg, p, &c);
    else return train<Cfg>(c, alg, p);
  };
  int N = 0, rank = 0;
  if constexpr (mesh_of<Comm>::is_mesh) N = c.world_size(), rank = c.world_rank();
  else N = c.size(), rank = c.rank();
  for (std::size_t align : {std::size_t(1), std::size_t(16)})
    for (int alg = 0; alg < 2; ++alg) {
      run_params p;
      p.alignment = align;
      p.global_samples = global_samples<Cfg>(N);
      p.assign_when_fresh = align == 16;  // both ways of writing gradients
      const run_result ref = alg == 0 ? train<Ref>(solo, test_adamw(), p) : train<Ref>(solo, test_sgd(), p);
      const run_result got = alg == 0 ? run(test_adamw(), p) : run(test_sgd(), p);
      BOOST_TEST_CONTEXT(Cfg::strategy::name << " / " << Cfg::wrapper::name << " / "
                                             << type_name<typename Cfg::precision>() << " / "
                                             << Cfg::averaging::name << ", " << (alg ? "sgd" : "adamw")
                                             << ", alignment " << align << ", rank " << rank << " of " << N) {
        BOOST_TEST_MESSAGE("max relative difference " << max_rel_diff(got, ref) << ", norm[0] " << got.grad_norms[0] << ", clipped " << (ref.grad_norms[0] > p.clip));
        BOOST_TEST(max_rel_diff(got, ref) <= tolerance<Cfg>());
        for (std::size_t s = 0; s < ref.grad_norms.size(); ++s) {
          BOOST_TEST(!got.skipped[s]);
          BOOST_TEST(std::abs(got.grad_norms[s] - ref.grad_norms[s]) <= 1e-4 * ref.grad_norms[s] + tolerance<Cfg>());
        }
      }
    }
  // Gradient shards in lent memory that "forward" overwrites: one micro-batch
  // per step where gradients are reduced every micro-batch, else two.
  run_params p;
  p.global_samples = global_samples<Cfg>(N);
  p.lend_grad_shards = true;
  p.accum = Cfg::strategy::shards_grads ? 1 : 2;
  const run_result ref = train<Ref>(solo, test_adamw(), p);
  const run_result got = run(test_adamw(), p);
  BOOST_TEST_CONTEXT(Cfg::strategy::name << " / " << Cfg::wrapper::name << ", lent gradient shards, rank "
                                         << rank << " of " << N) {
    BOOST_TEST(max_rel_diff(got, ref) <= tolerance<Cfg>());
  }
  // Offloaded optimizer state (the last unit, then every unit), updated on
  // the host's cores or across PCIe, with a skipped step and lent shards:
  // the same functor on the same values as without offload (bit for bit on
  // the host backend; within fp32 rounding on CUDA, whose compiler contracts
  // the device arithmetic differently from the host's).
  {
    using where = update_site;
    struct variant {
      double fraction;
      where on;
      bool lend;
    };
    for (bool lend : {false, true}) {
      run_params q;
      q.global_samples = global_samples<Cfg>(N);
      q.nonfinite_at_step1_on_last_rank = true;
      q.lend_grad_shards = lend;
      if (lend) q.accum = Cfg::strategy::shards_grads ? 1 : 2;
      const run_result base = run(test_adamw(), q);
      for (const variant v : {variant{0.3, where::host, false}, variant{1.0, where::host, false},
                              variant{1.0, where::device, false}, variant{1.0, where::host, true}}) {
        if (v.lend != lend) continue;
        q.offload = v.fraction;
        q.offload_on = v.on;
        const run_result off = run(test_adamw(), q);
        constexpr bool cuda = std::is_same_v<typename Cfg::backend_type, tessera::backend::cuda>;
        BOOST_TEST_CONTEXT(Cfg::strategy::name << " / " << Cfg::wrapper::name << ", offload " << v.fraction << " on "
                                               << (v.on == where::host ? "host" : "device") << ", lend " << lend
                                               << ", rank " << rank << " of " << N) {
          check_only_step1_skipped(off);
          BOOST_TEST(max_rel_diff(off, base) <= (cuda ? 1e-6 : 0.0));
        }
      }
    }
  }
  // On the device, updates on the side stream (in the next forward's shadow)
  // against updates at the end of the step: the same kernels on the same
  // values (the host suites check every strategy bit for bit in test_optim;
  // here the norm's atomic sum may round differently from run to run).
  if constexpr (std::is_same_v<typename Cfg::backend_type, tessera::backend::cuda>) {
    run_params q;
    q.global_samples = global_samples<Cfg>(N);
    q.overlap_updates = false;
    const run_result eager = run(test_adamw(), q);
    q.overlap_updates = true;
    const run_result shadow = run(test_adamw(), q);
    BOOST_TEST_CONTEXT(Cfg::strategy::name << " / " << Cfg::wrapper::name << ", overlap_updates on vs off, rank "
                                           << rank << " of " << N) {
      BOOST_TEST(max_rel_diff(shadow, eager) <= 1e-6);
    }
  }
}

}  // namespace tessera_test
