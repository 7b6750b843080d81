// tessera-plan: what a configuration needs and how fast it runs, before anything is allocated.
//
//   tessera-plan memory    MODEL --gpus N [CONFIG] [--gpu-memory GiB] [--json]
//   tessera-plan predict   MODEL --gpus N [CONFIG] [--topology FILE] [--json]
//   tessera-plan sweep     MODEL --tokens-per-gpu T [--gpus-list 8,...,4096] [--topology FILE] [--json-out FILE]
//   tessera-plan best      MODEL --gpus N --gpu-memory GiB [--topology FILE] [--json]
//   tessera-plan calibrate --collectives F.json... --train F.json... [-o FILE]
//   tessera-plan validate  [--results DIR] [--topology FILE] [--json]
//   tessera-plan collective --op OP [--bytes B] [--gpus-list ...] [--topology FILE]
//
// MODEL: the reference model (--layers L --d D --ctx K --tokens T, as
// tessera-mlp-lm) or --units FILE (a JSON list of {name, params,
// flops_per_token, activation_bytes_per_token}). CONFIG: --wrapper,
// --strategy, --shard-group S --outer no_shard|optim, --precision, --wire,
// --accum, --gather-buffers, --recompute-gelu, --lend-grad-shards,
// --copy-engine-gathers, --offload-optimizer, --deterministic.
//
// Memory is the library's own plan (tessera/plan/memory.hpp, equal byte for
// byte to what a run allocates) plus the trainer's activations: the total is
// the estimate tessera-mlp-lm prints for the same flags. Time is the
// schedule the engine issues (tessera/plan/schedule.hpp) over the
// collectives' cost model (tessera/plan/cost.hpp), on a topology fitted to
// this machine's measurements (calibrate) or published figures.
// Exit codes: 2 bad input, 3 (memory, predict) does not fit --gpu-memory,
// 1 (validate) a row off by more than its bound, (best) nothing fits.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "mlp_lm/planning.hpp"
#include "mlp_lm/topology_json.hpp"

