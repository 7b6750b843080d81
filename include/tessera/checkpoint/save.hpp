#pragma once
//! \file checkpoint::save (see checkpoint.hpp for the layout and guarantees).
#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/backend/ops.hpp"
#include "tessera/checkpoint/claim.hpp"
#include "tessera/checkpoint/directory.hpp"
#include "tessera/checkpoint/io.hpp"
#include "tessera/checkpoint/layout.hpp"
#include "tessera/checkpoint/pipeline.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/comm/staged.hpp"
#include "tessera/comm/trace.hpp"
#include "tessera/core/checksum.hpp"

namespace tessera::checkpoint {

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

  // This rank's file: header, then each piece of each state. One unit's
  // state is copied from the device and hashed while the writer thread puts
  // the one before into the file (two staging buffers take turns), so the
  // disk, not the copies or the checksums, sets the pace.
  try {
    const std::string header = detail::rank_header(detail::rank_entries<M>(layouts, mine, states), r, N, step);
    std::optional<out_file> f;
    if (writer) f.emplace((tmp / rank_file(r, N)).string());
    typename ops::template staging<M> host[2];  // pinned on the CUDA backend
    std::uint64_t last_write[2] = {0, 0};       // the writer's ticket for each buffer's last piece
    std::optional<background_writer> out;       // after the buffers: stops before they go
    if (writer) out.emplace(*f);
    checksum64 whole;
    if (writer) out->write(header.data(), header.size());
    whole.update(header.data(), header.size());
    std::size_t k = 0;
    int b = 0;
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      const auto& L = layouts[u];
      const auto [lo, n] = e.opt_range(u);
      for (int s = 0; s < S; ++s) {
        if (k >= mine.size() || mine[k].unit != u || mine[k].state != s) continue;
        std::span<M> src = s == 0 ? e.main_weights(u) : opt.state(u, s - 1);
        if (out && last_write[b] != 0) out->wait(last_write[b]);  // the file has this buffer's last contents
        host[b].reserve(L.shard_numel());
        const std::span<M> shard(host[b].data(), L.shard_numel());
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
          const void* p = host[b].data() + pe.p.shard_begin;
          const std::size_t bytes = pe.p.count * sizeof(M);
          if (out) last_write[b] = out->write(p, bytes);
          const std::uint64_t d = checksum64::of(p, bytes);
          whole.update(&d, sizeof d);  // each byte is hashed once (see index.hpp)
          sums[k] = std::int64_t(d);
        }
        b ^= 1;
      }
    }
    if (out) out->finish();
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
      x.lineage = o.lineage;
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
        // Only this lineage's: another run's checkpoints under the same root
        // (a fresh job pointed at an old directory) are not this job's to delete.
        auto done = lineage_checkpoints(root, o.lineage);
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

}  // namespace tessera::checkpoint
