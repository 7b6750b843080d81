#pragma once
//! \file The index of a sharded checkpoint (index.json, written last): for
//! every tensor its global shape and dtype and which byte ranges of which
//! rank file hold which of its elements, for each state (main weights and
//! each optimizer state); who wrote it (step, strategy, world size); and the
//! size and checksum of every file and of every byte range. Checksums are
//! checksum64 (core/checksum.hpp); a file's is that of its header bytes
//! followed by the 8-byte little-endian digests of its entries in file order,
//! so every byte is hashed once. Parsing treats
//! the file as untrusted: every field is type- and range-checked.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/checkpoint/safetensors.hpp"
#include "tessera/core/checksum.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/fixed_point.hpp"

namespace tessera::checkpoint {

constexpr int index_version = 1;
constexpr const char* index_name = "index.json";

struct byte_range {
  std::uint64_t offset = 0, bytes = 0;  //!< absolute in the file
  std::uint64_t checksum = 0;
};
struct piece_info {
  int file = 0;
  std::uint64_t begin = 0, count = 0;  //!< elements [begin, begin + count) of the flattened tensor
  std::vector<byte_range> ranges;      //!< one per state, in index.states order
  std::vector<std::string> keys;       //!< the safetensors entry of each state
};
struct tensor_info {
  std::vector<std::int64_t> shape;
  std::string dtype;
  std::vector<piece_info> pieces;
  [[nodiscard]] std::uint64_t numel() const {
    std::uint64_t n = 1;
    for (auto s : shape) n *= std::uint64_t(s);
    return n;
  }
};
struct file_info {
  std::string name;
  std::uint64_t bytes = 0, checksum = 0;
};
struct index_info {
  long step = 0, optimizer_steps = 0, optimizer_skipped = 0;
  int world = 1;
  std::string strategy, wrapper, optimizer;
  std::vector<std::string> states;  //!< "main", then the optimizer's state names
  std::vector<file_info> files;
  std::map<std::string, tensor_info> tensors;  //!< by "unit.tensor"
  nlohmann::json extra = nlohmann::json::object();  //!< the trainer's own state (data position, seed)
  std::map<std::string, int> exact_scales;  //!< exact_reduction's fixed-point scale of each unit, by name
  //! The run this checkpoint belongs to (save_options::lineage; "" where none
  //! was given, as in every index written before 2026-12-07).
  std::string lineage;
};

inline nlohmann::json to_json(const index_info& x) {
  nlohmann::json files = nlohmann::json::array(), tensors = nlohmann::json::object();
  for (const auto& f : x.files)
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"checksum", checksum64::to_hex(f.checksum)}});
  for (const auto& [name, t] : x.tensors) {
    nlohmann::json pieces = nlohmann::json::array();
    for (const auto& p : t.pieces) {
      nlohmann::json ranges = nlohmann::json::array();
      for (std::size_t s = 0; s < p.ranges.size(); ++s)
        ranges.push_back({{"key", p.keys[s]}, {"offset", p.ranges[s].offset}, {"bytes", p.ranges[s].bytes},
                          {"checksum", checksum64::to_hex(p.ranges[s].checksum)}});
      pieces.push_back({{"file", p.file}, {"begin", p.begin}, {"count", p.count}, {"ranges", ranges}});
    }
    tensors[name] = {{"shape", t.shape}, {"dtype", t.dtype}, {"pieces", pieces}};
  }
  return {{"format", "tessera-checkpoint"}, {"version", index_version}, {"step", x.step},
          {"strategy", x.strategy},         {"wrapper", x.wrapper},     {"world", x.world},
          {"optimizer", x.optimizer},       {"optimizer_steps", x.optimizer_steps},
          {"optimizer_skipped", x.optimizer_skipped}, {"states", x.states}, {"files", files},
          {"tensors", tensors},             {"extra", x.extra}};
}
//! to_json, with exact_reduction's scales where the run had them (an index
//! of a float_reduction run reads as it always did).
inline nlohmann::json to_json_full(const index_info& x) {
  nlohmann::json j = to_json(x);
  if (!x.exact_scales.empty()) j["exact_scales"] = x.exact_scales;
  if (!x.lineage.empty()) j["lineage"] = x.lineage;
  return j;
}

//! The checksum of an index without its index_checksum field (keys sorted:
//! nlohmann::json objects are ordered maps, so the text is canonical).
[[nodiscard]] inline std::uint64_t index_checksum(const nlohmann::json& j) {
  const std::string text = j.dump();
  return checksum64::of(text.data(), text.size());
}
//! The index as written: to_json plus its checksum.
[[nodiscard]] inline std::string index_text(const index_info& x) {
  nlohmann::json j = to_json_full(x);
  j["index_checksum"] = checksum64::to_hex(index_checksum(j));
  return j.dump(1);
}

