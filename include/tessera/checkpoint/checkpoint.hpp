#pragma once
//! \file Sharded checkpoints: save and load a wrapper's main weights and its
//! ShardedOptimizer's state, on either backend, into and from any world size
//! and strategy.
//!
//! Layout under a root directory:
//!   ROOT/step-000001200/rank-00002-of-00004.safetensors   each rank's pieces
//!   ROOT/step-000001200/index.json                        written last
//! Rank r writes the part of every tensor that lies in its shard of the flat
//! unit layout (shard = 1/N of the padded unit, whatever the strategy), for
//! the main weights and each optimizer state, as 1-D safetensors entries
//! "unit.tensor/state". The index says which elements each entry holds.
//!
//! Atomic: everything is written into ROOT/.tmp-step-..., each file synced,
//! the index written (synced) last, then the directory renamed into place and
//! ROOT synced; a crash or a full disk at any point leaves earlier
//! checkpoints as they were and no step-* directory without an index.
//!
//! Verified: a load checks the index, each file's size and safetensors
//! header against the index, the checksum of every byte range it reads, and
//! the model's tensors, shapes and dtypes against the index; each rank reads
//! only the pieces overlapping its own optimizer range, all ranks agree that
//! every check passed, and only then is the model touched.
//!
//! Save and load are collective over the wrapper's communicator; the ranks
//! must see one shared file system.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/backend/ops.hpp"
#include "tessera/checkpoint/claim.hpp"
#include "tessera/checkpoint/directory.hpp"
#include "tessera/checkpoint/index.hpp"
#include "tessera/checkpoint/io.hpp"
#include "tessera/checkpoint/safetensors.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/comm/staged.hpp"
#include "tessera/core/checksum.hpp"
#include "tessera/optim/sharded_optimizer.hpp"

