#pragma once
// What tessera-plan's commands share: the estimate of a named configuration,
// how a configuration is written, and JSON files. main.cpp has the commands
// on the model (memory, predict, best, sweep, collective), measured.cpp the
// ones on measurements (calibrate, validate).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gpt/model.hpp"
#include "llama/model.hpp"
#include "mlp_lm/planning.hpp"
#include "mlp_lm/topology_json.hpp"

namespace plan_cli {

using mlp_lm::planning::estimate;
using mlp_lm::planning::options;
using tessera::plan::topology;

inline double mib(std::size_t b) { return double(b) / double(1 << 20); }

inline estimate evaluate_or_throw(const options& o, const topology& t) {
  if (auto e = mlp_lm::planning::evaluate_named(o, t)) return *e;
  throw tessera::error("--wrapper " + o.wrapper + " --strategy " + o.strategy + " --outer " + o.outer +
                       " is not a valid combination (ddp runs no_shard, optim, optim_grads; fsdp2 optim_grads_params; "
                       "--outer optim is compiled for --wrapper fsdp --strategy optim_grads_params, as in "
                       "tessera-mlp-lm)");
}

inline std::string describe(const options& o) {
  std::ostringstream s;
  s << o.wrapper << ' ' << o.strategy;
  if (o.shard_group > 0 && o.shard_group < o.gpus) s << " mesh " << o.gpus / o.shard_group << "x" << o.shard_group << " outer " << o.outer;
  if (o.wire != "fp32") s << " wire " << o.wire;
  if (o.gather_buffers != 2) s << " gb " << o.gather_buffers;
  if (o.copy_engine_gathers) s << " ce";
  if (o.recompute_gelu) s << " rc";
  if (o.lend_grad_shards) s << " lend";
  if (o.accum > 1) s << " accum " << o.accum;
  return s.str();
}

inline nlohmann::json time_json(const options& o, const estimate& e) {
  const double s = e.time.step_us * 1e-6;
  return {{"step_ms", e.time.step_us / 1e3},
          {"compute_ms", e.time.compute_us / 1e3},
          {"optimizer_ms", e.time.optimizer_us / 1e3},
          {"comm_alone_ms", e.time.comm_us / 1e3},
          {"exposed_ms", e.time.exposed_us / 1e3},
          {"collectives_per_step", e.time.collectives},
          {"tokens_per_s_per_gpu", double(o.tokens) / double(o.gpus) / s}};
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw tessera::error("cannot read '" + path + "'");
  try {
    return nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw tessera::error("'" + path + "' is not JSON: " + e.what());
  }
}

// The options of one tessera-bench-train result row.

//! tessera-gpt's model for `memory --model`: a preset or --layers/--heads/--d/--seq/--vocab.
struct gpt_model {
  std::string name;  // "" (the MLP), gpt2 ... gpt2-xl, or gpt (the shape from the flags)
  gpt::model_shape shape;
  int batch = 4;
  bool recompute = false, keep_gelu = false;  // tessera-gpt's --recompute, --keep-gelu
};
//! tessera-gpt's bytes per rank (gpt.cpp).
estimate gpt_estimate(const options& o, const gpt_model& g);

//! tessera-llama's model for `memory --model`: a preset or the shape flags.
struct llama_model {
  std::string name;  // llama3.2-1b, llama3.2-3b, llama3.1-8b, or llama (the shape from the flags)
  llama::model_shape shape;
  int batch = 4;
  bool recompute = false;
};
//! tessera-llama's bytes per rank (llama.cpp).
estimate llama_estimate(const options& o, const llama_model& l);

int cmd_calibrate(const std::vector<std::string>& colls, const std::vector<std::string>& trains, int gpus_per_node,
                  const std::string& out, const std::string& name);
int cmd_validate(const std::string& dir, const std::string& topo_path, double time_bound, double mem_bound, bool json);

}  // namespace plan_cli
