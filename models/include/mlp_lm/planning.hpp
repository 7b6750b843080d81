#pragma once
// The planner's estimate of one configuration (tessera-plan, tessera-mlp-lm --plan auto): memory per rank (the
// library's plan, tessera/plan/memory.hpp, plus the trainer's activations)
// and step time (tessera/plan/schedule.hpp over the reference model's
// units, or units read from a JSON file), for every configuration the
// reference programs compile (trainer_kit/configs.hpp).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "trainer_kit/configs.hpp"
#include "mlp_lm/host_compute.hpp"
#include "mlp_lm/model.hpp"
#include "trainer_kit/run_options.hpp"
#include "mlp_lm/workspace.hpp"
#include "tessera/plan/cost.hpp"
#include "tessera/plan/memory.hpp"
#include "tessera/plan/schedule.hpp"
#include "tessera/policy/config.hpp"

namespace mlp_lm::planning {

//! A unit given by a JSON file (predict --units): its parameters and
//! forward + backward FLOPs per token (6 per weight of a matmul).
struct custom_unit {
  std::string name;
  long params = 0;
  double flops_per_token = 0;
  double activation_bytes_per_token = 0;
};

struct options {
  int layers = 2, d = 64, ctx = 8, gpus = 1, accum = 1, gather_buffers = 2, shard_group = 0;
  long tokens = 1024;
  std::string wrapper = "fsdp", strategy = "optim_grads_params", precision = "bf16", outer = "no_shard",
              backend = "cuda", wire = "fp32";
  bool recompute_gelu = false, lend_grad_shards = false, json = false, deterministic = false;
  bool copy_engine_gathers = false;
  long micro_tokens = 0;  // --deterministic: tokens per fixed micro-batch
  double gpu_memory_gib = 0, offload = 0;
  std::string offload_update = "device";
  std::string cuda_graphs;  // the trainer's --cuda-graphs; "": its default (tessera-mlp-lm auto, tessera-gpt off)
  std::vector<custom_unit> units;  // empty: the reference model
};

//! Memory per rank (bytes) and one step's time.
struct estimate {
  std::size_t params = 0, tokens_per_rank = 0;
  tessera::plan::rank_memory m;
  std::size_t own = 0, act = 0, blas = 0;
  [[nodiscard]] std::size_t total() const { return m.total() + own + act + blas; }
  tessera::plan::step_time time;
  int units = 0;
};

inline std::vector<custom_unit> read_units(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw tessera::error("cannot read --units file '" + path + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw tessera::error(std::string("--units '") + path + "' is not JSON: " + e.what());
  }
  if (!j.is_array() || j.empty()) throw tessera::error("--units '" + path + "': expected a non-empty list of units");
  std::vector<custom_unit> out;
  for (const auto& u : j) {
    custom_unit c;
    try {
      c.name = u.value("name", "unit" + std::to_string(out.size()));
      c.params = u.at("params").get<long>();
      c.flops_per_token = u.value("flops_per_token", 6.0 * double(c.params));
      c.activation_bytes_per_token = u.value("activation_bytes_per_token", 0.0);
    } catch (const std::exception& e) {
      throw tessera::error("--units '" + path + "': unit " + std::to_string(out.size()) + ": " + e.what());
    }
    if (c.params <= 0 || c.flops_per_token < 0)
      throw tessera::error("--units '" + path + "': unit '" + c.name + "' needs params > 0 and flops >= 0");
    out.push_back(c);
  }
  return out;
}

//! One unit's compute for one micro-batch: GEMM flops and elementwise bytes
//! outside GEMM epilogues, forward and backward.
struct unit_ops {
  double forward_flops = 0, backward_flops = 0, forward_bytes = 0, backward_bytes = 0;
};

// Each unit's compute for `n` tokens on one rank. Reference model: its GEMMs
// (mlp_lm::model_shape::flops_per_token, per unit, and the embedding's
// one-hot gradient GEMM) and its passes outside epilogues (the embedding
// gather, softmax and cross-entropy, a recomputed GELU).
inline std::vector<unit_ops> compute_of(const options& o, double n) {
  std::vector<unit_ops> w;
  if (!o.units.empty()) {
    for (const auto& u : o.units) w.push_back({u.flops_per_token * n / 3.0, 2.0 * u.flops_per_token * n / 3.0, 0, 0});
    return w;
  }
  const double D = o.d, V = mlp_lm::vocab, C = 2.0;  // bf16 activations
  w.push_back({0, 2.0 * n * D * V, n * D * C, 0});    // embed: gather; onehot^T dX
  for (int l = 0; l < o.layers; ++l)                  // X W1^T, A W2^T; four GEMMs back
    w.push_back({16.0 * n * D * D, 32.0 * n * D * D, 0, o.recompute_gelu ? n * 4.0 * D * 2.0 * C : 0.0});
  w.push_back({2.0 * n * V * D, 4.0 * n * V * D, 3.0 * n * V * C, 0});  // logits, softmax + cross-entropy; dWh, dX
  return w;
}

//! Microseconds of `ops` at the topology's rates.
inline void add_compute(std::vector<tessera::plan::unit_work>& w, const std::vector<unit_ops>& ops,
                        const tessera::plan::topology& t) {
  const double flop_us = t.tflops * 1e6, byte_us = t.copy_gbs * 1e3;  // per microsecond
  for (std::size_t u = 0; u < w.size(); ++u) {
    w[u].forward_us = ops[u].forward_flops / flop_us + ops[u].forward_bytes / byte_us + t.unit_overhead_us / 3.0;
    w[u].backward_us = ops[u].backward_flops / flop_us + ops[u].backward_bytes / byte_us + 2.0 * t.unit_overhead_us / 3.0;
  }
}

template <class Cfg>
estimate evaluate(const options& o, const tessera::plan::topology& topo) {
  using namespace tessera;
  estimate e;
  plan::model_recorder rec;
  const mlp_lm::model_shape s{o.layers, o.d, o.ctx};
  std::optional<mlp_lm::model_ids> ids;
  if (o.units.empty()) {
    ids = mlp_lm::register_model(rec, s);
    e.params = s.params();
  } else {
    for (const auto& u : o.units) (void)rec.add_param(rec.add_unit(u.name), "weight", shape({std::int64_t(u.params)}));
    for (const auto& u : o.units) e.params += std::size_t(u.params);
  }
  const int S = o.shard_group > 0 ? o.shard_group : o.gpus, R = o.gpus / S;
  const wrapper_options wo{.gather_buffers = o.gather_buffers, .lend_grad_shards = o.lend_grad_shards,
                           .offload_optimizer = o.offload};
  const optimizer_options oo{.offload_update = trainer_kit::update_site_of(o.offload_update)};
  if (o.lend_grad_shards && o.accum > 1 && Cfg::strategy::shards_grads)
    throw tessera::error("--lend-grad-shards holds one micro-batch's reduction under optim_grads and "
                         "optim_grads_params; use --accum 1");
  e.m = plan::memory<Cfg, adamw>(rec.units(), S, wo, R, oo);
  // The trainer splits each micro-batch of tokens / accum over all N ranks,
  // rank r taking [per r / N, per (r + 1) / N): the busiest holds the most.
  const long per = o.tokens / o.accum;
  std::size_t n = 0;
  for (long r = 0; r < o.gpus; ++r) n = std::max(n, std::size_t(per * (r + 1) / o.gpus - per * r / o.gpus));
  if (o.deterministic) n = std::size_t(o.micro_tokens);  // whole micro-batches per rank
  n = std::max<std::size_t>(n, 1);
  e.tokens_per_rank = n;
  const bool cuda = o.backend == "cuda";
  // A step graph (--cuda-graphs auto, the trainer's default) stages every
  // micro-batch of a step at once on one GPU: an input slot each.
  const long count = o.deterministic ? o.tokens / std::max<long>(o.micro_tokens, 1) / o.gpus : o.accum;
  const int slots = cuda && o.cuda_graphs != "off" && o.gpus == 1 && o.offload == 0 && !(o.deterministic && count > 1)
                        ? int(count) : 1;
  const auto ls = plan::layouts<Cfg>(rec.units(), S, wo, R);
  if (o.units.empty()) {
    using host_net = mlp_lm::host_mlp<data_parallel_t<Cfg>>;
    const auto padded_numel = [&](unit_id u) { return ls[std::size_t(u.index)].padded_numel(); };
    const net_options nopt{.recompute_gelu = o.recompute_gelu, .input_slots = slots};
    e.act = cuda ? mlp_lm::workspace::cuda_bytes<typename Cfg::compute_type>(s, n, nopt)
                 : host_net::workspace_bytes(s, n, nopt) +
                       trainer_kit::widened_bytes<host_net>(*ids, padded_numel);
  } else {
    double b = 0;
    for (const auto& u : o.units) b += u.activation_bytes_per_token * double(n);
    e.act = std::size_t(b);
  }
  e.blas = cuda ? mlp_lm::workspace::cublaslt_bytes : 0;
  // Lent gradient shards (the CUDA trainer's cuda_mlp::lend_grad_shards): each
  // unit's shard lives in its own activations (a block's arena region, the
  // head's logits, the embedding's output); a unit whose region is smaller
  // than its shard gets a buffer of its own, which the trainer counts here.
  if (o.lend_grad_shards && o.units.empty()) {
    using C = typename Cfg::compute_type;
    using G = typename Cfg::grad_type;
    const mlp_lm::workspace::lend_regions cap = mlp_lm::workspace::lend_capacity(s, n);
    for (std::size_t u = 0; u < ls.size(); ++u) {  // register_model's order: embed, blocks, head
      const std::size_t elems = u == 0 ? cap.embed : u + 1 == ls.size() ? cap.head : cap.block;
      if (ls[u].shard_numel() > elems * sizeof(C) / sizeof(G)) e.own += ls[u].shard_numel() * sizeof(G);
    }
  }
  auto work = plan::unit_traffic<Cfg, adamw>(ls, topo.copy_gbs);
  add_compute(work, compute_of(o, double(n)), topo);
  e.units = int(work.size());
  e.time = plan::simulate(topo, plan::shape_of<Cfg>(S, R, o.accum, wo.gather_buffers, wo.grad_buffers, o.copy_engine_gathers),
                          work);
  return e;
}

//! evaluate<Cfg> for the configuration the options name; nothing where the
//! reference programs do not compile it.
inline std::optional<estimate> evaluate_named(const options& o, const tessera::plan::topology& t) {
  using namespace tessera;
  const auto f = [&]<class Cfg>() { return evaluate<Cfg>(o, t); };
  const auto go = [&]<class P>() -> std::optional<estimate> {
    using W = typename P::wire_type;
    if constexpr (std::is_same_v<W, typename P::grad_type>)  // exact_reduction sends limbs, never a narrower wire
      if (o.deterministic) return trainer_kit::with_config<P, backend::host, exact_reduction>(o.wrapper, o.strategy, o.outer, f);
    return trainer_kit::with_config<P, backend::host>(o.wrapper, o.strategy, o.outer, f);
  };
  if (o.precision == "fp8") throw error("--precision fp8 is tessera-gpt's and tessera-llama's (--model gpt|llama)");
  if (o.precision == "fp32") {
    if (o.wire == "bf16") throw error("--wire bf16 is for --precision bf16 (fp32 gradients, bf16 on the wire)");
    return go.template operator()<full_precision<float>>();
  }
  if (o.wire == "bf16") {
    if (o.deterministic) throw error("--deterministic sends integer limbs; it takes no --wire bf16");
    return go.template operator()<mixed_precision<bf16, float, float, bf16>>();
  }
  return go.template operator()<mixed_precision<bf16, float>>();
}

//! Checks the flags agree with one another; throws a tessera: error.
inline void check(options& o) {
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
  } else if (o.tokens / o.accum < o.gpus) {
    throw tessera::error("--tokens / --accum gives fewer tokens than ranks (" + std::to_string(o.tokens / o.accum) +
                         " for " + std::to_string(o.gpus) + ")");
  }
}

