// tessera-plan memory --model llama3.2-1b|...|llama: tessera-llama's bytes
// per rank, the library's plan of its units plus what its net holds
// (llama/workspace.hpp's buffer list for the CUDA net, host_llama's for the
// host one): the estimate tessera-llama prints for the same flags.
#include "sequence.hpp"

#include "llama/host_compute.hpp"
#include "llama/workspace.hpp"
#include "trainer_kit/host_math.hpp"

namespace plan_cli {

estimate llama_estimate(const options& o, const llama_model& l) {
  using namespace tessera;
  const bool cuda = o.backend == "cuda";
  return sequence_estimate(
      o, "tessera-llama", l.shape.params(), std::size_t(l.batch) * std::size_t(l.shape.seq),
      [&](plan::model_recorder& rec) { return llama::register_model(rec, l.shape); },
      [&]<class Cfg>(const llama::model_ids& ids, auto padded_numel, int slots) -> std::size_t {
        using C = typename Cfg::compute_type;
        using host_net = llama::host_llama<data_parallel_t<Cfg>>;
        // The flash kernels never run Llama (they take as many kv heads as heads at head dimension 64).
        const llama::net_options nopt{.recompute = l.recompute, .deterministic = o.deterministic, .input_slots = slots,
                                      .fp8 = {.on = o.precision == "fp8"}};
        return cuda ? llama::workspace::cuda_bytes<C>(l.shape, l.batch, nopt, false)
                    : host_net::workspace_bytes(l.shape, l.batch, nopt) +
                          trainer_kit::widened_bytes<host_net>(ids, padded_numel);
      });
}

}  // namespace plan_cli