namespace {

using mlp_lm::planning::estimate;
using mlp_lm::planning::options;
using tessera::plan::topology;

double mib(std::size_t b) { return double(b) / double(1 << 20); }

void add_model(CLI::App* a, options& o, std::string& units) {
  a->add_option("--layers", o.layers)->check(CLI::Range(0, 1 << 12));
  a->add_option("--d", o.d, "model width (a multiple of --ctx)")->check(CLI::Range(1, 1 << 16));
  a->add_option("--ctx", o.ctx)->check(CLI::Range(1, 1 << 12));
  a->add_option("--tokens", o.tokens, "global batch in tokens per step")->check(CLI::Range(1L, 1L << 40));
  a->add_option("--units", units, "a JSON list of units {name, params, flops_per_token, activation_bytes_per_token} "
                                  "instead of the reference model");
}

void add_config(CLI::App* a, options& o) {
  a->add_option("--accum", o.accum, "micro-batches per step")->check(CLI::Range(1, 1 << 20));
  a->add_option("--shard-group", o.shard_group, "ranks per shard group of a mesh (0: the whole world)")
      ->check(CLI::Range(0, 1 << 20));
  a->add_option("--outer", o.outer, "across the mesh's replica groups: no_shard (HSDP) or optim (HFSDP)")
      ->check(CLI::IsMember({"no_shard", "optim"}));
  a->add_option("--wrapper", o.wrapper)->check(CLI::IsMember({"ddp", "fsdp", "fsdp2"}));
  a->add_option("--strategy", o.strategy)
      ->check(CLI::IsMember({"no_shard", "optim", "optim_grads", "optim_grads_params"}));
  a->add_option("--precision", o.precision)->check(CLI::IsMember({"fp32", "bf16"}));
  a->add_option("--wire", o.wire, "dtype gradients are reduced in (bf16: with --precision bf16)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  a->add_option("--gather-buffers", o.gather_buffers)->check(CLI::Range(1, 1 << 16));
  a->add_flag("--recompute-gelu", o.recompute_gelu);
  a->add_flag("--lend-grad-shards", o.lend_grad_shards,
              "gradient shards in the CUDA trainer's activations (wrapper_options::lend_grad_shards)");
  a->add_flag("--copy-engine-gathers", o.copy_engine_gathers, "all-gathers on copy engines (take no SMs)");
  mlp_lm::add_offload_options(*a, o.offload, o.offload_update);
  a->add_option("--backend", o.backend, "whose activations: cuda (the GPU trainer) or host")
      ->check(CLI::IsMember({"cuda", "host"}));
  a->add_flag("--deterministic", o.deterministic, "exact_reduction with fixed micro-batches (the trainer's --deterministic)");
  a->add_option("--micro-tokens", o.micro_tokens, "--deterministic: tokens per micro-batch")->check(CLI::Range(1L, 1L << 30));
}

estimate evaluate_or_throw(const options& o, const topology& t) {
  if (auto e = mlp_lm::planning::evaluate_named(o, t)) return *e;
  throw tessera::error("--wrapper " + o.wrapper + " --strategy " + o.strategy + " --outer " + o.outer +
                       " is not a valid combination (ddp runs no_shard, optim, optim_grads; fsdp2 optim_grads_params; "
                       "--outer optim is compiled for --wrapper fsdp --strategy optim_grads_params, as in "
                       "tessera-mlp-lm)");
}

std::string describe(const options& o) {
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

// The flags that give this configuration to tessera-mlp-lm.
std::string trainer_flags(const options& o) {
  std::ostringstream s;
  s << "--wrapper " << o.wrapper << " --strategy " << o.strategy << " --precision " << o.precision;
  if (o.shard_group > 0 && o.shard_group < o.gpus) s << " --shard-group " << o.shard_group << " --outer " << o.outer;
  if (o.gather_buffers != 2) s << " --gather-buffers " << o.gather_buffers;
  if (o.copy_engine_gathers) s << " --copy-engine-gathers";
  if (o.recompute_gelu) s << " --recompute-gelu";
  if (o.lend_grad_shards) s << " --lend-grad-shards";
  if (o.accum > 1) s << " --accum " << o.accum;
  if (o.wire != "fp32") s << " (wire " << o.wire << ": tessera-bench-train --wire)";
  return s.str();
}

nlohmann::json time_json(const options& o, const estimate& e) {
  const double s = e.time.step_us * 1e-6;
  return {{"step_ms", e.time.step_us / 1e3},
          {"compute_ms", e.time.compute_us / 1e3},
          {"optimizer_ms", e.time.optimizer_us / 1e3},
          {"comm_alone_ms", e.time.comm_us / 1e3},
          {"exposed_ms", e.time.exposed_us / 1e3},
          {"collectives_per_step", e.time.collectives},
          {"tokens_per_s_per_gpu", double(o.tokens) / double(o.gpus) / s}};
}

// ---- memory (the first command; its output is what check_plan_tool.py compares) ----
int cmd_memory(const options& o) {
  const estimate e = evaluate_or_throw(o, topology{});
  const std::size_t total = e.total();
  const double limit = o.gpu_memory_gib * double(1ull << 30);
  const bool fits = limit <= 0 || double(total) <= limit;
  const int S = o.shard_group > 0 ? o.shard_group : o.gpus, R = o.gpus / S;
  if (o.json) {
    nlohmann::json j{{"params", e.params},
                     {"gpus", o.gpus},
                     {"shard_group", S},
                     {"replicas", R},
                     {"outer", o.outer},
                     {"wrapper", o.wrapper},
                     {"strategy", o.strategy},
                     {"precision", o.precision},
                     {"wire", o.wire},
                     {"backend", o.backend},
                     {"tokens_per_rank", e.tokens_per_rank},
                     {"compute_weights_bytes", e.m.model.compute_weights},
                     {"main_weights_bytes", e.m.model.main_weights},
                     {"grads_bytes", e.m.model.grads},
                     {"gathered_buffers_bytes", e.m.model.gathered_buffers},
                     {"reduction_buffers_bytes", e.m.model.reduction_buffers},
                     {"model_state_bytes", e.m.model.total() + e.own},
                     {"own_lent_shard_bytes", e.own},
                     {"optimizer_state_bytes", e.m.optimizer},
                     {"activations_bytes", e.act},
                     {"blas_workspace_bytes", e.blas},
                     {"total_bytes", total},
                     {"offloaded_bytes", e.m.host_total()},
                     {"fits", fits}};
    if (limit > 0) j["gpu_memory_bytes"] = limit;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("tessera-plan: %zu parameters, %s / %s / %s on %d rank%s (mesh %d x %d, outer %s), %zu tokens per "
                "rank and micro-batch, %s backend\n",
                e.params, o.wrapper.c_str(), o.strategy.c_str(), o.precision.c_str(), o.gpus, o.gpus == 1 ? "" : "s",
                R, S, o.outer.c_str(), e.tokens_per_rank, o.backend.c_str());
    std::printf("  compute weights   %12.2f MiB\n  main weights      %12.2f MiB\n  gradients         %12.2f MiB\n"
                "  gathered units    %12.2f MiB\n  reduction buffers %12.2f MiB\n  shards not lent   %12.2f MiB\n"
                "  optimizer state   %12.2f MiB\n"
                "  activations       %12.2f MiB\n  BLAS workspace    %12.2f MiB\n  total per rank    %12.2f MiB%s\n"
                "  offloaded (host)  %12.2f MiB\n",
                mib(e.m.model.compute_weights), mib(e.m.model.main_weights), mib(e.m.model.grads),
                mib(e.m.model.gathered_buffers), mib(e.m.model.reduction_buffers), mib(e.own), mib(e.m.optimizer),
                mib(e.act), mib(e.blas), mib(total), limit > 0 ? (fits ? "  (fits)" : "  (does NOT fit)") : "",
                mib(e.m.host_total()));
  }
  return fits ? 0 : 3;
}

int cmd_predict(const options& o, const topology& t) {
  const estimate e = evaluate_or_throw(o, t);
  const double limit = o.gpu_memory_gib * double(1ull << 30);
  const bool fits = limit <= 0 || double(e.total()) <= limit;
  nlohmann::json j = time_json(o, e);
  j["config"] = describe(o);
  j["gpus"] = o.gpus;
  j["params"] = e.params;
  j["tokens_per_rank"] = e.tokens_per_rank;
  j["memory_bytes"] = e.total();
  j["fits"] = fits;
  j["topology"] = t.name;
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("tessera-plan: %zu parameters, %s on %d GPUs (%d per node), %zu tokens per rank and micro-batch\n"
                "  topology          %s\n"
                "  step              %12.3f ms  (%.0f tokens/s per GPU)\n"
                "  compute alone     %12.3f ms  (forward + backward, %.0f TFLOP/s)\n"
                "  optimizer         %12.3f ms\n"
                "  collectives alone %12.3f ms  (%d per step)\n"
                "  exposed           %12.3f ms\n"
                "  memory per GPU    %12.2f MiB%s\n",
                e.params, describe(o).c_str(), o.gpus, t.gpus_per_node, e.tokens_per_rank, t.name.c_str(),
                e.time.step_us / 1e3, j["tokens_per_s_per_gpu"].get<double>(), e.time.compute_us / 1e3, t.tflops,
                e.time.optimizer_us / 1e3, e.time.comm_us / 1e3, e.time.collectives, e.time.exposed_us / 1e3,
                mib(e.total()), limit > 0 ? (fits ? "  (fits)" : "  (does NOT fit)") : "");
  }
  return fits ? 0 : 3;
}

int cmd_best(const options& base, const topology& t, const std::string& search) {
  const auto space = search == "all" ? mlp_lm::planning::search_space{}
                                     : mlp_lm::planning::trainer_space(search == "trainer-nccl");
  const mlp_lm::planning::choice c = mlp_lm::planning::choose(base, t, space);
  const double limit = base.gpu_memory_gib * double(1ull << 30);
  if (c.ranked.empty()) {
    std::fprintf(stderr, "tessera: none of %d configurations fits %.2f GiB per GPU\n", c.tried, base.gpu_memory_gib);
    return 1;
  }
  const auto row = [&](const mlp_lm::planning::scored& s) {
    nlohmann::json j = time_json(s.o, s.e);
    j["config"] = describe(s.o);
    j["flags"] = trainer_flags(s.o);
    j["memory_bytes"] = s.e.total();
    return j;
  };
  const auto& best = c.ranked.front();
  nlohmann::json j{{"gpus", base.gpus}, {"tried", c.tried}, {"fit", c.ranked.size()}, {"best", row(best)}, {"topology", t.name}};
  if (const auto* r = c.runner_up()) {
    j["runner_up"] = row(*r);
    j["margin"] = r->e.time.step_us / best.e.time.step_us - 1.0;
  }
  if (base.json) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("tessera-plan best: %d GPUs, %d configurations, %zu fit", base.gpus, c.tried, c.ranked.size());
  if (limit > 0) std::printf(" in %.2f GiB", base.gpu_memory_gib);
  std::printf(" (topology %s)\n", t.name.c_str());
  for (std::size_t i = 0; i < std::min<std::size_t>(c.ranked.size(), 5); ++i)
    std::printf("  %zu. %-58s %9.3f ms  %8.0f tokens/s/GPU  %9.1f MiB\n", i + 1, describe(c.ranked[i].o).c_str(),
                c.ranked[i].e.time.step_us / 1e3, double(base.tokens) / base.gpus / (c.ranked[i].e.time.step_us * 1e-6),
                mib(c.ranked[i].e.total()));
  std::printf("best: %s\n", trainer_flags(best.o).c_str());
  if (j.contains("margin"))
    std::printf("runner-up: %s, %.2f%% slower\n", j["runner_up"]["config"].get<std::string>().c_str(),
                100 * j["margin"].get<double>());
  return 0;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');) {
    try {
      out.push_back(std::stoi(x));
    } catch (...) {
      throw tessera::error("'" + x + "' in list '" + s + "' is not a number");
    }
    if (out.back() < 1) throw tessera::error("list '" + s + "' holds " + x + " (must be at least 1)");
  }
  if (out.empty()) throw tessera::error("empty list");
  return out;
}

// Weak scaling: the same tokens per GPU from 8 to 4096 GPUs, one line per configuration.
int cmd_sweep(const options& base, const topology& t, long tokens_per_gpu, const std::string& gpus_list,
              const std::string& out_path) {
  const std::vector<int> worlds = parse_list(gpus_list);
  struct line {
    std::string label, wrapper, strategy, outer;
    int group;  // 0: the whole world; else ranks per shard group
  };
  const int g = t.gpus_per_node;
  const std::vector<line> lines{
      {"fsdp optim_grads_params (flat)", "fsdp", "optim_grads_params", "no_shard", 0},
      {"fsdp optim_grads_params HSDP " + std::to_string(g) + "/group", "fsdp", "optim_grads_params", "no_shard", g},
      {"fsdp optim_grads_params HFSDP " + std::to_string(g) + "/group", "fsdp", "optim_grads_params", "optim", g},
      {"fsdp optim_grads (flat)", "fsdp", "optim_grads", "no_shard", 0},
      {"ddp no_shard", "ddp", "no_shard", "no_shard", 0},
  };
  nlohmann::json rows = nlohmann::json::array();
  std::printf("tessera-plan sweep: %ld tokens per GPU, topology %s\n", tokens_per_gpu, t.name.c_str());
  std::printf("%6s  %-44s %10s %14s %10s %12s %5s\n", "GPUs", "configuration", "step ms", "tokens/s/GPU", "exposed",
              "MiB/GPU", "fits");
  for (const int n : worlds)
    for (const auto& l : lines) {
      if (l.group > 0 && (l.group >= n || n % l.group != 0)) continue;
      options o = base;
      o.gpus = n, o.tokens = tokens_per_gpu * n, o.wrapper = l.wrapper, o.strategy = l.strategy, o.outer = l.outer;
      o.shard_group = l.group;
      mlp_lm::planning::check(o);
      const estimate e = evaluate_or_throw(o, t);
      const double limit = o.gpu_memory_gib * double(1ull << 30);
      const bool fits = limit <= 0 || double(e.total()) <= limit;
      nlohmann::json j = time_json(o, e);
      j["gpus"] = n, j["line"] = l.label, j["memory_bytes"] = e.total(), j["fits"] = fits;
      rows.push_back(j);
      std::printf("%6d  %-44s %10.3f %14.0f %10.3f %12.1f %5s\n", n, l.label.c_str(), e.time.step_us / 1e3,
                  j["tokens_per_s_per_gpu"].get<double>(), e.time.exposed_us / 1e3, mib(e.total()), fits ? "yes" : "no");
    }
  if (!out_path.empty()) {
    std::ofstream f(out_path);
    f << nlohmann::json{{"topology", mlp_lm::planning::to_json(t)},
                        {"model", {{"layers", base.layers}, {"d", base.d}, {"ctx", base.ctx}}},
                        {"tokens_per_gpu", tokens_per_gpu},
                        {"rows", rows}}
             .dump(1)
      << "\n";
    if (!f) throw tessera::error("cannot write '" + out_path + "'");
  }
  return 0;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw tessera::error("cannot read '" + path + "'");
  try {
    return nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw tessera::error("'" + path + "' is not JSON: " + e.what());
  }
}

// The options of one tessera-bench-train result row.
options bench_options(const nlohmann::json& j, const nlohmann::json& r) {
  options o;
  o.layers = j.at("layers"), o.d = j.at("d"), o.ctx = j.at("ctx"), o.tokens = j.at("tokens"), o.gpus = j.at("world");
  o.accum = j.value("accum", 1), o.gather_buffers = j.value("gather_buffers", 2), o.wire = j.value("wire", "fp32");
  o.recompute_gelu = j.value("recompute_gelu", false), o.lend_grad_shards = j.value("lend_grad_shards", false);
  o.copy_engine_gathers = j.value("copy_engine_gathers", false), o.wrapper = j.value("wrapper", "fsdp");
  o.strategy = r.at("strategy"), o.precision = "bf16", o.backend = "cuda";
  const int replicas = j.value("replicas", 1);
  if (replicas > 1) o.shard_group = o.gpus / replicas, o.outer = j.value("outer", "no_shard");
  return o;
}

// tessera-bench-train's printed output (runs measured before --json wrote
// every variant, and logs of several runs in one file) as the JSON it would
// have written, one object per run: the header line names ranks, comm,
// wrapper, model and tokens; flag lines the gather buffers, wire,
// recomputation, lent shards, copy engines and mesh; table rows the
// strategy, ms per step (column 2) and peak MiB (column 9). Runs whose
// header lacks the wrapper (before 2026-11-30; the same runs have JSON) or
// that reshape GEMMs (--gemm-sms) are left out.
std::vector<nlohmann::json> read_bench_text(const std::string& path) {
  std::ifstream f(path);
  std::vector<nlohmann::json> out;
  bool skip = true;
  static const std::regex head(
      R"(^# tessera-bench-train on .*: (\d+) ranks? \((\w+)\), wrapper (\w+), layers (\d+), d (\d+), ctx (\d+), (\d+) tokens per step \((\d+) micro-batch)");
  static const std::regex bufs(R"(^# (\d+) gather buffers, gradients reduced in (\w+))");
  static const std::regex mesh(R"(^# mesh (\d+) x (\d+) .*outer (\w+))");
  static const std::regex row(R"(^(no_shard|optim|optim_grads|optim_grads_params)\s+([0-9.]+)\s+(?:[-0-9.%]+\s+){6}([0-9.]+))");
  std::smatch m;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("# tessera-bench-train on", 0) == 0) {
      skip = !std::regex_search(line, m, head);
      if (skip) continue;
      out.push_back({{"world", std::stoi(m[1])}, {"comm", m[2] == "NCCL" ? "nccl" : "mpi"}, {"wrapper", m[3]},
                     {"layers", std::stoi(m[4])}, {"d", std::stoi(m[5])}, {"ctx", std::stoi(m[6])},
                     {"tokens", std::stol(m[7])}, {"accum", std::stoi(m[8])}, {"results", nlohmann::json::array()}});
      continue;
    }
    if (skip || out.empty()) continue;
    auto& j = out.back();
    if (line.rfind("# GEMMs shaped for", 0) == 0) skip = true, out.pop_back();
    else if (std::regex_search(line, m, bufs)) {
      j["gather_buffers"] = std::stoi(m[1]), j["wire"] = m[2].str();
      j["recompute_gelu"] = line.find("GELU outputs recomputed") != std::string::npos;
      j["lend_grad_shards"] = line.find("gradient shards in lent activations") != std::string::npos;
    } else if (line.rfind("# all-gathers on copy engines", 0) == 0) {
      j["copy_engine_gathers"] = true;
    } else if (std::regex_search(line, m, mesh)) {
      j["replicas"] = std::stoi(m[1]), j["outer"] = m[3].str();
    } else if (std::regex_search(line, m, row)) {
      j["results"].push_back({{"strategy", m[1].str()}, {"ms", std::stod(m[2])}, {"peak_bytes", std::stod(m[3]) * (1 << 20)}});
    }
  }
  std::erase_if(out, [](const nlohmann::json& j) { return j["results"].empty(); });
  return out;
}

