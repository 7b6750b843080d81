#pragma once
// The bridge from Hugging Face directories into a wrapper: a model's
// conversion table (Megatron-Bridge's param mappings, transformers'
// checkpoint conversion mapping) read by import and export alike, a
// directory's safetensors files (one, or sharded under
// model.safetensors.index.json; F32, BF16 or F16), and the load of each
// rank's shard of every parameter straight from the bytes that hold it.
//
// A table lists, for each of the model's tensors ("unit.tensor", {i} for a
// block's index), the Hugging Face tensors it is: their rows stacked in order
// (a fused qkv from q_proj, k_proj, v_proj), transposed where Hugging Face
// keeps [in, out] (GPT-2's Conv1D), with zero rows past theirs where the
// model pads a vocabulary ("pad_rows"), and absent where a tied head is the
// embedding ("untied"). tools/hf_import.py and tools/hf_export.py read the
// same tables (each model's hf_table.hpp), so a round trip is exact by
// construction.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tessera/backend/ops.hpp"
#include "tessera/checkpoint/directory.hpp"
#include "tessera/checkpoint/io.hpp"
#include "tessera/checkpoint/safetensors.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"

namespace trainer_kit::hf {

//! One row of a conversion table, for one tensor of the model.
struct mapping {
  std::string tessera;          // "unit.tensor"
  std::vector<std::string> hf;  // stacked on dim 0
  bool transpose = false, pad_rows = false, untied = false;
};

//! A model's table for `layers` blocks ({i} expanded); `tied` drops the rows
//! marked "untied". `table_json` is the model's hf_table.hpp text.
inline std::vector<mapping> expand_table(const char* table_json, int layers, bool tied) {
  const auto j = nlohmann::json::parse(table_json);
  std::vector<mapping> out;
  auto sub = [](std::string s, int i) {
    for (std::size_t at; (at = s.find("{i}")) != std::string::npos;) s.replace(at, 3, std::to_string(i));
    return s;
  };
  for (const auto& t : j.at("tensors")) {
    if (tied && t.value("untied", false)) continue;
    const std::string name = t.at("tessera");
    const bool per_block = name.find("{i}") != std::string::npos;
    for (int i = 0; i < (per_block ? layers : 1); ++i) {
      mapping m{sub(name, i), {}, t.value("transpose", false), t.value("pad_rows", false), t.value("untied", false)};
      for (const auto& h : t.at("hf")) m.hf.push_back(sub(h.get<std::string>(), i));
      out.push_back(std::move(m));
    }
  }
  return out;
}
//! Hugging Face names a model's files may also hold that carry no weights
//! (buffers older transformers saved), as the table lists them; "{i}" matches any block.
inline std::vector<std::string> ignored_names(const char* table_json) {
  const auto j = nlohmann::json::parse(table_json);
  return j.value("ignore", std::vector<std::string>{});
}

//! A directory's config.json, parsed (a tessera error naming the file where it is not JSON).
inline nlohmann::json read_config(const std::filesystem::path& dir) {
  const auto path = dir / "config.json";
  const std::string text = tessera::checkpoint::read_small_file(path, std::uint64_t(1) << 24);
  return tessera::checkpoint::parse_json(text, path.string());
}

//! The safetensors files of a directory and where each tensor lies in them.
class directory {
public:
  explicit directory(const std::filesystem::path& dir) : dir_(dir) {
    namespace fs = std::filesystem;
    std::vector<std::string> files;
    std::error_code ec;
    if (fs::exists(dir / "model.safetensors.index.json", ec)) {
      const auto path = (dir / "model.safetensors.index.json").string();
      const auto j = tessera::checkpoint::parse_json(tessera::checkpoint::read_small_file(path, std::uint64_t(1) << 26), path);
      TESSERA_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "'", path,
                    "' has no weight_map object");
      std::set<std::string> names;
      for (const auto& [k, v] : j["weight_map"].items()) {
        TESSERA_CHECK(v.is_string() && v.get<std::string>().find('/') == std::string::npos, "'", path,
                      "': weight_map['", tessera::checkpoint::printable(k), "'] is not a file name in the directory");
        names.insert(v.get<std::string>());
      }
      files.assign(names.begin(), names.end());
    } else {
      TESSERA_CHECK(fs::exists(dir / "model.safetensors", ec), "--init-from '", dir.string(), "': no model.safetensors ",
                    "and no model.safetensors.index.json (a Hugging Face directory holds one of them)");
      files = {"model.safetensors"};
    }
    for (const auto& f : files) {
      auto in = std::make_unique<tessera::checkpoint::in_file>((dir / f).string());
      const auto h = tessera::checkpoint::read_safetensors_header(*in, "--init-from '" + in->path() + "'");
      for (const auto& e : h.entries) {
        TESSERA_CHECK(!where_.count(e.name), "--init-from '", dir.string(), "': tensor '",
                      tessera::checkpoint::printable(e.name), "' stands in two files");
        where_[e.name] = {files_.size(), e};
      }
      files_.push_back({std::move(in), h.data_start});
    }
  }

