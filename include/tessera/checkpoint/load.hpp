#pragma once
//! \file checkpoint::load (see checkpoint.hpp for the layout and guarantees).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/backend/host/pool.hpp"
#include "tessera/backend/ops.hpp"
#include "tessera/checkpoint/directory.hpp"
#include "tessera/checkpoint/layout.hpp"
#include "tessera/checkpoint/pipeline.hpp"

namespace tessera::checkpoint {

namespace detail {

// Copies staged host values into the model's main weights and optimizer
// states. On a device: through two pinned chunks that take turns, each
// filled by every core while the other is on its way to the device.
template <class Backend, class M>
class copy_in {
public:
  void operator()(std::span<M> dst, const M* src, std::size_t n) {
    TESSERA_CHECK(dst.size() == n, "checkpoint::load: ", n, " staged values for ", dst.size(), " elements");
    if constexpr (std::is_same_v<Backend, backend::host>) {
      ops::copy_from_host(dst, std::span<const M>(src, n));
    } else {
      for (std::size_t at = 0; at < n; at += chunk, b_ ^= 1) {
        const std::size_t c = std::min(chunk, n - at);
        if (busy_[b_]) sent_[b_].wait();
        bounce_[b_].reserve(chunk);
        M* to = bounce_[b_].data();
        host::pool::shared().parallel_for(c, std::size_t(1) << 16, [&](std::size_t i, std::size_t j) {
          std::memcpy(to + i, src + at + i, (j - i) * sizeof(M));
        });
        ops::copy_from_host_async(dst.subspan(at, c), std::span<const M>(to, c));
        sent_[b_].record();
        busy_[b_] = true;
      }
    }
  }
  //! Returns once every copy reached the device.
  void finish() {
    if constexpr (!std::is_same_v<Backend, backend::host>)
      for (int b = 0; b < 2; ++b)
        if (std::exchange(busy_[b], false)) sent_[b].wait();
  }

private:
  using ops = backend_ops<Backend>;
  static constexpr std::size_t chunk = (std::size_t(32) << 20) / sizeof(M);
  typename ops::template staging<M> bounce_[2];
  typename ops::marker sent_[2];
  bool busy_[2] = {false, false};
  int b_ = 0;
};

}  // namespace detail

//! Loads the checkpoint `dir` names (itself, or the newest complete one under
//! it) into the model and optimizer, whatever strategy and world size wrote
//! it (collective). Either every rank's model and optimizer are replaced, or,
//! after an error on any rank, none is touched.
template <class Opt>
load_result load(Opt& opt, const fs::path& dir) {
  using Wrapper = typename Opt::wrapper_type;
  using Alg = typename Opt::algorithm_type;
  using M = typename Wrapper::main_type;
  auto e = opt.shards();
  const int S = 1 + Alg::state_count;
  const auto& layouts = e.layouts();
  TESSERA_CHECK(!opt.decided(), "checkpoint::load: a step was decided and not applied (call the optimizer's apply() first)");

  load_result res;
  std::exception_ptr err;
  const auto t0 = std::chrono::steady_clock::now();
  // Staged values: per unit, per state, this rank's optimizer range. Not
  // zeroed: the reads fill every element a tensor owns (the index's pieces
  // cover each tensor exactly once) and only the padding between is zeroed,
  // so no pass over many GB of fresh memory precedes the reads.
  std::vector<std::vector<std::unique_ptr<M[]>>> staged(layouts.size());
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
    // What overlaps this rank's optimizer ranges, planned and checked against
    // the rank files' headers here; then read by several threads at once.
    std::map<int, rank_reader> files;
    auto file = [&](int q) -> const rank_reader& {
      auto it = files.find(q);
      if (it == files.end()) it = files.emplace(q, open_rank_reader(x, res.path, q, where)).first;
      return it->second;
    };
    struct read_task {
      const rank_reader* f;
      const byte_range* br;
      const std::string* key;
      std::uint64_t skip, count;  // the elements of the piece wanted
      M* dst;
    };
    std::vector<read_task> tasks;
    std::atomic<std::uint64_t> bytes_read{0};
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      const auto& L = layouts[u];
      const std::size_t n = e.opt_range(u).second;
      for (int s = 0; s < S; ++s) staged[u].push_back(std::make_unique_for_overwrite<M[]>(n));
      std::vector<std::pair<std::size_t, std::size_t>> owned;  // [begin, end) of the range that tensors own
      for (std::size_t t = 0; t < L.tensors().size(); ++t) {
        const piece want = e.range_piece(u, t);
        if (want.empty()) continue;
        owned.emplace_back(want.shard_begin, want.shard_begin + want.count);
        const std::uint64_t ta = want.tensor_begin, tb = want.tensor_begin + want.count;  // tensor elements wanted
        const tensor_info& ti = x.tensors.at(detail::key_of(L, t));
        for (const auto& pi : ti.pieces) {
          const std::uint64_t pa = std::max<std::uint64_t>(pi.begin, ta), pb = std::min<std::uint64_t>(pi.begin + pi.count, tb);
          if (pa >= pb) continue;
          const rank_reader& f = file(pi.file);
          for (int s = 0; s < S; ++s)
            tasks.push_back({&f, &checked_range(f, ti, pi, std::size_t(s), where), &pi.keys[std::size_t(s)], pa - pi.begin,
                             pb - pa, staged[u][std::size_t(s)].get() + (want.shard_begin + (pa - ta))});
        }
      }
      std::sort(owned.begin(), owned.end());
      std::size_t at = 0;
      owned.emplace_back(n, n);
      for (const auto& [b0, b1] : owned) {  // the padding between tensors, and after the last
        for (int s = 0; s < S; ++s)
          if (b0 > at) std::fill(staged[u][std::size_t(s)].get() + at, staged[u][std::size_t(s)].get() + b0, M{});
        at = std::max(at, b1);
      }
    }
    // Biggest first: the long reads start at once and the short ones fill in.
    std::stable_sort(tasks.begin(), tasks.end(), [](const read_task& a, const read_task& b) { return a.br->bytes > b.br->bytes; });
    run_tasks(tasks.size(), reader_threads(), [&](std::size_t i) {
      const read_task& t = tasks[i];
      if (t.skip == 0 && t.count * sizeof(M) == t.br->bytes) {  // the whole piece: straight into place
        read_checked(t.f->file, *t.br, t.dst, t.f->name, *t.key, where);
      } else {  // part of it (another world size wrote it): the whole piece is read for its checksum
        std::vector<unsigned char> buf(std::size_t(t.br->bytes));
        read_checked(t.f->file, *t.br, buf.data(), t.f->name, *t.key, where);
        std::memcpy(t.dst, buf.data() + t.skip * sizeof(M), std::size_t(t.count) * sizeof(M));
      }
      bytes_read.fetch_add(t.br->bytes);
    });
    res.bytes_read = bytes_read.load();
  } catch (...) {
    err = std::current_exception();
  }
  e.agree_or_throw(err, "checkpoint::load");
  const auto t1 = std::chrono::steady_clock::now();
  // Every rank has everything it needs: now, and only now, the model changes.
  {
    detail::copy_in<typename Wrapper::backend_type, M> put;
    for (std::size_t u = 0; u < layouts.size(); ++u) {
      const std::size_t n = e.opt_range(u).second;
      put(e.main_weights(u), staged[u][0].get(), n);
      for (int s = 1; s < S; ++s) put(opt.state(u, s - 1), staged[u][std::size_t(s)].get(), n);
    }
    put.finish();
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
  res.read_seconds = std::chrono::duration<double>(t1 - t0).count();
  res.apply_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  res.step = x.step;
  res.world = x.world;
  res.strategy = x.strategy;
  res.extra = x.extra;
  res.lineage = x.lineage;
  return res;
}

}  // namespace tessera::checkpoint
