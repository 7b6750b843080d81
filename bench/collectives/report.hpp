#pragma once
// tessera-collectives' report: runs the sweep of collectives.hpp and prints the
// nccl-tests style table and footer (the correctness count, the average bus
// bandwidth per operation and implementation), and writes the rows as JSON.
#include <cstdio>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "collectives.hpp"

namespace collectives {

//! Runs the sweep, prints the nccl-tests style table and footer, writes JSON.
//! Returns the process exit code (1 when some row is under --min-busbw or wrong).
template <class B, class T, class Comm>
int run(Comm& c, const options& o, const std::string& backend_name, const std::string& comm_name) {
  if (c.rank() == 0) {
    std::printf("# tessera-collectives: backend %s, communicator %s, %d ranks, type %s, %d warm-up and %d timed iterations\n",
                backend_name.c_str(), comm_name.c_str(), c.size(), o.dtype.c_str(), o.warmup, o.iters);
    std::printf("# %10s %12s %8s %6s %-14s %-8s %-7s | %10s %8s %8s %6s\n", "size", "count", "type", "redop", "op",
                "impl", "place", "time(us)", "algbw", "busbw", "#wrong");
    std::printf("# %10s %12s %8s %6s %-14s %-8s %-7s | %10s %8s %8s %6s\n", "(B)", "(elements)", "", "", "", "", "", "",
                "(GB/s)", "(GB/s)", "");
  }
  bench<B, T, Comm> b(c, o);
  const auto rows = b.run();
  long wrong = 0;
  bool under = false;
  nlohmann::json j{{"backend", backend_name}, {"comm", comm_name}, {"world", c.size()}, {"dtype", o.dtype},
                   {"iters", o.iters}, {"rows", nlohmann::json::array()}};
  std::map<std::string, std::pair<double, int>> avg;
  for (const auto& r : rows) {
    wrong += r.wrong;
    auto& a = avg[r.op + " " + r.impl + (r.placement.starts_with("alone") ? " " + r.placement : std::string())];
    a.first += r.busbw;
    a.second++;
    if (o.min_busbw > 0 && bus_factor(r.op, c.size()) > 0 && r.busbw < o.min_busbw) under = true;
    j["rows"].push_back({{"op", r.op}, {"impl", r.impl}, {"placement", r.placement}, {"type", r.type},
                         {"bytes", r.bytes}, {"count", r.count}, {"time_us", r.us}, {"algbw_gbs", r.algbw},
                         {"busbw_gbs", r.busbw}, {"wrong", r.wrong}});
  }
  if (c.rank() == 0) {
    std::printf("# Out of bounds values : %ld %s\n", wrong, wrong ? "FAILED" : "OK");
    for (const auto& [k, v] : avg) std::printf("# Avg bus bandwidth    : %8.3f GB/s  (%s)\n", v.first / v.second, k.c_str());
    if (!o.json.empty()) {
      std::FILE* f = std::fopen(o.json.c_str(), "w");
      TESSERA_CHECK(f != nullptr, "cannot write --json file '", o.json, "'");
      std::fputs(j.dump(2).c_str(), f);
      std::fclose(f);
    }
    if (under) std::printf("# tessera: bus bandwidth under --min-busbw %.3f GB/s\n", o.min_busbw);
  }
  return wrong ? 2 : under ? 1 : 0;
}

}  // namespace collectives