  struct tensor {
    std::size_t file;
    tessera::checkpoint::st_entry entry;
  };
  //! The tensor `name`, or `prefix` + name where the files keep the base
  //! model's prefix off or on (GPT-2's "transformer.", Llama's "model.").
  [[nodiscard]] const tensor* find(const std::string& name) const {
    if (auto it = where_.find(name); it != where_.end()) return &it->second;
    return nullptr;
  }
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : where_) out.push_back(k);
    return out;
  }
  //! Elements [first, first + count) of tensor t as floats into out.
  void read(const tensor& t, std::uint64_t first, std::uint64_t count, float* out) const {
    const std::size_t eb = tessera::checkpoint::dtype_bytes(t.entry.dtype);
    std::vector<unsigned char> raw(std::size_t(count) * eb);
    const auto& f = files_[t.file];
    f.in->read(f.data_start + t.entry.begin + first * eb, raw.data(), raw.size());
    for (std::uint64_t k = 0; k < count; ++k) {
      const unsigned char* p = raw.data() + k * eb;
      if (t.entry.dtype == "F32") {
        std::memcpy(out + k, p, 4);
      } else {
        std::uint16_t b;
        std::memcpy(&b, p, 2);
        out[k] = t.entry.dtype == "BF16" ? float(tessera::bf16::from_bits(b)) : float(tessera::fp16::from_bits(b));
      }
    }
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return dir_; }

private:
  struct file {
    std::unique_ptr<tessera::checkpoint::in_file> in;
    std::uint64_t data_start;
  };
  std::filesystem::path dir_;
  std::vector<file> files_;
  std::map<std::string, tensor> where_;
};

//! Checks the directory against the table before anything is read: every
//! table tensor present (under `prefix` or not) with the shape the model's
//! tensor needs, in F32, BF16 or F16, and nothing the table does not know
//! (a bias, an expert, another architecture's tensor: the model would be
//! another one). `shape_of` gives the model's [rows, cols] of a Tessera name.
//! Returns each table row's sources, resolved.
template <class ShapeOf>
std::vector<std::vector<const directory::tensor*>> check(const directory& dir, const std::vector<mapping>& table,
                                                          const std::vector<std::string>& ignored,
                                                          const std::string& prefix, ShapeOf&& shape_of) {
  const std::string where = "--init-from '" + dir.path().string() + "'";
  std::set<std::string> used;
  std::vector<std::vector<const directory::tensor*>> out;
  for (const mapping& m : table) {
    const auto [rows, cols] = shape_of(m.tessera);
    std::int64_t stacked = 0;
    std::vector<const directory::tensor*> src;
    for (const std::string& name : m.hf) {
      const directory::tensor* t = dir.find(name);
      std::string found = name;
      if (!t && name.rfind(prefix, 0) == 0) t = dir.find(found = name.substr(prefix.size()));
      TESSERA_CHECK(t, where, ": no tensor '", name, "' (", m.tessera, " needs it)");
      const auto& e = t->entry;
      TESSERA_CHECK(e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F16", where, ": tensor '", found, "' is ", e.dtype,
                    "; this bridge reads F32, BF16 and F16");
      const std::int64_t r = m.transpose ? (e.shape.size() == 2 ? e.shape[1] : -1) : (e.shape.empty() ? -1 : e.shape[0]);
      const std::int64_t c = m.transpose ? e.shape[0] : (e.shape.size() == 2 ? e.shape[1] : 1);
      TESSERA_CHECK(r >= 0 && e.shape.size() <= 2 && c == cols, where, ": tensor '", found, "' has shape ",
                    nlohmann::json(e.shape).dump(), "; ", m.tessera, " takes rows of ", cols,
                    m.transpose ? " (transposed)" : "");
      stacked += r;
      used.insert(found);
      src.push_back(t);
    }
    TESSERA_CHECK(stacked == rows || (m.pad_rows && stacked <= rows && stacked > 0), where, ": ", m.tessera, " has ", rows,
                  " rows; its Hugging Face tensors hold ", stacked, " (a configuration that does not match its weights)");
    out.push_back(std::move(src));
  }
  for (const std::string& name : dir.names()) {
    if (used.count(name)) continue;
    bool known = false;
    for (const std::string& pattern : ignored) {  // "{i}" matches a block index
      const auto at = pattern.find("{i}");
      if (at == std::string::npos) {
        known = known || name == pattern || name == pattern.substr(std::min(pattern.size(), prefix.size()));
        continue;
      }
      for (const std::string& p : {pattern, pattern.rfind(prefix, 0) == 0 ? pattern.substr(prefix.size()) : pattern}) {
        const std::string head = p.substr(0, p.find("{i}")), tail = p.substr(p.find("{i}") + 3);
        if (name.size() > head.size() + tail.size() && name.rfind(head, 0) == 0 &&
            name.compare(name.size() - tail.size(), tail.size(), tail) == 0)
          known = true;
      }
    }
    TESSERA_CHECK(known, where, ": tensor '", tessera::checkpoint::printable(name), "' is not part of this model (a bias, an "
                  "expert or another architecture's weight: refused rather than trained without it)");
  }
  return out;
}

