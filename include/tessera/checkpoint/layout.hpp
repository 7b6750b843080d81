#pragma once
//! \file What a checkpoint's files hold, derived from the unit layouts alone:
//! each rank's entries in file order, their names and the rank file's header
//! (save writes them; rank 0 rebuilds every rank's to write the index), and
//! the options and results of save and load.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/checkpoint/directory.hpp"
#include "tessera/checkpoint/index.hpp"
#include "tessera/checkpoint/safetensors.hpp"
#include "tessera/shard/layout.hpp"

namespace tessera::checkpoint {

struct save_options {
  int keep = 0;  //!< keep the newest `keep` complete checkpoints of this lineage under the root (0: all)
  //! The run this save belongs to, recorded in the index: `keep` retires only
  //! checkpoints of the same lineage, never another run's that shares the
  //! root. "" (the default) records none and lets `keep` retire any.
  std::string lineage;
  nlohmann::json extra = nlohmann::json::object();  //!< the trainer's own state, returned by load
  //! Called on every rank as the save reaches each of its points:
  //! "before-sync" (rank file written, not yet synced), "after-files" (every
  //! rank file complete), and on rank 0 "before-index" and "before-rename".
  //! For tests that end the process there, as a crash would, to prove a save
  //! is atomic; the library itself neither prints nor exits.
  std::function<void(std::string_view point)> at_point;
};

//! What load() found.
struct load_result {
  fs::path path;
  long step = 0;
  int world = 0;
  std::string strategy;
  nlohmann::json extra;
  std::string lineage;  //!< the index's (save_options::lineage; "" where none)
  std::uint64_t bytes_read = 0;  //!< of the rank files, by this rank
  double read_seconds = 0;       //!< index, reads and checks, until every rank agreed
  double apply_seconds = 0;      //!< the values copied into the model and optimizer
};

namespace detail {

// One entry of a rank file: a tensor's piece for one state.
struct planned_entry {
  std::size_t unit = 0, tensor = 0;
  int state = 0;
  piece p;
  std::uint64_t begin = 0, end = 0;  // bytes, relative to the data section
};

// What rank r writes, in file order: unit by unit, state by state, tensor by tensor.
template <class M>
std::vector<planned_entry> plan_rank(const std::vector<unit_layout>& layouts, int r, int states) {
  std::vector<planned_entry> out;
  std::uint64_t at = 0;
  for (std::size_t u = 0; u < layouts.size(); ++u)
    for (int s = 0; s < states; ++s)
      for (std::size_t t = 0; t < layouts[u].tensors().size(); ++t) {
        const piece p = layouts[u].piece_of(t, r);
        if (p.empty()) continue;
        const std::uint64_t bytes = p.count * sizeof(M);
        out.push_back({u, t, s, p, at, at + bytes});
        at += bytes;
      }
  return out;
}

inline std::string key_of(const unit_layout& L, std::size_t t) { return L.name() + "." + L.tensors()[t].spec.name; }

// Rank q's safetensors entries ("unit.tensor/state") and header: the rank
// writes it, and rank 0 rebuilds it to learn where q's data section starts.
template <class M>
std::vector<st_entry> rank_entries(const std::vector<unit_layout>& layouts, const std::vector<planned_entry>& plan,
                                   const std::vector<std::string>& states) {
  std::vector<st_entry> entries;
  for (const auto& pe : plan)
    entries.push_back({key_of(layouts[pe.unit], pe.tensor) + "/" + states[std::size_t(pe.state)],
                       std::string(dtype_name<M>()), {std::int64_t(pe.p.count)}, pe.begin, pe.end});
  return entries;
}
// "main" and then the optimizer's state names: the states a checkpoint holds.
template <class Alg>
std::vector<std::string> state_names() {
  std::vector<std::string> s{"main"};
  for (int k = 0; k < Alg::state_count; ++k) s.emplace_back(Alg::state_names[k]);
  return s;
}
inline std::string rank_header(const std::vector<st_entry>& entries, int q, int world, long step) {
  return make_safetensors_header(entries, {{"format", "tessera"}, {"rank", std::to_string(q)},
                                           {"world", std::to_string(world)}, {"step", std::to_string(step)}});
}

}  // namespace detail

}  // namespace tessera::checkpoint
