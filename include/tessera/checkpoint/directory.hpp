#pragma once
//! \file Where checkpoints live under a root directory, which is newest, and
//! reading their rank files with the index's checks (loads and consolidation).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/checkpoint/index.hpp"
#include "tessera/checkpoint/io.hpp"
#include "tessera/checkpoint/safetensors.hpp"
#include "tessera/core/checksum.hpp"

namespace tessera::checkpoint {

[[nodiscard]] inline fs::path step_dir(const fs::path& root, long step) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%09ld", step);
  return root / b;
}
[[nodiscard]] inline std::string rank_file(int r, int world) {
  char b[64];
  std::snprintf(b, sizeof b, "rank-%05d-of-%05d.safetensors", r, world);
  return b;
}

//! The index of the checkpoint in `dir`, parsed and checked; `where` names
//! it in errors. A step-N directory must hold the index of step N: one moved
//! or copied by hand would otherwise pass for the newest checkpoint.
[[nodiscard]] inline index_info read_index(const fs::path& dir, const std::string& where) {
  index_info x = parse_index(read_small_file(dir / index_name, std::uint64_t(1) << 30), where + " " + index_name);
  const std::string name = dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
  if (name.rfind("step-", 0) == 0 && name.size() > 5 &&
      name.find_first_not_of("0123456789", 5) == std::string::npos && std::stol(name.substr(5)) != x.step)
    tessera::detail::fail(where + ": the directory " + name + " holds the index of step " + std::to_string(x.step) +
                          " (moved or copied by hand?)");
  return x;
}

