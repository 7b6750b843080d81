// tessera-mlp-lm --plan auto: the planner's choice for this world size (its
// own translation unit: the planner instantiates every configuration's plan
// on the host backend, which the trainer's CUDA translation units need not
// compile again).
#include <cstdio>
#include <string>

#include "mlp_lm/options.hpp"
#include "mlp_lm/planning.hpp"
#include "mlp_lm/topology_json.hpp"

namespace mlp_lm {

std::string apply_plan_auto(options& o, int world, double gpu_bytes) {
  planning::options p;
  p.layers = o.layers, p.d = o.d, p.ctx = o.ctx, p.tokens = o.tokens, p.gpus = world, p.accum = o.accum;
  p.precision = o.precision, p.backend = o.backend, p.deterministic = o.deterministic, p.micro_tokens = o.micro_tokens;
  p.offload = o.offload, p.offload_update = o.offload_update;
  p.gpu_memory_gib = (o.gpu_memory > 0 ? o.gpu_memory * double(1ull << 30) : gpu_bytes) / double(1ull << 30);
  planning::check(p);
  const tessera::plan::topology t = planning::read_topology(o.topology);
  // The trainer reduces in its gradient dtype and keeps two gather buffers;
  // copy engines need NCCL (--comm nccl).
  const planning::choice c = planning::choose(p, t, planning::trainer_space(o.comm == "nccl"));
  if (c.ranked.empty()) {
    char why[160];
    std::snprintf(why, sizeof why, "--plan auto: none of %d configurations fits %.3g GiB per GPU on %d ranks", c.tried,
                  p.gpu_memory_gib, world);
    throw tessera::error(why);
  }
  const auto& b = c.ranked.front();
  o.wrapper = b.o.wrapper, o.strategy = b.o.strategy, o.outer = b.o.outer;
  o.shard_group = b.o.shard_group > 0 && b.o.shard_group < world ? std::to_string(b.o.shard_group) : "";
  o.copy_engine_gathers = b.o.copy_engine_gathers, o.recompute_gelu = b.o.recompute_gelu;
  o.lend_grad_shards = b.o.lend_grad_shards;
  char gib[48] = "";
  if (p.gpu_memory_gib > 0) std::snprintf(gib, sizeof gib, " in %.3g GiB", p.gpu_memory_gib);
  const std::string limit = gib;
  char line[256];
  std::snprintf(line, sizeof line, " (predicted %.2f ms per step, %.0f MiB per GPU; best of %d configurations that fit%s)",
                b.e.time.step_us / 1e3, double(b.e.total()) / (1 << 20), int(c.ranked.size()), limit.c_str());
  std::string out = "--plan auto: " + planning::trainer_flags(b.o) + line + " on topology '" + t.name + "'";
  if (const auto* r = c.runner_up()) {
    char more[256];
    std::snprintf(more, sizeof more, "; runner-up %s %s%s, %.2f%% slower", r->o.wrapper.c_str(), r->o.strategy.c_str(),
                  r->o.shard_group > 0 && r->o.shard_group < world ? (" on a mesh of " + std::to_string(r->o.shard_group) + "-rank groups").c_str() : "",
                  100 * (r->e.time.step_us / b.e.time.step_us - 1));
    out += more;
  }
  return out;
}

}  // namespace mlp_lm
