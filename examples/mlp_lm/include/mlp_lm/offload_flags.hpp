#pragma once
// The optimizer-offload flags the reference programs share (tessera-mlp-lm,
// tessera-bench-train, tessera-plan), so the three parse and mean them alike.
#include <CLI/CLI.hpp>

#include <string>

#include "tessera/optim/sharded_optimizer.hpp"

namespace mlp_lm {

//! --offload-optimizer [F] (wrapper_options::offload_optimizer; no value: 1)
//! and --offload-update host|device (optimizer_options::offload_update).
inline void add_offload_options(CLI::App& app, double& fraction, std::string& where) {
  app.add_option("--offload-optimizer", fraction,
                 "this fraction of the optimizer (main weights and AdamW state; the last units first) lives in host "
                 "memory; without a value: all of it")
      ->expected(0, 1)
      ->default_str("1")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--offload-update", where,
                 "where offloaded units update: host (the CPU's cores; PCIe carries gradients and bf16 weights) or "
                 "device (default: the GPU reading the host-resident state across PCIe; 2.8x faster on an H200 at 1B)")
      ->check(CLI::IsMember({"host", "device"}));
}

//! The --offload-update value as the optimizer's option.
inline tessera::update_site update_site_of(const std::string& where) {
  return where == "host" ? tessera::update_site::host : tessera::update_site::device;
}

}  // namespace mlp_lm
