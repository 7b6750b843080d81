#pragma once
// Topology files (tessera-plan --topology FILE; written by `calibrate`): a
// machine's GPUs per node, its link inside a node per collective, the NIC
// per GPU and the step's compute rates, with where each figure came from.
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/plan/cost.hpp"

namespace mlp_lm::planning {

inline nlohmann::json to_json(const tessera::plan::topology& t) {
  nlohmann::json in = nlohmann::json::object();
  for (const auto c : tessera::plan::all_collectives) {
    const auto& f = t.inside(c);
    in[std::string(tessera::plan::name_of(c))] = {{"base_us", f.base_us}, {"hop_us", f.hop_us}, {"busbw_gbs", f.busbw_gbs}};
  }
  return {{"name", t.name},           {"source", t.source},           {"gpus_per_node", t.gpus_per_node},
          {"intra_node", in},         {"nic_gbs", t.nic_gbs},          {"net_hop_us", t.net_hop_us},
          {"tflops", t.tflops},       {"copy_gbs", t.copy_gbs},        {"interference", t.interference}, {"unit_overhead_us", t.unit_overhead_us}};
}

//! The topology in `path` over the published defaults (a file may give only some fields).
inline tessera::plan::topology read_topology(const std::string& path, nlohmann::json* whole = nullptr) {
  tessera::plan::topology t;
  if (path.empty()) return t;
  std::ifstream f(path);
  if (!f) throw tessera::error("cannot read --topology file '" + path + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
    t.name = j.value("name", path);
    t.source = j.value("source", t.source);
    t.gpus_per_node = j.value("gpus_per_node", t.gpus_per_node);
    t.nic_gbs = j.value("nic_gbs", t.nic_gbs);
    t.net_hop_us = j.value("net_hop_us", t.net_hop_us);
    t.tflops = j.value("tflops", t.tflops);
    t.copy_gbs = j.value("copy_gbs", t.copy_gbs);
    t.interference = j.value("interference", t.interference);
    t.unit_overhead_us = j.value("unit_overhead_us", t.unit_overhead_us);
    if (j.contains("intra_node"))
      for (auto& [k, v] : j["intra_node"].items()) {
        auto& l = t.inside(tessera::plan::collective_named(k));
        l.base_us = v.value("base_us", l.base_us);
        l.hop_us = v.value("hop_us", l.hop_us);
        l.busbw_gbs = v.value("busbw_gbs", l.busbw_gbs);
      }
  } catch (const tessera::error&) {
    throw;
  } catch (const std::exception& e) {
    throw tessera::error("--topology '" + path + "': " + e.what());
  }
  if (t.gpus_per_node < 1 || t.nic_gbs <= 0 || t.tflops <= 0 || t.copy_gbs <= 0 || t.interference < 0 || t.interference >= 1 ||
      t.unit_overhead_us < 0)
    throw tessera::error("--topology '" + path + "': gpus_per_node, nic_gbs, tflops and copy_gbs must be "
                         "positive, interference in [0, 1) and unit_overhead_us not negative");
  for (const auto c : tessera::plan::all_collectives)
    if (t.inside(c).busbw_gbs <= 0) throw tessera::error("--topology '" + path + "': a busbw_gbs is not positive");
  if (whole) *whole = j;
  return t;
}

}  // namespace mlp_lm::planning
