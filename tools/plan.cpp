// tessera-plan: what a configuration needs before anything is allocated.
//
//   tessera-plan memory --layers L --d D --ctx K --tokens T --gpus N
//                       [--shard-group S --outer no_shard|optim] [--wrapper W] [--strategy S]
//                       [--precision fp32|bf16] [--accum A] [--gather-buffers G]
//                       [--recompute-gelu] [--lend-grad-shards] [--offload-optimizer [F]]
//                       [--offload-update host|device] [--backend cuda|host]
//                       [--gpu-memory GiB] [--json]
//
// The reference model (tessera-mlp-lm's, registered by the same
// register_model) on N ranks: the busiest rank's bytes, each part as the
// library itself plans it (tessera/plan/memory.hpp: the wrapper's buffers and
// ShardedOptimizer's state, equal byte for byte to what a run allocates) plus
// the trainer's activations and cuBLASLt workspace, so the total is the
// estimate tessera-mlp-lm prints for the same flags. Exit 3 when it does not
// fit --gpu-memory. Time prediction (the rest of issue 17) is not here yet.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <string>

#include "mlp_lm/configs.hpp"
#include "mlp_lm/host_compute.hpp"
#include "mlp_lm/model.hpp"
#include "mlp_lm/offload_flags.hpp"
#include "mlp_lm/workspace.hpp"
#include "tessera/plan/memory.hpp"
#include "tessera/policy/config.hpp"

