#pragma once
//! \file The time of one collective on a machine described by a topology:
//! NCCL's latency-bandwidth structure (nccl-tests' conventions), fitted to
//! measurements of this machine where there are some (plan::fit, the
//! `tessera-plan calibrate` command) and published figures otherwise.
//!
//!   time(op, bytes, n ranks) = latency + bytes x factor(op, n) / busbw
//!   factor: (n - 1) / n for all-gather and reduce-scatter, 2 (n - 1) / n for
//!   all-reduce, 1 for broadcast; `bytes` is nccl-tests' size (the gathered
//!   output, the scattered input, the reduced buffer)
//!   latency (ring): base + (hops inside a node) x hop_in + (hops between nodes) x hop_out
//!   latency (tree, all-reduce across nodes): base + 2 log2(nodes) hop_out + 2 (local - 1) hop_in
//!   latency (PAT, all-gather / reduce-scatter with one rank per node): base + log2(nodes) hop_out
//!   busbw: the link's inside one node; across nodes min(that, local x NIC),
//!          as NCCL runs one ring per NIC and each crosses nodes once per step
//!
//! A group is `n` ranks at a `stride` in a world laid out node by node
//! (ranks 0..g-1 on node 0, ...): a shard group has stride 1, its replica
//! group the shard group's size.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/core/error.hpp"

namespace tessera::plan {

enum class collective { all_gather, reduce_scatter, all_reduce, broadcast };
inline constexpr std::array<collective, 4> all_collectives{collective::all_gather, collective::reduce_scatter,
                                                           collective::all_reduce, collective::broadcast};

[[nodiscard]] constexpr std::string_view name_of(collective c) noexcept {
  switch (c) {
    case collective::all_gather: return "all_gather";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::all_reduce: return "all_reduce";
    case collective::broadcast: return "broadcast";
  }
  return "?";
}
[[nodiscard]] inline collective collective_named(std::string_view s) {
  for (auto c : all_collectives)
    if (name_of(c) == s) return c;
  throw error("no collective named '" + std::string(s) + "'");
}

//! nccl-tests' bus-bandwidth factor: bytes x factor is what each rank moves.
[[nodiscard]] constexpr double bus_factor(collective c, int n) noexcept {
  if (n <= 1) return 0.0;
  const double f = double(n - 1) / double(n);
  return c == collective::all_reduce ? 2.0 * f : c == collective::broadcast ? 1.0 : f;
}

//! One collective's latency and bandwidth inside a node, per operation.
struct link_fit {
  double base_us = 10.0;      //!< latency of a 2-rank collective, less one hop
  double hop_us = 0.6;        //!< added per ring hop
  double busbw_gbs = 370.0;   //!< bus bandwidth of large messages (GB/s, 1e9 B/s)
  [[nodiscard]] double latency_us(int hops) const noexcept { return base_us + hop_us * std::max(hops, 0); }
};

//! A machine: GPUs per node, the link inside a node (per operation), the NIC
//! per GPU between nodes, and the compute rates a step runs at. Defaults are
//! an 8 x H100/H200 NVLink node with one 400 Gb/s NDR NIC per GPU, from
//! published figures (`source` names them).
struct topology {
  std::string name = "8xH200 NVLink + 8x400G NDR (published figures)";
  std::string source =
      "busbw 370 GB/s: nccl-tests ring all-gather / reduce-scatter on 8xH100 NVLink (NVIDIA); latency: NCCL's "
      "tuning model (src/graph/tuning.cc: ring Simple base ~8 us, per hop 3.4 us NVLink, 14 us network); NIC "
      "400 Gb/s = 50 GB/s line rate, 45 GB/s achieved (NCCL issue #1229: 360 GB/s busbw on 4 nodes of 8)";
  int gpus_per_node = 8;
  //! Inside one node, per collective (all_gather, reduce_scatter, all_reduce, broadcast).
  std::array<link_fit, 4> intra{link_fit{8.4, 3.4, 370}, link_fit{8.4, 3.4, 370}, link_fit{8.4, 3.4, 370},
                                link_fit{8.4, 3.4, 370}};
  double nic_gbs = 45.0;     //!< achieved bandwidth of one GPU's NIC, each direction
  double net_hop_us = 14.0;  //!< per hop between nodes
  // Compute (tessera-plan calibrate sets them from the step benchmark).
  double tflops = 660.0;     //!< the step's dense bf16 rate (GEMMs with their epilogues), TFLOP/s
  double copy_gbs = 4200.0;  //!< device memory, read + write, GB/s (elementwise passes, the optimizer)
  //! Fixed time per unit and micro-batch beside its FLOPs and bytes (kernel
  //! launches and small kernels: what dominates a small model's step).
  double unit_overhead_us = 0.0;
  //! The share of compute throughput lost while a collective runs on SMs
  //! (NCCL's kernels take SMs and memory bandwidth from the GEMMs; the
  //! calibration also puts here what else slows a step that communicates);
  //! collectives on copy engines take none. Below 1.
  double interference = 0.15;