namespace tessera::checkpoint {

struct save_options {
  int keep = 0;  //!< keep the newest `keep` complete checkpoints under the root (0: all)
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

//! Saves the model's main weights and the optimizer's state as checkpoint
//! `step` under root (collective). Returns the checkpoint's directory.
template <class Opt>
fs::path save(Opt& opt, const fs::path& root, long step, const save_options& o = {}) {
  using Wrapper = typename Opt::wrapper_type;
  using Alg = typename Opt::algorithm_type;
  using M = typename Wrapper::main_type;
  using ops = backend_ops<typename Wrapper::backend_type>;
  auto e = opt.shards();
  const int r = e.rank(), N = e.world(), S = 1 + Alg::state_count;
  const auto& layouts = e.layouts();
  const fs::path final_dir = step_dir(root, step), tmp = root / (".tmp-" + final_dir.filename().string());
  TESSERA_CHECK(step >= 0, "checkpoint::save: step ", step, " is negative");
  TESSERA_CHECK(!opt.decided(), "checkpoint::save: a step was decided and not applied (call the optimizer's apply(), "
                "or step_graph::finish(), first): the weights would be the last step's and the counters this one's");

  // On a mesh the shard groups hold the same model state (outer<no_shard>)
  // or parts of the same shards (outer<optim>, gathered below): replica
  // group 0 writes, the others take part in the gathers and the agreements.
  const bool writer = e.replica_rank() == 0;
  std::exception_ptr err;
  std::optional<root_lock> lock;  // rank 0 holds the root for the whole save (unless it holds a claim)
  if (r == 0 && writer) {
    try {
      std::error_code ec;
      fs::create_directories(root, ec);
      if (ec) io_fail("cannot create", root.string(), ec.value());
      if (!claimed_here(root)) lock.emplace(root);  // a claim (claim.hpp) holds it for the job
      remove_leftovers(root);  // of saves killed earlier: no save is writing them now
      if (!fs::create_directory(tmp, ec) || ec) io_fail("cannot create", tmp.string(), ec ? ec.value() : EEXIST);
    } catch (...) {
      err = std::current_exception();
    }
  }
  e.agree_or_throw(err, "checkpoint::save (creating the directory)");

  // What every rank writes follows from the layouts alone.
  const std::vector<std::string> states = detail::state_names<Alg>();
  std::vector<std::vector<detail::planned_entry>> plans(static_cast<std::size_t>(N));
  std::size_t widest = 0;
  for (int q = 0; q < N; ++q) widest = std::max(widest, (plans[std::size_t(q)] = detail::plan_rank<M>(layouts, q, S)).size());
  const auto& mine = plans[std::size_t(r)];
  // Per entry its checksum, padded to the longest plan; then the file's checksum and bytes.
  std::vector<std::int64_t> sums(widest + 2, 0), all((widest + 2) * std::size_t(N));

  // This rank's file: header, then each piece of each state, checksummed as written.
  try {
    const std::string header = detail::rank_header(detail::rank_entries<M>(layouts, mine, states), r, N, step);
    std::optional<out_file> f;
    if (writer) f.emplace((tmp / rank_file(r, N)).string());
    checksum64 whole;
    if (writer) f->write(header.data(), header.size());
    whole.update(header.data(), header.size());
    typename ops::template staging<M> host;  // pinned on the CUDA backend
    std::size_t k = 0;
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      const auto& L = layouts[u];
      const auto [lo, n] = e.opt_range(u);
      for (int s = 0; s < S; ++s) {
        if (k >= mine.size() || mine[k].unit != u || mine[k].state != s) continue;
        std::span<M> src = s == 0 ? e.main_weights(u) : opt.state(u, s - 1);
        host.reserve(L.shard_numel());
        const std::span<M> shard(host.data(), L.shard_numel());
        if (L.splits() == 1) {  // this rank's shard inside its optimizer range (the range under no_shard)
          ops::copy_to_host(shard, std::span<const M>(src.subspan(L.shard_begin(r) - lo, L.shard_numel())));
        } else {  // outer<optim>: the replicas' parts of the shard
          std::vector<M> part(n);
          ops::copy_to_host(std::span<M>(part), std::span<const M>(src));
          comm::label lbl("checkpoint_gather", L.name().c_str());
          comm::all_gather_host(e.outer_communicator(), std::span<const M>(part), shard);
        }
        for (; k < mine.size() && mine[k].unit == u && mine[k].state == s; ++k) {
          const auto& pe = mine[k];
          const void* p = host.data() + pe.p.shard_begin;
          const std::size_t bytes = pe.p.count * sizeof(M);
          if (writer) f->write(p, bytes);
          const std::uint64_t d = checksum64::of(p, bytes);
          whole.update(&d, sizeof d);  // each byte is hashed once (see index.hpp)
          sums[k] = std::int64_t(d);
        }
      }
    }
    if (o.at_point && writer) o.at_point("before-sync");
    if (writer) f->sync_and_close();
    sums[widest] = std::int64_t(whole.digest());
    sums[widest + 1] = writer ? std::int64_t(f->written()) : 0;
  } catch (...) {
    err = std::current_exception();
  }
  // The temporary directory goes only once every rank stopped writing: removed
  // earlier, another rank's next write fails with "No such file or directory"
  // and that, not the first cause (a full disk, say), can be the first line printed.
  try {
    e.agree_or_throw(err, "checkpoint::save (writing rank files)");
  } catch (...) {
    if (r == 0 && writer) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    throw;
  }
  if (o.at_point && writer) o.at_point("after-files");

  // Every rank's checksums to every rank.
  comm::all_gather_host(e.communicator(), std::span<const std::int64_t>(sums), std::span<std::int64_t>(all));