//! The tessera-mlp-lm flags that give configuration `o`; knobs only
//! tessera-bench-train has (gather buffers, the wire dtype) follow in brackets.
inline std::string trainer_flags(const options& o) {
  std::string s = "--wrapper " + o.wrapper + " --strategy " + o.strategy + " --precision " + o.precision;
  if (o.shard_group > 0 && o.shard_group < o.gpus) s += " --shard-group " + std::to_string(o.shard_group) + " --outer " + o.outer;
  if (o.copy_engine_gathers) s += " --copy-engine-gathers";
  if (o.recompute_gelu) s += " --recompute-gelu";
  if (o.lend_grad_shards) s += " --lend-grad-shards";
  if (o.accum > 1 && !o.deterministic) s += " --accum " + std::to_string(o.accum);
  std::string bench;
  if (o.gather_buffers != 2) bench += " --gather-buffers " + std::to_string(o.gather_buffers);
  if (o.wire != "fp32") bench += " --wire " + o.wire;
  if (!bench.empty()) s += " (tessera-bench-train:" + bench + ")";
  return s;
}

//! Which knobs a search may turn (tessera-plan best: all; the trainer's
//! --plan auto: those it has flags for).
struct search_space {
  bool bf16_wire = true;        //!< gradients reduced in bf16 (tessera-bench-train --wire)
  bool all_gather_buffers = true;  //!< every unit kept gathered (wrapper_options::gather_buffers)
  bool copy_engine = true;      //!< all-gathers on copy engines (NCCL, inside one node)
};