namespace {

struct options {
  int layers = 2, d = 64, ctx = 8, gpus = 1, accum = 1, gather_buffers = 2, shard_group = 0;
  long tokens = 1024;
  std::string wrapper = "fsdp", strategy = "optim_grads_params", precision = "bf16", outer = "no_shard",
              backend = "cuda";
  bool recompute_gelu = false, lend_grad_shards = false, json = false, deterministic = false;
  long micro_tokens = 0;  // --deterministic: tokens per fixed micro-batch
  double gpu_memory_gib = 0, offload = 0;
  std::string offload_update = "device";
};

template <class Cfg>
int plan_memory(const options& o) {
  using namespace tessera;
  const mlp_lm::model_shape s{o.layers, o.d, o.ctx};
  plan::model_recorder rec;
  (void)mlp_lm::register_model(rec, s);
  const int S = o.shard_group > 0 ? o.shard_group : o.gpus, R = o.gpus / S;
  const wrapper_options wo{.gather_buffers = o.gather_buffers, .lend_grad_shards = o.lend_grad_shards,
                           .offload_optimizer = o.offload};
  const optimizer_options oo{.offload_update = mlp_lm::update_site_of(o.offload_update)};
  if (o.lend_grad_shards && o.accum > 1 && Cfg::strategy::shards_grads)
    throw tessera::error("--lend-grad-shards holds one micro-batch's reduction under optim_grads and "
                         "optim_grads_params; use --accum 1");
  const plan::rank_memory m = plan::memory<Cfg, adamw>(rec.units(), S, wo, R, oo);
  // The trainer splits each micro-batch of tokens / accum over all N ranks,
  // rank r taking [per r / N, per (r + 1) / N): the busiest holds the most.
  const long per = o.tokens / o.accum;
  std::size_t n = 0;
  for (int r = 0; r < o.gpus; ++r) n = std::max(n, std::size_t(per * (r + 1) / o.gpus - per * r / o.gpus));
  if (o.deterministic) n = std::size_t(o.micro_tokens);  // whole micro-batches per rank
  n = std::max<std::size_t>(n, 1);
  const bool cuda = o.backend == "cuda";
  const std::size_t act =
      cuda ? mlp_lm::workspace::cuda_bytes<typename Cfg::compute_type>(s, n, o.recompute_gelu)
           : mlp_lm::host_mlp<data_parallel_t<Cfg>>::workspace_bytes(s, n, {.recompute_gelu = o.recompute_gelu});
  const std::size_t blas = cuda ? mlp_lm::workspace::cublaslt_bytes : 0;
  // Lent gradient shards (the CUDA trainer's cuda_mlp::lend_grad_shards): each
  // unit's shard lives in its own activations (a block's arena region, the
  // head's logits, the embedding's output); a unit whose region is smaller
  // than its shard gets a buffer of its own, which the trainer counts here.
  std::size_t own = 0;
  if (o.lend_grad_shards) {
    using C = typename Cfg::compute_type;
    using G = typename Cfg::grad_type;
    const auto ls = plan::layouts<Cfg>(rec.units(), S, wo, R);
    const mlp_lm::workspace::lend_regions cap = mlp_lm::workspace::lend_capacity(s, n);
    for (std::size_t u = 0; u < ls.size(); ++u) {  // register_model's order: embed, blocks, head
      const std::size_t elems = u == 0 ? cap.embed : u + 1 == ls.size() ? cap.head : cap.block;
      if (ls[u].shard_numel() > elems * sizeof(C) / sizeof(G)) own += ls[u].shard_numel() * sizeof(G);
    }
  }
  const std::size_t total = m.total() + own + act + blas;
  const double limit = o.gpu_memory_gib * double(1ull << 30);
  const bool fits = limit <= 0 || double(total) <= limit;
  const auto mib = [](std::size_t b) { return double(b) / double(1 << 20); };
  if (o.json) {
    nlohmann::json j{{"params", s.params()},
                     {"gpus", o.gpus},
                     {"shard_group", S},
                     {"replicas", R},
                     {"outer", o.outer},
                     {"wrapper", o.wrapper},
                     {"strategy", o.strategy},
                     {"precision", o.precision},
                     {"backend", o.backend},
                     {"tokens_per_rank", n},
                     {"compute_weights_bytes", m.model.compute_weights},
                     {"main_weights_bytes", m.model.main_weights},
                     {"grads_bytes", m.model.grads},
                     {"gathered_buffers_bytes", m.model.gathered_buffers},
                     {"reduction_buffers_bytes", m.model.reduction_buffers},
                     {"model_state_bytes", m.model.total() + own},
                     {"own_lent_shard_bytes", own},
                     {"optimizer_state_bytes", m.optimizer},
                     {"activations_bytes", act},
                     {"blas_workspace_bytes", blas},
                     {"total_bytes", total},
                     {"offloaded_bytes", m.host_total()},
                     {"fits", fits}};
    if (limit > 0) j["gpu_memory_bytes"] = limit;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("tessera-plan: %zu parameters, %s / %s / %s on %d rank%s (mesh %d x %d, outer %s), %zu tokens per "
                "rank and micro-batch, %s backend\n",
                s.params(), o.wrapper.c_str(), o.strategy.c_str(), o.precision.c_str(), o.gpus, o.gpus == 1 ? "" : "s",
                R, S, o.outer.c_str(), n, o.backend.c_str());
    std::printf("  compute weights   %12.2f MiB\n  main weights      %12.2f MiB\n  gradients         %12.2f MiB\n"
                "  gathered units    %12.2f MiB\n  reduction buffers %12.2f MiB\n  shards not lent   %12.2f MiB\n"
                "  optimizer state   %12.2f MiB\n"
                "  activations       %12.2f MiB\n  BLAS workspace    %12.2f MiB\n  total per rank    %12.2f MiB%s\n"
                "  offloaded (host)  %12.2f MiB\n",
                mib(m.model.compute_weights), mib(m.model.main_weights), mib(m.model.grads),
                mib(m.model.gathered_buffers), mib(m.model.reduction_buffers), mib(own), mib(m.optimizer), mib(act),
                mib(blas),
                mib(total),
                limit > 0 ? (fits ? "  (fits)" : "  (does NOT fit)") : "", mib(m.host_total()));
  }
  return fits ? 0 : 3;
}

// The configurations the reference trainer compiles (mlp_lm/configs.hpp).
template <class P>
int dispatch(const options& o) {
  const auto plan = [&]<class Cfg>() { return plan_memory<Cfg>(o); };
  if (o.deterministic) {
    if (const auto rc = mlp_lm::with_config<P, tessera::backend::host, tessera::exact_reduction>(o.wrapper, o.strategy,
                                                                                                  o.outer, plan))
      return *rc;
  } else if (const auto rc = mlp_lm::with_config<P, tessera::backend::host>(o.wrapper, o.strategy, o.outer, plan)) {
    return *rc;
  }
  std::fprintf(stderr, "tessera: --wrapper %s --strategy %s --outer %s is not a valid combination (ddp runs no_shard, "
                       "optim, optim_grads; fsdp2 optim_grads_params; --outer optim is compiled for --wrapper fsdp "
                       "--strategy optim_grads_params, as in tessera-mlp-lm)\n",
               o.wrapper.c_str(), o.strategy.c_str(), o.outer.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"tessera-plan: memory per rank of the reference model under any configuration, before allocating"};
  app.require_subcommand(1);
  CLI::App* mem = app.add_subcommand("memory", "bytes per rank: the library's own plan plus the trainer's activations");
  mem->add_option("--layers", o.layers)->check(CLI::Range(0, 1 << 12));
  mem->add_option("--d", o.d, "model width (a multiple of --ctx)")->check(CLI::Range(1, 1 << 16));
  mem->add_option("--ctx", o.ctx)->check(CLI::Range(1, 1 << 12));
  mem->add_option("--tokens", o.tokens, "global batch in tokens per step")->check(CLI::Range(1L, 1L << 40));
  mem->add_option("--accum", o.accum, "micro-batches per step")->check(CLI::Range(1, 1 << 20));
  mem->add_option("--gpus", o.gpus, "ranks in all")->check(CLI::Range(1, 1 << 20));
  mem->add_option("--shard-group", o.shard_group, "ranks per shard group of a mesh (0: the whole world)")
      ->check(CLI::Range(0, 1 << 20));
  mem->add_option("--outer", o.outer, "across the mesh's replica groups: no_shard (HSDP) or optim (HFSDP)")
      ->check(CLI::IsMember({"no_shard", "optim"}));
  mem->add_option("--wrapper", o.wrapper)->check(CLI::IsMember({"ddp", "fsdp", "fsdp2"}));
  mem->add_option("--strategy", o.strategy)
      ->check(CLI::IsMember({"no_shard", "optim", "optim_grads", "optim_grads_params"}));
  mem->add_option("--precision", o.precision)->check(CLI::IsMember({"fp32", "bf16"}));
  mem->add_option("--gather-buffers", o.gather_buffers)->check(CLI::Range(1, 1 << 16));
  mem->add_flag("--recompute-gelu", o.recompute_gelu);
  mem->add_flag("--lend-grad-shards", o.lend_grad_shards,
                "gradient shards in the CUDA trainer's activations (wrapper_options::lend_grad_shards)");
  mlp_lm::add_offload_options(*mem, o.offload, o.offload_update);
  mem->add_option("--backend", o.backend, "whose activations: cuda (the GPU trainer) or host")
      ->check(CLI::IsMember({"cuda", "host"}));
  mem->add_option("--gpu-memory", o.gpu_memory_gib, "GiB per GPU to fit in (exit 3 when it does not)")
      ->check(CLI::NonNegativeNumber);
  mem->add_flag("--deterministic", o.deterministic, "exact_reduction with fixed micro-batches (the trainer's --deterministic)");
  mem->add_option("--micro-tokens", o.micro_tokens, "--deterministic: tokens per micro-batch")->check(CLI::Range(1L, 1L << 30));
  mem->add_flag("--json", o.json);
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.d % o.ctx != 0) throw tessera::error("--d " + std::to_string(o.d) + " is not a multiple of --ctx " + std::to_string(o.ctx));
    const int S = o.shard_group > 0 ? o.shard_group : o.gpus;
    if (o.gpus % S != 0)
      throw tessera::error("--shard-group " + std::to_string(S) + " does not divide --gpus " + std::to_string(o.gpus));
    if (o.outer == "optim" && o.shard_group == 0) throw tessera::error("--outer optim needs --shard-group");
    if (o.lend_grad_shards && o.backend != "cuda") throw tessera::error("--lend-grad-shards is the cuda trainer's");
    if (o.deterministic) {
      if (o.micro_tokens <= 0 || o.tokens % o.micro_tokens != 0 || (o.tokens / o.micro_tokens) % o.gpus != 0)
        throw tessera::error("--deterministic needs --micro-tokens M dividing --tokens into a multiple of --gpus "
                             "micro-batches");
      o.accum = int(o.tokens / o.micro_tokens / o.gpus);  // per rank, as the trainer runs them
    } else if (o.tokens / o.accum < o.gpus)
      throw tessera::error("--tokens / --accum gives fewer tokens than ranks (" + std::to_string(o.tokens / o.accum) +
                           " for " + std::to_string(o.gpus) + ")");
    return o.precision == "bf16" ? dispatch<tessera::mixed_precision<tessera::bf16, float>>(o)
                                 : dispatch<tessera::full_precision<float>>(o);
  } catch (const std::exception& e) {
    const std::string w = e.what();
    std::fprintf(stderr, "%s%s\n", w.rfind("tessera:", 0) == 0 ? "" : "tessera: ", w.c_str());
    return 2;
  }
}