bool is_bench_train(const nlohmann::json& j) {
  return j.is_object() && j.contains("results") && j.contains("world") && j.contains("layers") && j.contains("tokens");
}

int cmd_calibrate(const std::vector<std::string>& colls, const std::vector<std::string>& trains, int gpus_per_node,
                  const std::string& out, const std::string& name) {
  topology t;
  t.name = name;
  std::vector<tessera::plan::sample> rows;
  std::vector<std::string> used;
  for (const auto& p : colls) {
    const auto j = read_json(p);
    if (j.value("comm", "") != "nccl") {
      std::fprintf(stderr, "tessera-plan calibrate: %s is not NCCL (comm %s): left out\n", p.c_str(),
                   j.value("comm", "?").c_str());
      continue;
    }
    const int n = j.at("world");
    for (const auto& r : j.at("rows"))
      if (r.value("impl", "") == "raw" && r.value("placement", "") == "outplace" && r.value("wrong", 0) == 0)
        rows.push_back({tessera::plan::collective_named(r.at("op").get<std::string>()), n, r.at("bytes"), r.at("time_us")});
    used.push_back(std::filesystem::path(p).filename().string());
  }
  tessera::plan::fit(t, rows);
  t.gpus_per_node = gpus_per_node;
  // Compute: one GPU's step less its optimizer is forward + backward, whose
  // elementwise bytes go at the measured copy speed and the rest sets the
  // rate. Interference: then the multi-GPU steps' time, matched by bisection.
  std::vector<std::pair<options, double>> multi;
  // One-GPU rows: measured forward + backward time y = flops / rate + bytes / copy + units x overhead.
  struct solo_row {
    double flops, bytes, units, us, copy;
  };
  std::vector<solo_row> solo;
  for (const auto& p : trains) {
    const auto j = read_json(p);
    if (!is_bench_train(j)) throw tessera::error("'" + p + "' is not tessera-bench-train --json output");
    used.push_back(std::filesystem::path(p).filename().string());
    for (const auto& r : j.at("results")) {
      options o = bench_options(j, r);
      if (o.gpus == 1) {
        const auto ops = mlp_lm::planning::compute_of(o, double(o.tokens / o.accum));
        solo_row s{0, 0, double(ops.size()), (r.at("ms").get<double>() - r.at("optimizer_ms").get<double>()) * 1e3 / o.accum,
                   j.at("copy_gbs").get<double>()};
        for (const auto& u : ops) s.flops += u.forward_flops + u.backward_flops, s.bytes += u.forward_bytes + u.backward_bytes;
        solo.push_back(s);
      } else {
        multi.emplace_back(o, r.at("ms").get<double>());
      }
    }
  }
  if (solo.empty()) throw tessera::error("calibrate needs a one-GPU tessera-bench-train --json (--train FILE)");
  const int rate_n = int(solo.size());
  t.copy_gbs = 0;
  for (const auto& s : solo) t.copy_gbs += s.copy / rate_n;
  // Least squares on relative error for 1 / rate and the overhead; one
  // model size alone cannot tell them apart, so the overhead stays 0.
  double a00 = 0, a01 = 0, a11 = 0, b0 = 0, b1 = 0, f0 = solo.front().flops;
  bool shapes = false;
  for (const auto& s : solo) {
    const double w = 1.0 / (s.us * s.us), y = s.us - s.bytes / (t.copy_gbs * 1e3);
    a00 += w * s.flops * s.flops, a01 += w * s.flops * s.units, a11 += w * s.units * s.units;
    b0 += w * s.flops * y, b1 += w * s.units * y;
    shapes |= std::abs(s.flops / f0 - 1.0) > 0.5;
  }
  double inv_rate = b0 / a00, overhead = 0;
  if (shapes) {
    const double det = a00 * a11 - a01 * a01;
    inv_rate = (b0 * a11 - b1 * a01) / det, overhead = (a00 * b1 - a01 * b0) / det;
    if (overhead < 0) inv_rate = b0 / a00, overhead = 0;
  }
  t.tflops = 1.0 / inv_rate / 1e6;
  t.unit_overhead_us = overhead;
  if (!multi.empty()) {
    const auto error_at = [&](double k) {
      t.interference = k;
      double e = 0;
      for (auto& [o, ms] : multi) e += evaluate_or_throw(o, t).time.step_us / 1e3 - ms;
      return e;
    };
    double lo = 0, hi = 0.95;
    if (error_at(lo) >= 0) hi = lo;
    else if (error_at(hi) <= 0) lo = hi;
    for (int i = 0; i < 60 && hi - lo > 1e-6; ++i) (error_at((lo + hi) / 2) < 0 ? lo : hi) = (lo + hi) / 2;
    t.interference = (lo + hi) / 2;
  }
  std::string from;
  for (const auto& u : used) from += (from.empty() ? "" : ", ") + u;
  t.source = "calibrated by tessera-plan calibrate from " + from + " (inside one node: latency and bandwidth per "
             "collective; compute rate and copy speed from the one-GPU step; interference from the multi-GPU steps); "
             "between nodes: published figures (NIC 45 GB/s of 400 Gb/s NDR, 14 us per hop)";
  nlohmann::json j = mlp_lm::planning::to_json(t);
  j["calibrated_from"] = used;
  if (out.empty()) std::printf("%s\n", j.dump(1).c_str());
  else {
    std::ofstream f(out);
    f << j.dump(1) << "\n";
    if (!f) throw tessera::error("cannot write '" + out + "'");
    std::printf("tessera-plan calibrate: %zu collective rows, %d one-GPU steps, %zu multi-GPU steps -> %s\n"
                "  %.1f TFLOP/s, %.2f us per unit, copy %.0f GB/s, interference %.3f\n",
                rows.size(), rate_n, multi.size(), out.c_str(), t.tflops, t.unit_overhead_us, t.copy_gbs, t.interference);
  }
  return 0;
}