//! What tessera-mlp-lm --plan auto searches: it reduces in its gradient
//! dtype and keeps two gather buffers; copy engines need NCCL.
inline search_space trainer_space(bool nccl) { return {.bf16_wire = false, .all_gather_buffers = false, .copy_engine = nccl}; }

// Candidate configurations for N GPUs: every compiled wrapper x strategy,
// flat and on meshes (shard groups a power of two dividing N, HSDP and
// HFSDP), two or all gather buffers, fp32 or bf16 wire, SM or copy-engine
// gathers, lent shards and recomputation where they save memory.
inline std::vector<options> candidates(const options& base, int units, const search_space& sp) {
  std::vector<options> out;
  const std::vector<std::pair<std::string, std::string>> ws{
      {"ddp", "no_shard"},   {"ddp", "optim"},          {"ddp", "optim_grads"},         {"fsdp", "no_shard"},
      {"fsdp", "optim"},     {"fsdp", "optim_grads"},   {"fsdp", "optim_grads_params"}, {"fsdp2", "optim_grads_params"}};
  std::vector<int> groups{0};  // (groups of one rank: the flat world's no_shard again)
  for (int s = 2; s < base.gpus; s *= 2)
    if (base.gpus % s == 0) groups.push_back(s);
  const bool cuda = base.backend == "cuda";
  for (const auto& [w, st] : ws)
    for (const int g : groups)
      for (const std::string outer : {"no_shard", "optim"}) {
        if (outer == "optim" && (g == 0 || w != "fsdp" || st != "optim_grads_params")) continue;
        for (const int gb : {2, units + 1}) {
          if (gb != 2 && (st != "optim_grads_params" || !sp.all_gather_buffers)) continue;
          for (const std::string wire : {"fp32", "bf16"}) {
            if (wire == "bf16" && (base.precision != "bf16" || !sp.bf16_wire || base.deterministic)) continue;
            for (const bool ce : {false, true}) {
              if (ce && (st != "optim_grads_params" || !sp.copy_engine || !cuda)) continue;
              for (const int saving : {0, 1, 2}) {  // nothing, --recompute-gelu, + --lend-grad-shards
                if (saving >= 1 && !cuda) continue;
                if (saving == 2 && base.accum > 1) continue;
                options o = base;
                o.wrapper = w, o.strategy = st, o.shard_group = g, o.outer = outer, o.gather_buffers = gb;
                o.wire = wire, o.copy_engine_gathers = ce;
                o.recompute_gelu = saving >= 1, o.lend_grad_shards = saving == 2;
                out.push_back(o);
              }
            }
          }
        }
      }
  return out;
}