//! Rows [row0, row0 + rows) of a table row's tensor (its Hugging Face tensors
//! stacked, transposed, padded) into out (rows x cols floats): only the bytes
//! of those rows are read.
inline void read_rows(const directory& dir, const mapping& m, const std::vector<const directory::tensor*>& src,
                      std::int64_t row0, std::int64_t rows, std::int64_t cols, float* out) {
  std::fill_n(out, std::size_t(rows * cols), 0.0f);  // padded rows stay zero
  if (m.transpose) {  // one source [cols, R]: our row r is its column r
    const auto& e = src[0]->entry;
    const std::int64_t R = e.shape[1], hi = std::min(row0 + rows, R);
    if (hi <= row0) return;
    std::vector<float> line(std::size_t(hi - row0));
    for (std::int64_t c = 0; c < cols; ++c) {
      dir.read(*src[0], std::uint64_t(c * R + row0), std::uint64_t(hi - row0), line.data());
      for (std::int64_t r = row0; r < hi; ++r) out[(r - row0) * cols + c] = line[std::size_t(r - row0)];
    }
    return;
  }
  std::int64_t base = 0;  // the first stacked row of the source
  for (const directory::tensor* t : src) {
    const std::int64_t n = t->entry.shape.empty() ? 1 : t->entry.shape[0];
    const std::int64_t lo = std::max(row0, base), hi = std::min(row0 + rows, base + n);
    if (lo < hi)
      dir.read(*t, std::uint64_t((lo - base) * cols), std::uint64_t((hi - lo) * cols), out + (lo - row0) * cols);
    base += n;
  }
}

//! Loads every parameter of the wrapper behind `view` (a shard_view) from the
//! directory: each rank reads the rows its shard holds of each tensor, every
//! rank learns of any rank's failure before any weight changes, then the main
//! weights are written and the compute weights published. `table` is the
//! model's, expanded; `prefix` the base model's name prefix the files may
//! omit. Collective.
template <class View>
void load(View view, const directory& dir, const std::vector<mapping>& table, const std::vector<std::string>& ignored,
          const std::string& prefix) {
  using M = typename View::main_type;
  static_assert(std::is_same_v<M, float>, "the bridge writes fp32 main weights");
  // Every tensor of the model by name, its table row, and its [rows, cols].
  std::map<std::string, std::pair<std::size_t, std::size_t>> param;  // name -> (unit, tensor)
  for (std::size_t u = 0; u < view.num_units(); ++u) {
    const auto& L = view.layout(u);
    for (std::size_t t = 0; t < L.tensors().size(); ++t) param[L.name() + "." + L.tensors()[t].spec.name] = {u, t};
  }
  auto dims = [&](const std::string& name) -> std::pair<std::int64_t, std::int64_t> {
    const auto it = param.find(name);
    TESSERA_CHECK(it != param.end(), "the conversion table names '", name, "', which this model does not have");
    const auto e = view.layout(it->second.first).tensors()[it->second.second].spec.shape.extents();
    return {e.empty() ? 1 : e[0], e.size() > 1 ? e[1] : 1};
  };
  std::exception_ptr err;
  std::vector<std::vector<float>> staged(view.num_units());
  try {
    TESSERA_CHECK(table.size() == param.size(), "the conversion table has ", table.size(), " tensors; the model ",
                  param.size());
    const auto sources = check(dir, table, ignored, prefix, dims);
    for (std::size_t u = 0; u < view.num_units(); ++u) staged[u].assign(view.opt_range(u).second, 0.0f);
    for (std::size_t i = 0; i < table.size(); ++i) {
      const auto [u, t] = param.at(table[i].tessera);
      const auto [rows, cols] = dims(table[i].tessera);
      const auto q = view.range_piece(u, t);  // tensor elements [tensor_begin, +count) at shard_begin
      if (q.count == 0) continue;
      const std::int64_t r0 = std::int64_t(q.tensor_begin) / cols, r1 = (std::int64_t(q.tensor_begin + q.count) + cols - 1) / cols;
      std::vector<float> rowsbuf(std::size_t((r1 - r0) * cols));
      read_rows(dir, table[i], sources[i], r0, r1 - r0, cols, rowsbuf.data());
      std::copy_n(rowsbuf.data() + (std::int64_t(q.tensor_begin) - r0 * cols), q.count, staged[u].data() + q.shard_begin);
    }
  } catch (...) {
    err = std::current_exception();
  }
  view.agree_or_throw(err, "--init-from");
  for (std::size_t u = 0; u < view.num_units(); ++u)
    tessera::backend_ops<typename View::backend_type>::copy_from_host(view.main_weights(u),
                                                                      std::span<const float>(staged[u]));
  view.publish_weights(false);
}

}  // namespace trainer_kit::hf