  if (r == 0 && writer) {
    try {
      index_info x;
      x.step = step;
      x.world = N;
      x.strategy = std::string(Wrapper::strategy::name);
      x.wrapper = std::string(Wrapper::config::wrapper::name);
      x.optimizer = std::string(Alg::name);
      x.optimizer_steps = opt.steps();
      x.optimizer_skipped = opt.skipped_steps();
      x.states = states;
      x.extra = o.extra;
      if (const std::vector<int> sc = e.exact_scales(); !sc.empty())
        for (std::size_t u = 0; u < layouts.size(); ++u) x.exact_scales[layouts[u].name()] = sc[u];
      for (int q = 0; q < N; ++q) {
        const std::int64_t* rs = all.data() + (widest + 2) * std::size_t(q);
        x.files.push_back({rank_file(q, N), std::uint64_t(rs[widest + 1]), std::uint64_t(rs[widest])});
      }
      for (std::size_t u = 0; u < layouts.size(); ++u)
        for (std::size_t t = 0; t < layouts[u].tensors().size(); ++t) {
          auto& ti = x.tensors[detail::key_of(layouts[u], t)];
          ti.shape = layouts[u].tensors()[t].spec.shape.extents();
          ti.dtype = std::string(dtype_name<M>());
        }
      for (int q = 0; q < N; ++q) {
        const auto& plan = plans[std::size_t(q)];
        const std::int64_t* rs = all.data() + (widest + 2) * std::size_t(q);
        // The data section starts after the header, rebuilt as rank q built it.
        const auto entries = detail::rank_entries<M>(layouts, plan, states);
        const std::uint64_t data_start = detail::rank_header(entries, q, N, step).size();
        for (std::size_t i = 0; i < plan.size(); ++i) {
          const auto& pe = plan[i];
          auto& ti = x.tensors[detail::key_of(layouts[pe.unit], pe.tensor)];
          if (pe.state == 0) ti.pieces.push_back({q, pe.p.tensor_begin, pe.p.count, {}, {}});
          auto it = std::find_if(ti.pieces.begin(), ti.pieces.end(),
                                 [&](const piece_info& pi) { return pi.file == q && pi.begin == pe.p.tensor_begin; });
          it->ranges.push_back({data_start + pe.begin, pe.end - pe.begin, std::uint64_t(rs[i])});
          it->keys.push_back(entries[i].name);
        }
      }
      if (o.at_point) o.at_point("before-index");
      write_file_atomic(tmp / index_name, index_text(x));
      sync_dir(tmp);
      if (o.at_point) o.at_point("before-rename");
      std::error_code ec;
      const fs::path old = root / (".old-" + final_dir.filename().string());
      if (fs::exists(final_dir, ec)) {  // saving the same step again: replace it
        fs::remove_all(old, ec);
        fs::rename(final_dir, old, ec);
        if (ec) io_fail("cannot move aside", final_dir.string(), ec.value());
      }
      fs::rename(tmp, final_dir, ec);
      if (ec) io_fail("cannot rename into place", final_dir.string(), ec.value());
      sync_dir(root);
      fs::remove_all(old, ec);
      if (o.keep > 0) {  // older ones go only now that a newer one is complete
        auto done = complete_checkpoints(root);
        // Out of the step-* namespace first (one rename), then deleted: a kill
        // in between leaves a hidden directory, never a step-* that looks
        // complete with rank files missing.
        for (std::size_t i = 0; i + std::size_t(o.keep) < done.size(); ++i) {
          const fs::path gone = root / (".retired-" + done[i].second.filename().string());
          fs::remove_all(gone, ec);
          fs::rename(done[i].second, gone, ec);
          if (!ec) sync_dir(root), fs::remove_all(gone, ec);
        }
      }
    } catch (...) {
      err = std::current_exception();
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
  }
  e.agree_or_throw(err, "checkpoint::save (index)");
  return final_dir;
}

//! Loads the checkpoint `dir` names (itself, or the newest complete one under
//! it) into the model and optimizer, whatever strategy and world size wrote
//! it (collective). Either every rank's model and optimizer are replaced, or,
//! after an error on any rank, none is touched.
template <class Opt>
load_result load(Opt& opt, const fs::path& dir) {
  using Wrapper = typename Opt::wrapper_type;
  using Alg = typename Opt::algorithm_type;
  using M = typename Wrapper::main_type;
  using ops = backend_ops<typename Wrapper::backend_type>;
  auto e = opt.shards();
  const int S = 1 + Alg::state_count;
  const auto& layouts = e.layouts();
  TESSERA_CHECK(!opt.decided(), "checkpoint::load: a step was decided and not applied (call the optimizer's apply() first)");

  load_result res;
  std::exception_ptr err;
  // Staged values: per unit, per state, this rank's optimizer range.
  std::vector<std::vector<std::vector<M>>> staged(layouts.size());
  index_info x;
  try {
    const auto found = resolve(dir);
    if (!found) tessera::detail::fail("checkpoint: no complete checkpoint at or under '" + dir.string() + "'");
    res.path = *found;
    const std::string where = "checkpoint '" + res.path.string() + "'";
    x = read_index(res.path, where);
    // The model against the index, both ways.
    if (x.states != detail::state_names<Alg>())
      tessera::detail::fail(where + " holds optimizer '" + x.optimizer + "' state; this optimizer is '" +
                            std::string(Alg::name) + "'");
    std::size_t model_tensors = 0;
    for (const auto& L : layouts)
      for (std::size_t t = 0; t < L.tensors().size(); ++t, ++model_tensors) {
        const std::string key = detail::key_of(L, t);
        const auto it = x.tensors.find(key);
        if (it == x.tensors.end()) tessera::detail::fail(where + " has no tensor '" + key + "', which the model has");
        if (it->second.shape != L.tensors()[t].spec.shape.extents())
          tessera::detail::fail(where + ": tensor '" + key + "' has shape " + nlohmann::json(it->second.shape).dump() +
                                " there and " + L.tensors()[t].spec.shape.str() + " in the model");
        if (it->second.dtype != dtype_name<M>())
          tessera::detail::fail(where + ": tensor '" + key + "' is " + it->second.dtype + " there; the model's main weights are " +
                                std::string(dtype_name<M>()));
      }
    if (x.tensors.size() != model_tensors)
      for (const auto& [key, ti] : x.tensors) {
        bool known = false;
        for (const auto& L : layouts)
          for (std::size_t t = 0; t < L.tensors().size(); ++t) known = known || detail::key_of(L, t) == key;
        if (!known) tessera::detail::fail(where + " has tensor '" + key + "', which the model lacks");
      }
    // Read what overlaps this rank's optimizer ranges, checking as we go.
    std::map<int, rank_reader> files;
    auto file = [&](int q) -> const rank_reader& {
      auto it = files.find(q);
      if (it == files.end()) it = files.emplace(q, open_rank_reader(x, res.path, q, where)).first;
      return it->second;
    };
    std::vector<unsigned char> buf;
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      const auto& L = layouts[u];
      staged[u].assign(std::size_t(S), std::vector<M>(e.opt_range(u).second, M{}));
      for (std::size_t t = 0; t < L.tensors().size(); ++t) {
        const piece want = e.range_piece(u, t);
        if (want.empty()) continue;
        const std::uint64_t ta = want.tensor_begin, tb = want.tensor_begin + want.count;  // tensor elements wanted
        const std::string key = detail::key_of(L, t);
        for (const auto& pi : x.tensors.at(key).pieces) {
          const std::uint64_t pa = std::max<std::uint64_t>(pi.begin, ta), pb = std::min<std::uint64_t>(pi.begin + pi.count, tb);
          if (pa >= pb) continue;
          const rank_reader& f = file(pi.file);
          for (int s = 0; s < S; ++s) {
            buf.resize(std::size_t(pi.ranges[std::size_t(s)].bytes));
            read_piece(f, x.tensors.at(key), pi, std::size_t(s), buf.data(), where);
            std::memcpy(staged[u][std::size_t(s)].data() + (want.shard_begin + (pa - ta)),
                        buf.data() + (pa - pi.begin) * sizeof(M), std::size_t(pb - pa) * sizeof(M));
          }
        }
      }
    }
  } catch (...) {
    err = std::current_exception();
  }
  e.agree_or_throw(err, "checkpoint::load");
  // Every rank has everything it needs: now, and only now, the model changes.
  typename ops::template staging<M> bounce;  // pinned on the CUDA backend
  auto put = [&](std::span<M> dst, const std::vector<M>& src) {
    if constexpr (std::is_same_v<typename Wrapper::backend_type, backend::host>) {
      ops::copy_from_host(dst, std::span<const M>(src));
    } else {
      bounce.reserve(src.size());
      std::memcpy(bounce.data(), src.data(), src.size() * sizeof(M));
      ops::copy_from_host(dst, std::span<const M>(bounce.data(), src.size()));
    }
  };
  for (std::size_t u = 0; u < layouts.size(); ++u) {
    put(e.main_weights(u), staged[u][0]);
    for (int s = 1; s < S; ++s) put(opt.state(u, s - 1), staged[u][std::size_t(s)]);
  }
  opt.restore_counters(x.optimizer_steps, x.optimizer_skipped);
  // exact_reduction continues on the grid it would have used (units the
  // checkpoint has no scale for keep theirs).
  if (std::vector<int> sc = e.exact_scales(); !sc.empty() && !x.exact_scales.empty()) {
    for (std::size_t u = 0; u < layouts.size(); ++u)
      if (auto it = x.exact_scales.find(layouts[u].name()); it != x.exact_scales.end()) sc[u] = it->second;
    e.set_exact_scales(sc);
  }
  e.zero_grad();
  e.publish_weights(/*converted=*/false);
  res.step = x.step;
  res.world = x.world;
  res.strategy = x.strategy;
  res.extra = x.extra;
  return res;
}

}  // namespace tessera::checkpoint