// bench/results/superseded.txt: "FILE [STRATEGY,...]: why" per line; rows
// measured on code since changed where the change matters (they stay as the
// record of their day, but today's library is not expected to match them).
std::vector<std::pair<std::string, std::string>> superseded(const std::filesystem::path& dir) {
  std::vector<std::pair<std::string, std::string>> out;  // ("file strategy", why)
  std::ifstream f(dir / "superseded.txt");
  for (std::string line; std::getline(f, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto colon = line.find(':');
    std::istringstream head(line.substr(0, colon));
    std::string file, strategies;
    head >> file >> strategies;
    const std::string why = colon == std::string::npos ? "" : line.substr(colon + 1);
    if (strategies.empty()) out.emplace_back(file + " *", why);
    std::stringstream list(strategies);
    for (std::string st; std::getline(list, st, ',');) out.emplace_back(file + " " + st, why);
  }
  return out;
}

int cmd_validate(const std::string& dir, const std::string& topo_path, double time_bound, double mem_bound, bool json) {
  nlohmann::json whole;
  std::string path = topo_path;
  if (path.empty()) {  // the newest calibration among the results
    for (const auto& f : std::filesystem::directory_iterator(dir))
      if (f.path().filename().string().ends_with("-topology.json") && f.path().string() > path) path = f.path().string();
    if (path.empty()) throw tessera::error("no --topology and no *-topology.json in '" + dir + "' (tessera-plan calibrate writes one)");
  }
  const topology t = mlp_lm::planning::read_topology(path, &whole);
  std::vector<std::string> in_cal;
  if (whole.contains("calibrated_from")) in_cal = whole["calibrated_from"].get<std::vector<std::string>>();
  const auto old = superseded(dir);
  std::vector<std::filesystem::path> files;
  for (const auto& f : std::filesystem::directory_iterator(dir))
    if (f.path().extension() == ".json" || f.path().extension() == ".txt") files.push_back(f.path());
  // JSON first (a run logged both ways keeps its JSON file's name), then by name.
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) {
    return a.extension() != b.extension() ? a.extension() == ".json" : a < b;
  });
  nlohmann::json rows = nlohmann::json::array();
  int off = 0, n = 0, skipped = 0;
  std::vector<std::string> seen;  // a run logged as text and as JSON counts once
  if (!json)
    std::printf("%-48s %-2s %-36s %8s %9s %7s %9s %9s %7s\n", "file", "N", "configuration", "ms", "predicted", "off",
                "peak MiB", "plan MiB", "off");
  for (const auto& p : files) {
    std::vector<nlohmann::json> runs;
    if (p.extension() == ".txt") {
      if (std::filesystem::exists(std::filesystem::path(p).replace_extension(".json"))) continue;
      runs = read_bench_text(p.string());
    } else {
      try {
        runs.push_back(read_json(p.string()));
      } catch (const tessera::error&) {
        continue;
      }
    }
    const std::string name = p.filename().string();
    const bool cal = std::find(in_cal.begin(), in_cal.end(), name) != in_cal.end();
    for (const auto& j : runs) {
      if (!is_bench_train(j) || j.value("comm", "nccl") != "nccl") continue;
      for (const auto& r : j.at("results")) {
        options o = bench_options(j, r);
        mlp_lm::planning::check(o);
        const double ms = r.at("ms"), peak = r.at("peak_bytes").get<double>();
        char key[64];
        std::snprintf(key, sizeof key, " %d %.2f %.0f", o.gpus, ms, peak / double(1 << 20));
        const std::string id = describe(o) + key;
        if (std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
        seen.push_back(id);
        const estimate e = evaluate_or_throw(o, t);
        const auto why = std::find_if(old.begin(), old.end(), [&](const auto& s) {
          return s.first == name + " *" || s.first == name + " " + o.strategy;
        });
        // The benchmark's peak is what the library's allocator counted: the
        // plan less the cuBLASLt workspace, which cuBLASLt holds.
        const double pred = e.time.step_us / 1e3, dt = pred / ms - 1.0;
        const double planned = double(e.total() - e.blas), dm = planned / peak - 1.0;
        // Text logs give the peak in MiB to 0.1: within that, equal.
        const double mem_slack = p.extension() == ".txt" ? 0.06 * double(1 << 20) / peak : 0.0;
        const bool gone = why != old.end();
        const bool bad = !gone && (std::abs(dt) > time_bound || std::abs(dm) > mem_bound + mem_slack);
        off += bad, n += !gone, skipped += gone;
        rows.push_back({{"file", name}, {"gpus", o.gpus}, {"config", describe(o)}, {"measured_ms", ms},
                        {"predicted_ms", pred}, {"time_off", dt}, {"peak_bytes", peak}, {"planned_bytes", planned},
                        {"memory_off", dm}, {"in_calibration", cal}, {"superseded", gone ? why->second : ""},
                        {"within_bounds", !bad}});
        if (!json)
          std::printf("%-48s %-2d %-36s %8.2f %9.2f %+6.1f%% %9.0f %9.0f %+6.2f%%%s%s%s\n", name.c_str(), o.gpus,
                      describe(o).c_str(), ms, pred, 100 * dt, peak / double(1 << 20), planned / double(1 << 20), 100 * dm,
                      cal ? "  calibration" : "", gone ? "  superseded" : "", bad ? "  OFF" : "");
      }
    }
  }
  if (n + skipped == 0) throw tessera::error("no tessera-bench-train --json file in '" + dir + "'");
  if (json)
    std::printf("%s\n", nlohmann::json{{"topology", t.name}, {"rows", rows}, {"off", off}, {"superseded", skipped}}.dump().c_str());
  else
    std::printf("%d of %d rows within %.0f%% (time) and %.0f%% (memory) on topology '%s'; %d superseded rows not "
                "counted (%s/superseded.txt says why)\n",
                n - off, n, 100 * time_bound, 100 * mem_bound, t.name.c_str(), skipped, dir.c_str());
  return off == 0 ? 0 : 1;
}

