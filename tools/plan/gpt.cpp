// tessera-plan memory --model gpt2|...|gpt: tessera-gpt's bytes per rank,
// the library's plan of its units (embed, blocks) plus what its net holds
// (gpt/workspace.hpp's buffer list for the CUDA net, host_gpt's for the host
// one): the estimate tessera-gpt prints for the same flags, byte for byte.
#include "sequence.hpp"

#include "gpt/host_compute.hpp"
#include "gpt/workspace.hpp"
#include "trainer_kit/host_math.hpp"

namespace plan_cli {

estimate gpt_estimate(const options& o, const gpt_model& g) {
  using namespace tessera;
  const bool cuda = o.backend == "cuda";
  if (g.keep_gelu && !cuda) throw error("--keep-gelu keeps the CUDA net's GELU outputs; give --backend cuda");
  return sequence_estimate(
      o, "tessera-gpt", g.shape.params(), std::size_t(g.batch) * std::size_t(g.shape.seq),
      [&](plan::model_recorder& rec) { return gpt::register_model(rec, g.shape); },
      [&]<class Cfg>(const gpt::model_ids& ids, auto padded_numel, int slots) -> std::size_t {
        using C = typename Cfg::compute_type;
        using host_net = gpt::host_gpt<data_parallel_t<Cfg>>;
        // The CUDA net runs flash attention in bf16 at head dimension 64 (on sm_80 or newer, which this count assumes).
        const bool flash = !std::is_same_v<C, float> && g.shape.head_dim() == 64;
        const gpt::net_options nopt{.recompute = g.recompute, .deterministic = o.deterministic, .input_slots = slots,
                                    .keep_gelu = g.keep_gelu, .fp8 = {.on = o.precision == "fp8"}};
        return cuda ? gpt::workspace::cuda_bytes<C>(g.shape, g.batch, nopt, flash)
                    : host_net::workspace_bytes(g.shape, g.batch, nopt) +
                          trainer_kit::widened_bytes<host_net>(ids, padded_numel);
      });
}

}  // namespace plan_cli