//! Complete checkpoints (a step-* directory holding an index) under root, oldest first.
[[nodiscard]] inline std::vector<std::pair<long, fs::path>> complete_checkpoints(const fs::path& root) {
  std::vector<std::pair<long, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) != 0 || !e.is_directory(ec) || !fs::exists(e.path() / index_name, ec)) continue;
    char* end = nullptr;
    const long s = std::strtol(n.c_str() + 5, &end, 10);
    if (end && *end == '\0' && s >= 0) out.emplace_back(s, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

//! The lineage recorded in the index of the checkpoint at dir ("" where none;
//! nullopt where the index cannot be read or checked).
[[nodiscard]] inline std::optional<std::string> lineage_of(const fs::path& dir) {
  try {
    return read_index(dir, "checkpoint '" + dir.string() + "'").lineage;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}
//! complete_checkpoints(root) of one lineage (all of them where lineage is "").
[[nodiscard]] inline std::vector<std::pair<long, fs::path>> lineage_checkpoints(const fs::path& root,
                                                                               const std::string& lineage) {
  auto all = complete_checkpoints(root);
  if (lineage.empty()) return all;
  std::erase_if(all, [&](const auto& c) { return lineage_of(c.second) != lineage; });
  return all;
}

//! The checkpoint `dir` names: itself if it holds an index, else the newest complete one under it.
[[nodiscard]] inline std::optional<fs::path> resolve(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / index_name, ec)) return dir;
  auto all = complete_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

//! Rank file q of the checkpoint at dir, opened after checking that it exists
//! and has the size the index records; `where` names the checkpoint in errors.
[[nodiscard]] inline in_file open_rank_file(const index_info& x, const fs::path& dir, int q, const std::string& where) {
  const auto& fi = x.files.at(std::size_t(q));
  const fs::path p = dir / fi.name;
  std::error_code ec;
  if (!fs::exists(p, ec)) tessera::detail::fail(where + ": file '" + fi.name + "' is missing");
  in_file f(p.string());
  if (f.size() != fi.bytes)
    tessera::detail::fail(where + ": file '" + fi.name + "' is " + std::to_string(f.size()) + " bytes; the index says " +
                          std::to_string(fi.bytes) + " (truncated or replaced)");
  return f;
}

//! Reads byte range br of rank file f (entry `key`) into dst and checks its
//! checksum, hashing each chunk as it arrives (while it is still in cache).
inline void read_checked(const in_file& f, const byte_range& br, void* dst, const std::string& file_name,
                         const std::string& key, const std::string& where) {
  constexpr std::uint64_t chunk = std::uint64_t(16) << 20;
  auto* p = static_cast<unsigned char*>(dst);
  checksum64 sum;
  for (std::uint64_t at = 0; at < br.bytes; at += chunk) {
    const std::size_t n = std::size_t(std::min(chunk, br.bytes - at));
    f.read(br.offset + at, p + at, n);
    sum.update(p + at, n);
  }
  if (sum.digest() != br.checksum)
    tessera::detail::fail(where + ": checksum mismatch in file '" + file_name + "', tensor '" + key +
                          "' (the file is damaged)");
}

//! A rank file open for reading, with its safetensors header parsed: what
//! load and consolidate read through, so both validate alike.
struct rank_reader {
  in_file file;
  st_header header;
  std::string name;
};

//! Reads and parses the safetensors header of an open file (its length,
//! then that many bytes, bounded by max_header_bytes); `what` names it in
//! errors. The header's bytes go to `bytes` where given (a checksum's input).
[[nodiscard]] inline st_header read_safetensors_header(const in_file& f, const std::string& what,
                                                       std::vector<unsigned char>* bytes = nullptr) {
  std::vector<unsigned char> head(std::size_t(std::min<std::uint64_t>(f.size(), 8)));
  f.read(0, head.data(), head.size());
  std::uint64_t n = 0;
  for (int i = int(head.size()) - 1; i >= 0; --i) n = (n << 8) | head[std::size_t(i)];
  head.resize(std::size_t(std::min<std::uint64_t>(f.size(), 8 + std::min(n, max_header_bytes))));
  f.read(0, head.data(), head.size());
  st_header h = parse_safetensors_header(head, f.size(), what);
  if (bytes) *bytes = std::move(head);
  return h;
}

//! Opens rank file q (checking existence and size, open_rank_file) and parses its header.
[[nodiscard]] inline rank_reader open_rank_reader(const index_info& x, const fs::path& dir, int q, const std::string& where) {
  const auto& fi = x.files.at(std::size_t(q));
  in_file f = open_rank_file(x, dir, q, where);
  const std::string what = where + ": file '" + fi.name + "'";
  std::vector<unsigned char> head;
  st_header h = read_safetensors_header(f, what, &head);
  // The header names this checkpoint: a file copied from another step or
  // world, or a flipped bit in its metadata, is refused.
  const auto meta = [&](const std::string& k) {
    const auto it = h.metadata.find(k);
    return it == h.metadata.end() ? std::string("(none)") : it->second;
  };
  const std::string want[4][2] = {{"format", "tessera"}, {"rank", std::to_string(q)},
                                  {"world", std::to_string(x.world)}, {"step", std::to_string(x.step)}};
  for (const auto& [k, v] : want)
    if (meta(k) != v)
      tessera::detail::fail(what + ": its header's __metadata__ '" + k + "' is '" + meta(k) + "'; the index says '" + v + "'");
  // The file's checksum (§4.2 of docs/checkpoint-format.md): its header bytes,
  // then the digest of each entry the index places in it, by offset. It ties
  // the header and the index's range checksums together, so it is checked
  // before any tensor is read, whatever part of the file this reader needs.
  std::vector<std::pair<std::uint64_t, const byte_range*>> ranges;
  for (const auto& [key, t] : x.tensors)
    for (const auto& pi : t.pieces)
      if (pi.file == q)
        for (const auto& br : pi.ranges)
          if (br.bytes > 0) ranges.emplace_back(br.offset, &br);
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  checksum64 whole;
  whole.update(head.data(), head.size());
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const byte_range& br = *ranges[i].second;
    if (i > 0 && ranges[i - 1].second->offset + ranges[i - 1].second->bytes > br.offset)
      tessera::detail::fail(what + ": two entries of the index overlap at byte " + std::to_string(br.offset));
    unsigned char le[8];
    for (int b = 0; b < 8; ++b) le[b] = static_cast<unsigned char>(br.checksum >> (8 * b));
    whole.update(le, sizeof le);
  }
  if (whole.digest() != fi.checksum)
    tessera::detail::fail(what + " does not match its checksum in the index (its header, or the index's entries for it, "
                          "were changed)");
  return {std::move(f), std::move(h), fi.name};
}

//! The byte range of state s of piece pi of tensor t, after checking that
//! the rank file's header holds the piece's key with the tensor's dtype at
//! the range the index names.
inline const byte_range& checked_range(const rank_reader& r, const tensor_info& t, const piece_info& pi, std::size_t s,
                                       const std::string& where) {
  const byte_range& br = pi.ranges.at(s);
  const st_entry* se = r.header.find(pi.keys[s]);
  if (!se || se->dtype != t.dtype || r.header.data_start + se->begin != br.offset || se->end - se->begin != br.bytes)
    tessera::detail::fail(where + ": file '" + r.name + "' does not hold '" + pi.keys[s] + "' where the index says");
  return br;
}

//! State s of piece pi of tensor t into dst, its place in the header and its checksum checked.
inline void read_piece(const rank_reader& r, const tensor_info& t, const piece_info& pi, std::size_t s, void* dst,
                       const std::string& where) {
  read_checked(r.file, checked_range(r, t, pi, s, where), dst, r.name, pi.keys[s], where);
}

}  // namespace tessera::checkpoint