// The cost model of one collective against world size (what nccl-tests would print).
int cmd_collective(const topology& t, const std::string& op, double bytes, const std::string& gpus_list, bool json) {
  const auto c = tessera::plan::collective_named(op);
  nlohmann::json rows = nlohmann::json::array();
  if (!json) std::printf("tessera-plan collective: %s of %.0f bytes, topology %s\n%8s %6s %12s %12s\n", op.c_str(), bytes,
                         t.name.c_str(), "GPUs", "nodes", "time us", "busbw GB/s");
  for (const int n : parse_list(gpus_list)) {
    const auto p = tessera::plan::place(t, n);
    const double us = tessera::plan::collective_us(t, c, bytes, n), bw = tessera::plan::busbw_gbs(t, c, bytes, n);
    rows.push_back({{"gpus", n}, {"nodes", p.nodes}, {"time_us", us}, {"busbw_gbs", bw}});
    if (!json) std::printf("%8d %6d %12.1f %12.1f\n", n, p.nodes, us, bw);
  }
  if (json) std::printf("%s\n", nlohmann::json{{"op", op}, {"bytes", bytes}, {"rows", rows}}.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  std::string units, topo, out, results = "bench/results", gpus_list = "8,16,32,64,128,256,512,1024,2048,4096";
  std::vector<std::string> colls, trains;
  long tokens_per_gpu = 8192;
  int gpus_per_node = 8;
  double time_bound = 0.10, mem_bound = 0.02;
  CLI::App app{"tessera-plan: memory and step time of a configuration before allocating, and the best one"};
  app.require_subcommand(1);
  CLI::App* mem = app.add_subcommand("memory", "bytes per rank: the library's own plan plus the trainer's activations");
  CLI::App* pre = app.add_subcommand("predict", "step time, tokens/s per GPU, exposed communication and memory");
  CLI::App* swp = app.add_subcommand("sweep", "weak scaling over world sizes, one line per configuration");
  CLI::App* bst = app.add_subcommand("best", "the fastest configuration that fits, the runner-up and the margin");
  CLI::App* cal = app.add_subcommand("calibrate", "fit a topology to tessera-collectives and tessera-bench-train JSON");
  CLI::App* val = app.add_subcommand("validate", "predicted against measured for every tessera-bench-train JSON");
  CLI::App* col = app.add_subcommand("collective", "the cost model of one collective over world sizes");
  std::string op = "reduce_scatter";
  double bytes = double(1ull << 33);
  col->add_option("--op", op)->check(CLI::IsMember({"all_gather", "reduce_scatter", "all_reduce", "broadcast"}));
  col->add_option("--bytes", bytes, "nccl-tests' size (default 8 GiB)")->check(CLI::PositiveNumber);
  col->add_option("--gpus-list", gpus_list, "world sizes, comma-separated");
  col->add_flag("--json", o.json);
  for (CLI::App* a : {mem, pre, swp, bst}) {
    add_model(a, o, units);
    add_config(a, o);
    a->add_option("--gpu-memory", o.gpu_memory_gib, "GiB per GPU to fit in")->check(CLI::NonNegativeNumber);
    a->add_flag("--json", o.json);
  }
  for (CLI::App* a : {mem, pre, bst}) a->add_option("--gpus", o.gpus, "ranks in all")->check(CLI::Range(1, 1 << 20));
  for (CLI::App* a : {pre, swp, bst, val, col})
    a->add_option("--topology", topo, "a topology JSON (calibrate writes one; default: published 8xH200 figures)");
  std::string search = "all";
  bst->add_option("--search", search,
                  "all, or what tessera-mlp-lm --plan auto searches: trainer (fp32 wire, two gather buffers, no copy "
                  "engines), trainer-nccl (copy engines too)")
      ->check(CLI::IsMember({"all", "trainer", "trainer-nccl"}));
  swp->add_option("--tokens-per-gpu", tokens_per_gpu)->check(CLI::Range(1L, 1L << 30));
  swp->add_option("--gpus-list", gpus_list, "world sizes, comma-separated");
  swp->add_option("--json-out", out, "write the rows as JSON (bench/plot_plan.py draws them)");
  cal->add_option("--collectives", colls, "tessera-collectives --json files (NCCL, several world sizes)")->expected(1, -1);
  cal->add_option("--train", trains, "tessera-bench-train --json files: one GPU (compute), several (interference)")
      ->expected(1, -1)
      ->required();
  cal->add_option("--gpus-per-node", gpus_per_node)->check(CLI::Range(1, 1 << 10));
  cal->add_option("-o,--out", out, "write the topology here (default: print it)");
  std::string cal_name = "calibrated";
  cal->add_option("--name", cal_name, "the topology's name");
  val->add_option("--results", results, "a folder of JSON results")->check(CLI::ExistingDirectory);
  val->add_option("--time-bound", time_bound)->check(CLI::NonNegativeNumber);
  val->add_option("--memory-bound", mem_bound)->check(CLI::NonNegativeNumber);
  val->add_flag("--json", o.json);
  CLI11_PARSE(app, argc, argv);
  try {
    if (cal->parsed()) return cmd_calibrate(colls, trains, gpus_per_node, out, cal_name);
    if (val->parsed()) return cmd_validate(results, topo, time_bound, mem_bound, o.json);
    if (!units.empty()) o.units = mlp_lm::planning::read_units(units), o.backend = o.backend;
    const topology t = mlp_lm::planning::read_topology(topo);
    if (col->parsed()) return cmd_collective(t, op, bytes, gpus_list, o.json);
    if (swp->parsed()) return cmd_sweep(o, t, tokens_per_gpu, gpus_list, out);
    mlp_lm::planning::check(o);
    if (mem->parsed()) return cmd_memory(o);
    if (pre->parsed()) return cmd_predict(o, t);
    return cmd_best(o, t, search);
  } catch (const std::exception& e) {
    const std::string w = e.what();
    std::fprintf(stderr, "%s%s\n", w.rfind("tessera:", 0) == 0 ? "" : "tessera: ", w.c_str());
    return 2;
  }
}
