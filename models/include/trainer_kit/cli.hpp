#pragma once
// The trainers' command-line conventions: a parse error or a bad value is one
// line starting with "tessera:" and exit code 2; every option can be written
// as "name=value" lines for the agreement across ranks (run.hpp).
#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

namespace trainer_kit {

//! Parses argv. Returns -1 to continue, else the exit code (0 after --help,
//! 3 after --help under a launcher of several ranks, 2 after an error,
//! printed as one "tessera:" line).
inline int parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    const int rc = app.exit(e);
    // Under a launcher of several ranks a rank that prints its help and exits
    // 0 before MPI starts leaves ranks without --help waiting for it (until
    // the start-up deadline); a non-zero exit makes the launcher end them now.
    for (const char* k : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
      if (const char* n = std::getenv(k); n != nullptr && std::atoi(n) > 1) {
        std::fprintf(stderr, "tessera: --help under a launcher of %s ranks: exiting 3 so that it ends every rank\n", n);
        return 3;
      }
    return rc;
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    for (auto& ch : msg)
      if (ch == '\n') ch = ' ';
    std::fprintf(stderr, "tessera: %s (see --help)\n", msg.c_str());
    return 2;
  }
  return -1;
}

//! --wrapper, --strategy and --precision, as every trainer names them.
inline void add_parallel_options(CLI::App& app, std::string& wrapper, std::string& strategy, std::string& precision) {
  app.add_option("--wrapper", wrapper, "ddp, fsdp (flat shards) or fsdp2 (per-parameter row shards; optim_grads_params)")
      ->check(CLI::IsMember({"ddp", "fsdp", "fsdp2"}));
  app.add_option("--strategy", strategy, "no_shard, optim, optim_grads or optim_grads_params")
      ->check(CLI::IsMember({"no_shard", "optim", "optim_grads", "optim_grads_params"}));
  app.add_option("--precision", precision,
                 "fp32, bf16 (bf16 compute weights, fp32 main weights and grads), or fp8 (bf16's, with the linear "
                 "layers' products in fp8: E4M3 activations and weights, E5M2 gradients, per-tensor scales; "
                 "tessera-gpt and tessera-llama, host backend: docs/fp8.md)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp8"}));
}

//! --shard-group and --outer (a mesh; trainer_kit/mesh.hpp runs it).
inline void add_mesh_options(CLI::App& app, std::string& shard_group, std::string& outer) {
  app.add_option("--shard-group", shard_group,
                 "hybrid sharding: ranks per shard group of a mesh (the world = R replica groups x S), or 'node' for "
                 "one node's ranks; the strategy runs inside a group (default: the whole world, flat)");
  app.add_option("--outer", outer,
                 "across the replica groups of --shard-group: no_shard (HSDP: gradients all-reduced) or optim "
                 "(HFSDP: the optimizer split again; --wrapper fsdp --strategy optim_grads_params)")
      ->check(CLI::IsMember({"no_shard", "optim"}));
}

//! What is wrong with the mesh flags ("" when nothing): S a positive count or
//! "node", --outer optim only on a mesh and for the one compiled HFSDP config.
inline std::string mesh_options_error(const std::string& shard_group, const std::string& outer,
                                      const std::string& wrapper, const std::string& strategy) {
  if (!shard_group.empty() && shard_group != "node") {
    int S = 0;
    const auto [end, ec] = std::from_chars(shard_group.data(), shard_group.data() + shard_group.size(), S);
    if (ec != std::errc{} || end != shard_group.data() + shard_group.size() || S < 1)
      return "--shard-group " + shard_group + " is not a positive number of ranks or 'node'";
  }
  if (outer == "optim" && shard_group.empty()) return "--outer optim needs a mesh (--shard-group S)";
  if (outer == "optim" && !(wrapper == "fsdp" && strategy == "optim_grads_params"))
    return "--outer optim (HFSDP) is compiled for --wrapper fsdp --strategy optim_grads_params only";
  return {};
}

//! A bad option value: its one line, and the exit code 2.
inline int bad_option(const std::string& m) {
  std::fprintf(stderr, "tessera: %s\n", m.c_str());
  return 2;
}

//! "name=value\n" lines of options; doubles in the shortest text that reads back the same.
struct option_lines {
  std::string text;
  template <class V>
  option_lines& operator()(const char* name, const V& v) {
    text += name;
    text += '=';
    if constexpr (std::is_convertible_v<const V&, std::string>) {
      text += v;
    } else if constexpr (std::is_floating_point_v<V>) {
      char b[32];
      text.append(b, std::to_chars(b, b + sizeof b, v).ptr);
    } else {
      text += std::to_string(v);
    }
    text += '\n';
    return *this;
  }
};

}  // namespace trainer_kit