  [[nodiscard]] const link_fit& inside(collective c) const noexcept { return intra[std::size_t(c)]; }
  [[nodiscard]] link_fit& inside(collective c) noexcept { return intra[std::size_t(c)]; }
};

//! Where a group of n ranks at a stride sits: ranks per node and nodes.
struct placement {
  int local = 1, nodes = 1;
};
[[nodiscard]] inline placement place(const topology& t, int n, int stride = 1) {
  TESSERA_CHECK(n >= 1 && stride >= 1, "plan: a group of ", n, " ranks at stride ", stride);
  const int g = std::max(t.gpus_per_node, 1);
  const int local = std::clamp(g / std::min(stride, g), 1, n);  // the group's ranks sharing one node
  return {local, (n + local - 1) / local};
}

//! Microseconds for one collective of `bytes` (nccl-tests' size) over n ranks at `stride`.
[[nodiscard]] inline double collective_us(const topology& t, collective c, double bytes, int n, int stride = 1) {
  if (n <= 1 || bytes <= 0) return 0.0;
  const link_fit& in = t.inside(c);
  const placement p = place(t, n, stride);
  const double moved = bytes * bus_factor(c, n);
  if (p.nodes == 1) return in.latency_us(n - 2) + moved / (in.busbw_gbs * 1e3);
  const double bw = std::min(in.busbw_gbs, double(p.local) * t.nic_gbs) * 1e3;  // bytes per us
  // Ring: n - 1 hops, `nodes` of them between nodes.
  const double ring = in.base_us + in.hop_us * double(n - p.nodes) + t.net_hop_us * double(p.nodes) + moved / bw;
  // PAT (NCCL 2.23+): all-gather and reduce-scatter with one rank per node
  // take log2(nodes) steps instead of nodes - 1.
  if ((c == collective::all_gather || c == collective::reduce_scatter) && p.local == 1)
    return std::min(ring, in.base_us + std::ceil(std::log2(double(p.nodes))) * t.net_hop_us + moved / bw);
  if (c != collective::all_reduce) return ring;
  // Tree (NCCL's default for all-reduce across nodes): up and down a binary tree of nodes.
  const double tree = in.base_us + 2.0 * std::log2(double(p.nodes)) * t.net_hop_us +
                      2.0 * double(p.local - 1) * in.hop_us + moved / bw;
  return std::min(ring, tree);
}

//! Bus bandwidth the model gives (GB/s), as nccl-tests reports it.
[[nodiscard]] inline double busbw_gbs(const topology& t, collective c, double bytes, int n, int stride = 1) {
  const double us = collective_us(t, c, bytes, n, stride);
  return us > 0 ? bytes * bus_factor(c, n) / (us * 1e3) : 0.0;
}

//! A measured collective (tessera-collectives --json, a "raw" row).
struct sample {
  collective op;
  int ranks;
  double bytes, us;
};

//! Fits latency and bandwidth per collective inside one node to measured
//! rows: for each world size, time = a + bytes x factor / busbw by least
//! squares on relative error (so small and large messages both count);
//! then base + hop x (n - 2) through the latencies of the world sizes
//! measured (one world size: hop keeps its prior value). Rows below
//! `min_bytes` are left out (the first, warming call is often slow).
//! Operations without samples keep their values in `t`.
inline void fit(topology& t, const std::vector<sample>& rows, double min_bytes = 4096) {
  for (const collective c : all_collectives) {
    std::vector<int> worlds;
    for (const auto& r : rows)
      if (r.op == c && r.ranks >= 2 && std::find(worlds.begin(), worlds.end(), r.ranks) == worlds.end())
        worlds.push_back(r.ranks);
    if (worlds.empty()) continue;
    std::sort(worlds.begin(), worlds.end());
    std::vector<std::pair<int, double>> latency;  // (n, a)
    double bw = 0;
    for (const int n : worlds) {
      // Weighted least squares of t ~ a + b x with weights 1 / t^2.
      double s00 = 0, s01 = 0, s11 = 0, r0 = 0, r1 = 0;
      int k = 0;
      for (const auto& r : rows) {
        if (r.op != c || r.ranks != n || r.bytes < min_bytes || r.us <= 0) continue;
        const double w = 1.0 / (r.us * r.us), x = r.bytes * bus_factor(c, n);
        s00 += w, s01 += w * x, s11 += w * x * x, r0 += w * r.us, r1 += w * x * r.us;
        ++k;
      }
      if (k < 2) continue;
      const double det = s00 * s11 - s01 * s01;
      TESSERA_CHECK(det > 0, "plan::fit: the ", name_of(c), " rows at ", n, " ranks do not span sizes");
      const double a = (r0 * s11 - r1 * s01) / det, b = (s00 * r1 - s01 * r0) / det;
      TESSERA_CHECK(b > 0, "plan::fit: ", name_of(c), " at ", n, " ranks: time does not grow with size");
      latency.emplace_back(n, std::max(a, 0.0));
      bw = 1.0 / (b * 1e3);  // the largest world measured sets the bandwidth
    }
    if (latency.empty()) continue;
    link_fit& f = t.inside(c);
    f.busbw_gbs = bw;
    if (latency.size() == 1) {
      f.base_us = std::max(latency[0].second - f.hop_us * (latency[0].first - 2), 0.0);
    } else {  // a line through (n - 2, a)
      double sx = 0, sy = 0, sxx = 0, sxy = 0;
      for (auto [n, a] : latency) sx += n - 2, sy += a, sxx += double(n - 2) * (n - 2), sxy += double(n - 2) * a;
      const double m = double(latency.size()), slope = (m * sxy - sx * sy) / (m * sxx - sx * sx);
      f.hop_us = std::max(slope, 0.0);
      f.base_us = std::max((sy - f.hop_us * sx) / m, 0.0);
    }
  }
}

}  // namespace tessera::plan
