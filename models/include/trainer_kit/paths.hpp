#pragma once
// The files a run names: what a --data path or glob matches, and whether an
// output would overwrite one of the run's inputs (the same file by another
// name, or a file inside an input directory such as --load's checkpoint).
#include <glob.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace trainer_kit {

//! The files a path or glob names (none for ""; the path itself where it exists).
inline std::vector<std::string> matching_paths(const std::string& spec) {
  std::vector<std::string> out;
  std::error_code ec;
  if (spec.empty()) return out;
  if (std::filesystem::exists(spec, ec)) return {spec};
  glob_t g{};
  if (::glob(spec.c_str(), 0, nullptr, &g) == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  return out;
}

//! What the files of one data option hold (a digest of their contents).
struct data_digest {
  std::string flag;
  std::uint64_t value = 0;
};

//! A file or directory the run reads, and the flag that named it.
struct input_path {
  std::string flag, path;
};

//! Whether writing `out` would replace `in` or a file inside it (where `in`
//! is a directory): the same file by any name (links, ./, ..), found by
//! device and inode where both exist, else by their absolute normal forms.
inline bool overwrites(const std::string& out, const std::string& in) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (in.empty()) return false;
  if (fs::exists(out, ec) && fs::exists(in, ec) && fs::equivalent(out, in, ec)) return true;
  const fs::path o = fs::weakly_canonical(fs::absolute(out, ec), ec), i = fs::weakly_canonical(fs::absolute(in, ec), ec);
  if (o == i) return true;
  if (!fs::is_directory(i, ec)) return false;
  const auto [end, _] = std::mismatch(i.begin(), i.end(), o.begin(), o.end());
  return end == i.end();
}

}  // namespace trainer_kit
