#pragma once
//! \file safetensors: the header of a .safetensors file, written and parsed.
//!
//! Format: 8 bytes little-endian N, N bytes of JSON ({"__metadata__": {str: str},
//! name: {"dtype", "shape", "data_offsets": [begin, end]}}), padded with spaces
//! to a multiple of 8, then the data; offsets are relative to the data. Parsing
//! treats the file as untrusted: sizes, nesting, dtypes, shapes (and their
//! products), offsets inside the file and non-overlapping ranges are checked,
//! and every failure is a tessera::error naming the file.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/error.hpp"

namespace tessera::checkpoint {

struct st_entry {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  //!< byte range relative to the data section
};

struct st_header {
  std::map<std::string, std::string> metadata;
  std::vector<st_entry> entries;
  std::uint64_t data_start = 0;  //!< absolute offset of the data section (8 + N)
  [[nodiscard]] const st_entry* find(std::string_view name) const {
    for (const auto& e : entries)
      if (e.name == name) return &e;
    return nullptr;
  }
};

//! Text from a damaged file, safe to print: non-printable bytes as '?', at most 80 characters.
[[nodiscard]] inline std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 80)) out += (c >= 0x20 && c < 0x7f) ? char(c) : '?';
  return s.size() > 80 ? out + "..." : out;
}

//! Bytes per element of a safetensors dtype name, 0 if unknown.
[[nodiscard]] inline std::size_t dtype_bytes(std::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}
template <class T> constexpr std::string_view dtype_name() {
  if constexpr (std::is_same_v<T, double>) return "F64";
  else if constexpr (std::is_same_v<T, float>) return "F32";
  else return "?";
}

//! Largest header accepted (the format's reference reader uses 100 MB).
constexpr std::uint64_t max_header_bytes = 100'000'000;
//! Deepest JSON nesting accepted in headers and indexes (ours use 4).
constexpr int max_json_depth = 32;

namespace detail {
// Rejects deep nesting before a recursive structure is built from it.
inline void check_depth(std::string_view text, const std::string& what) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > max_json_depth) tessera::detail::fail(what + ": JSON nested deeper than " + std::to_string(max_json_depth));
    } else if (c == '}' || c == ']') --depth;
  }
}
}  // namespace detail

//! Parses JSON from untrusted text: a tessera::error naming `what` on any failure.
[[nodiscard]] inline nlohmann::json parse_json(std::string_view text, const std::string& what) {
  detail::check_depth(text, what);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    tessera::detail::fail(what + ": not valid JSON (" + e.what() + ")");
  }
}

//! Parses the header of a safetensors file whose first bytes are `prefix` (at
//! least 8 + N of them, or the whole file) and whose size is file_size.
[[nodiscard]] inline st_header parse_safetensors_header(std::span<const unsigned char> prefix, std::uint64_t file_size,
                                                        const std::string& what) {
  auto bad = [&](const std::string& m) -> void { tessera::detail::fail(what + ": not a valid safetensors file: " + m); };
  if (file_size < 8 || prefix.size() < 8) bad("shorter than the 8-byte header length");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[std::size_t(i)];
  if (n > max_header_bytes) bad("header length " + std::to_string(n) + " over the limit");
  if (8 + n > file_size) bad("header length " + std::to_string(n) + " runs past the end of the file");
  if (prefix.size() < 8 + n) bad("header not fully read");
  st_header h;
  h.data_start = 8 + n;
  const std::uint64_t data_bytes = file_size - h.data_start;
  const auto j = parse_json(std::string_view(reinterpret_cast<const char*>(prefix.data() + 8), std::size_t(n)), what);
  if (!j.is_object()) bad("the header is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) bad("__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) bad("__metadata__['" + m.key() + "'] is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const auto& v = it.value();
    const std::string name = it.key();
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      bad("tensor '" + printable(name) + "' lacks dtype, shape or data_offsets");
    if (!v["dtype"].is_string() || dtype_bytes(v["dtype"].get<std::string>()) == 0) bad("tensor '" + printable(name) + "': unknown dtype");
    st_entry e;
    e.name = name;
    e.dtype = v["dtype"].get<std::string>();
    if (!v["shape"].is_array() || v["shape"].size() > 16) bad("tensor '" + printable(name) + "': shape is not an array of rank <= 16");
    std::uint64_t numel = 1;
    for (const auto& x : v["shape"]) {
      if (!x.is_number_unsigned() || x.get<std::uint64_t>() > (std::uint64_t(1) << 48))
        bad("tensor '" + printable(name) + "': shape holds a negative, non-integer or huge extent");
      const std::uint64_t s = x.get<std::uint64_t>();
      if (s != 0 && numel > (std::uint64_t(1) << 56) / s) bad("tensor '" + printable(name) + "': shape product overflows");
      numel *= s;
      e.shape.push_back(std::int64_t(s));
    }
    const auto& o = v["data_offsets"];
    if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() || !o[1].is_number_unsigned())
      bad("tensor '" + printable(name) + "': data_offsets is not two unsigned integers");
    e.begin = o[0].get<std::uint64_t>();
    e.end = o[1].get<std::uint64_t>();
    if (e.begin > e.end || e.end > data_bytes)
      bad("tensor '" + printable(name) + "': data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
          ") outside the " + std::to_string(data_bytes) + " data bytes");
    if (e.end - e.begin != numel * dtype_bytes(e.dtype))
      bad("tensor '" + printable(name) + "': " + std::to_string(e.end - e.begin) + " bytes for " + std::to_string(numel) + " " +
          e.dtype + " elements");
    h.entries.push_back(std::move(e));
  }
  std::vector<const st_entry*> by_start;
  for (const auto& e : h.entries) by_start.push_back(&e);
  std::sort(by_start.begin(), by_start.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_start.size(); ++i)
    if (by_start[i]->begin < by_start[i - 1]->end)
      bad("tensors '" + printable(by_start[i - 1]->name) + "' and '" + printable(by_start[i]->name) + "' overlap");
  return h;
}

//! The header bytes (length, JSON padded with spaces to 8 bytes) for entries
//! whose offsets the caller chose (packed in order, in practice).
[[nodiscard]] inline std::string make_safetensors_header(const std::vector<st_entry>& entries,
                                                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json j;
  if (!metadata.empty()) j["__metadata__"] = metadata;
  for (const auto& e : entries) j[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + text;
}

}  // namespace tessera::checkpoint