namespace detail {
inline std::uint64_t parse_hex64(const nlohmann::json& v, const std::string& what) {
  if (!v.is_string() || v.get<std::string>().size() != 16) tessera::detail::fail(what + ": checksum is not 16 hex digits");
  std::uint64_t r = 0;
  for (char c : v.get<std::string>()) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) tessera::detail::fail(what + ": checksum is not 16 hex digits");
    r = (r << 4) | std::uint64_t(d);
  }
  return r;
}
inline std::uint64_t get_u64(const nlohmann::json& j, const char* key, const std::string& what,
                             std::uint64_t max = std::uint64_t(1) << 62) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_unsigned() || j[key].get<std::uint64_t>() > max)
    tessera::detail::fail(what + ": '" + key + "' missing or not an unsigned integer <= " + std::to_string(max));
  return j[key].get<std::uint64_t>();
}
inline std::string get_str(const nlohmann::json& j, const char* key, const std::string& what) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string())
    tessera::detail::fail(what + ": '" + key + "' missing or not a string");
  return j[key].get<std::string>();
}
}  // namespace detail

//! Parses and checks an index (text from index.json); `what` names it in errors.
//! The index must carry its index_checksum: without it an edit that keeps the
//! structure valid (a transposed shape, a dropped tensor, another seed) cannot
//! be told from the saved index. `require_checksum = false` is for fuzzing the
//! structure checks only.
inline index_info parse_index(std::string_view text, const std::string& what, bool require_checksum = true) {
  using detail::get_str;
  using detail::get_u64;
  auto j = parse_json(text, what);
  if (!j.is_object() || get_str(j, "format", what) != "tessera-checkpoint")
    tessera::detail::fail(what + ": not a tessera checkpoint index");
  // The version first (the spec's order): another version may checksum its
  // index another way, so it is named as a version, not reported as damage.
  if (get_u64(j, "version", what) != index_version)
    tessera::detail::fail(what + ": index version " + std::to_string(get_u64(j, "version", what)) + ", this build reads " +
                          std::to_string(index_version));
  // The whole index (the trainer's extra fields included) is covered by its checksum.
  if (require_checksum && !j.contains("index_checksum"))
    tessera::detail::fail(what + ": the index has no index_checksum (removed, or written before 2026-11-30); "
                                 "an unverified index could load edited weights or training state, so it is refused");
  if (j.contains("index_checksum")) {
    const std::uint64_t want = detail::parse_hex64(j["index_checksum"], what + " index_checksum");
    j.erase("index_checksum");
    if (index_checksum(j) != want)
      tessera::detail::fail(what + ": the index does not match its checksum (edited or damaged)");
  }
  index_info x;
  x.step = long(get_u64(j, "step", what));
  x.world = int(get_u64(j, "world", what, 1 << 24));
  if (x.world < 1) tessera::detail::fail(what + ": world 0");
  x.strategy = get_str(j, "strategy", what);
  x.wrapper = get_str(j, "wrapper", what);
  x.optimizer = get_str(j, "optimizer", what);
  x.optimizer_steps = long(get_u64(j, "optimizer_steps", what));
  x.optimizer_skipped = long(get_u64(j, "optimizer_skipped", what));
  if (j.contains("exact_scales")) {
    const auto& e = j["exact_scales"];
    if (!e.is_object()) tessera::detail::fail(what + ": 'exact_scales' is not an object of unit names");
    for (auto it = e.begin(); it != e.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<long long>() < fixed::min_scale ||
          it.value().get<long long>() > fixed::max_scale)
        tessera::detail::fail(what + ": exact scale of unit '" + printable(it.key()) + "' is not an integer in [" +
                              std::to_string(fixed::min_scale) + ", " + std::to_string(fixed::max_scale) + "]");
      x.exact_scales[it.key()] = int(it.value().get<long long>());
    }
  }
  if (!j.contains("states") || !j["states"].is_array() || j["states"].empty() || j["states"].size() > 16)
    tessera::detail::fail(what + ": 'states' is not a list of 1 to 16 names");
  for (const auto& s : j["states"]) {
    if (!s.is_string()) tessera::detail::fail(what + ": a state name is not a string");
    x.states.push_back(s.get<std::string>());
  }
  if (!j.contains("files") || !j["files"].is_array() || j["files"].size() != std::size_t(x.world))
    tessera::detail::fail(what + ": 'files' is not a list of one file per rank of the writing world");
  for (const auto& f : j["files"]) {
    file_info fi;
    fi.name = get_str(f, "name", what);
    if (fi.name.empty() || fi.name.find('/') != std::string::npos || fi.name.find("..") != std::string::npos)
      tessera::detail::fail(what + ": file name '" + printable(fi.name) + "' is not a plain name in the checkpoint directory");
    fi.bytes = get_u64(f, "bytes", what);
    fi.checksum = detail::parse_hex64(f.contains("checksum") ? f["checksum"] : nlohmann::json(), what + " file " + fi.name);
    x.files.push_back(std::move(fi));
  }
  if (!j.contains("tensors") || !j["tensors"].is_object()) tessera::detail::fail(what + ": 'tensors' is not an object");
  for (auto it = j["tensors"].begin(); it != j["tensors"].end(); ++it) {
    const std::string tw = what + " tensor '" + printable(it.key()) + "'";
    const auto& t = it.value();
    tensor_info ti;
    ti.dtype = get_str(t, "dtype", tw);
    const std::size_t esize = dtype_bytes(ti.dtype);
    if (ti.dtype != "F32" && ti.dtype != "F64" && ti.dtype != "BF16" && ti.dtype != "F16")
      tessera::detail::fail(tw + ": dtype '" + printable(ti.dtype) + "' is not a floating-point type a checkpoint holds");
    if (!t.contains("shape") || !t["shape"].is_array() || t["shape"].size() > 16)
      tessera::detail::fail(tw + ": shape is not a list of at most 16 extents");
    std::uint64_t numel = 1;
    for (const auto& e : t["shape"]) {
      if (!e.is_number_unsigned() || e.get<std::uint64_t>() > (std::uint64_t(1) << 48))
        tessera::detail::fail(tw + ": shape holds a negative or huge extent");
      const std::uint64_t s = e.get<std::uint64_t>();
      if (s != 0 && numel > (std::uint64_t(1) << 56) / s) tessera::detail::fail(tw + ": shape product overflows");
      numel *= s;
      ti.shape.push_back(std::int64_t(s));
    }
    if (!t.contains("pieces") || !t["pieces"].is_array()) tessera::detail::fail(tw + ": 'pieces' is not a list");
    for (const auto& p : t["pieces"]) {
      piece_info pi;
      pi.file = int(get_u64(p, "file", tw, std::uint64_t(x.world - 1)));
      pi.begin = get_u64(p, "begin", tw, numel);
      pi.count = get_u64(p, "count", tw, numel - pi.begin);
      if (!p.contains("ranges") || !p["ranges"].is_array() || p["ranges"].size() != x.states.size())
        tessera::detail::fail(tw + ": a piece does not have one byte range per state");
      for (const auto& r : p["ranges"]) {
        byte_range br;
        br.offset = get_u64(r, "offset", tw);
        br.bytes = get_u64(r, "bytes", tw);
        if (br.bytes != pi.count * esize) tessera::detail::fail(tw + ": a byte range does not match its element count");
        if (br.offset > x.files[std::size_t(pi.file)].bytes || br.bytes > x.files[std::size_t(pi.file)].bytes - br.offset)
          tessera::detail::fail(tw + ": a byte range lies outside file '" + x.files[std::size_t(pi.file)].name + "'");
        br.checksum = detail::parse_hex64(r.contains("checksum") ? r["checksum"] : nlohmann::json(), tw);
        pi.keys.push_back(get_str(r, "key", tw));
        // A piece names its own tensor and state: an index that files one
        // tensor's bytes under another's name is damaged, whatever reads it.
        const std::string want = it.key() + "/" + x.states[pi.keys.size() - 1];
        if (pi.keys.back() != want)
          tessera::detail::fail(tw + ": a piece's key is '" + printable(pi.keys.back()) + "', expected '" + printable(want) + "'");
        pi.ranges.push_back(br);
      }
      ti.pieces.push_back(std::move(pi));
    }
    // The pieces must cover the tensor exactly once.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> cover;
    for (const auto& p : ti.pieces)
      if (p.count) cover.emplace_back(p.begin, p.count);
    std::sort(cover.begin(), cover.end());
    std::uint64_t at = 0;
    for (auto [b, c] : cover) {
      if (b != at) tessera::detail::fail(tw + ": its pieces " + (b < at ? "overlap" : "leave a gap") + " at element " + std::to_string(std::min(b, at)));
      at = b + c;
    }
    if (at != numel) tessera::detail::fail(tw + ": its pieces cover " + std::to_string(at) + " of " + std::to_string(numel) + " elements");
    x.tensors.emplace(it.key(), std::move(ti));
  }
  if (j.contains("extra")) x.extra = j["extra"];
  if (j.contains("lineage")) x.lineage = get_str(j, "lineage", what);
  return x;
}

}  // namespace tessera::checkpoint
