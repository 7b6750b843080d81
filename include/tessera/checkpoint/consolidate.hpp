#pragma once
//! \file Whole-tensor safetensors files: a streaming writer (header first,
//! then one tensor at a time, so memory is bounded by the largest tensor),
//! and consolidation of a sharded checkpoint into one such file (no GPU, no
//! MPI: it reads the index and the pieces).
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/checkpoint/directory.hpp"
#include "tessera/checkpoint/index.hpp"
#include "tessera/checkpoint/io.hpp"
#include "tessera/checkpoint/safetensors.hpp"
#include "tessera/core/checksum.hpp"

namespace tessera::checkpoint {

struct tensor_out {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  [[nodiscard]] std::uint64_t bytes() const {
    std::uint64_t n = dtype_bytes(dtype);
    for (auto s : shape) n *= std::uint64_t(s);
    return n;
  }
};

//! Writes `path` (atomically: to path.tmp, synced, renamed) holding the given
//! tensors; fill(i, dst) writes tensor i's bytes into dst (bytes() of them).
inline void write_safetensors(const fs::path& path, const std::vector<tensor_out>& tensors,
                              const std::function<void(std::size_t, std::vector<unsigned char>&)>& fill,
                              const std::map<std::string, std::string>& metadata = {}) {
  std::vector<st_entry> entries;
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    entries.push_back({t.name, t.dtype, t.shape, at, at + t.bytes()});
    at += t.bytes();
  }
  const fs::path tmp = path.string() + ".tmp";
  std::error_code ec;
  try {
    out_file f(tmp.string());
    const std::string header = make_safetensors_header(entries, metadata);
    f.write(header.data(), header.size());
    std::vector<unsigned char> buf;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      buf.assign(std::size_t(tensors[i].bytes()), 0);
      fill(i, buf);
      f.write(buf.data(), buf.size());
    }
    f.sync_and_close();
  } catch (...) {  // a full disk, a failed fill: the partial file goes, the error stays
    fs::remove(tmp, ec);
    throw;
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    const int code = ec.value();
    fs::remove(tmp, ec);
    io_fail("cannot rename into place", path.string(), code);
  }
}

//! Writes one safetensors file of full tensors (the main weights, and with
//! `with_states` every optimizer state as "name/state") from the checkpoint at
//! `ckpt`, checking sizes and checksums. Returns the number of tensors written.
inline std::size_t consolidate(const fs::path& ckpt, const fs::path& out, bool with_states = false) {
  const std::string where = "checkpoint '" + ckpt.string() + "'";
  const index_info x = read_index(ckpt, where);
  std::vector<tensor_out> outs;
  std::vector<std::pair<const std::string*, std::size_t>> what;  // tensor name, state
  for (const auto& [name, t] : x.tensors)
    for (std::size_t s = 0; s < (with_states ? x.states.size() : 1); ++s) {
      outs.push_back({s == 0 ? name : name + "/" + x.states[s], t.dtype, t.shape});
      what.emplace_back(&name, s);
    }
  // Every rank file opened and its header checked before anything is
  // written, through the same reader and checks as load.
  std::vector<rank_reader> files;
  for (int q = 0; q < int(x.files.size()); ++q) files.push_back(open_rank_reader(x, ckpt, q, where));
  write_safetensors(out, outs, [&](std::size_t i, std::vector<unsigned char>& dst) {
    const auto& t = x.tensors.at(*what[i].first);
    const std::size_t s = what[i].second, esize = dtype_bytes(t.dtype);
    for (const auto& p : t.pieces) read_piece(files[std::size_t(p.file)], t, p, s, dst.data() + p.begin * esize, where);
  }, {{"format", "tessera-consolidated"}, {"step", std::to_string(x.step)}});
  return outs.size();
}

}  // namespace tessera::checkpoint
