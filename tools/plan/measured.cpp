// tessera-plan's commands on measurements: calibrate (a topology fitted to
// tessera-collectives and tessera-bench-train results) and validate (every
// measured step against its prediction).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"

namespace plan_cli {
namespace {

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

// tessera-bench-train's JSON (bench/torch_mlp_lm.py writes the same top-level keys; its rows name no strategy).
bool is_bench_train(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("results") || !j.contains("world") || !j.contains("layers") || !j.contains("tokens"))
    return false;
  const auto& r = j["results"];
  return r.is_array() && std::all_of(r.begin(), r.end(), [](const nlohmann::json& x) { return x.contains("strategy"); });
}

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace plan_cli