struct scored {
  options o;
  estimate e;
};

// Step times equal to a nanosecond are ties (a mesh of one-rank groups and
// a flat world often are): the flat world first, then the least memory.
inline long long time_key(const estimate& e) { return std::llround(e.time.step_us * 1e3); }

//! The configurations that fit, fastest first.
struct choice {
  std::vector<scored> ranked;
  int tried = 0;
  //! The fastest slower one: configurations that differ from the best only
  //! in memory-saving flags that cost nothing are not rivals.
  [[nodiscard]] const scored* runner_up() const {
    for (std::size_t i = 1; i < ranked.size(); ++i)
      if (time_key(ranked[i].e) > time_key(ranked[0].e)) return &ranked[i];
    return nullptr;
  }
};

//! Every candidate over `base` (model, world, tokens, precision, limit) on `t`.
inline choice choose(const options& base, const tessera::plan::topology& t, const search_space& sp) {
  choice c;
  const auto first = evaluate_named(base, t);
  const int units = first ? first->units : int(base.units.empty() ? base.layers + 2 : base.units.size());
  const double limit = base.gpu_memory_gib * double(1ull << 30);
  for (auto& o : candidates(base, units, sp)) {
    auto e = evaluate_named(o, t);
    if (!e) continue;
    ++c.tried;
    if (limit <= 0 || double(e->total()) <= limit) c.ranked.push_back({o, *e});
  }
  const auto flat = [](const options& o) { return o.shard_group == 0 || o.shard_group == o.gpus; };
  std::stable_sort(c.ranked.begin(), c.ranked.end(), [&](const scored& a, const scored& b) {
    if (time_key(a.e) != time_key(b.e)) return time_key(a.e) < time_key(b.e);
    if (flat(a.o) != flat(b.o)) return flat(a.o);
    return a.e.total() < b.e.total();
  });
  return c;
}

}  // namespace mlp_lm::planning
