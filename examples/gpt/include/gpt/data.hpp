#pragma once
// Training data as llm.c and nanoGPT store it, and the batches drawn from it.
//
// A token shard is a 256 x int32 header (magic 20240520, version 1, the
// token count, the rest unused) followed by that many uint16 tokens. --data
// takes one file or a glob of shards; without it the trainer reads plain text
// files as bytes (vocabulary 256), by default the English prose of Debian's
// fortunes package that scripts/setup installs.
//
// Batches: every step draws a global batch of G = batch x ranks x accum
// sequences of seq + 1 tokens (inputs and the next-token targets). Sequence g
// of step s starts at a window chosen by hash(seed, s, g) among every window
// of every shard (with replacement, as nanoGPT's sampler draws them), so a
// sequence depends on (seed, step, g) alone. Rank r's j-th sequence of
// micro-batch k is g = (k x ranks + r) x batch + j: the global batch holds
// the same sequences whatever the world size (--batch 6 on one rank and
// --batch 2 on three train on the same data).
#include <glob.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/hash.hpp"

namespace gpt {

inline constexpr std::int32_t shard_magic = 20240520, shard_version = 1;
inline constexpr std::size_t shard_header_bytes = 256 * sizeof(std::int32_t);

//! One tokenised document stream: its tokens and where they came from.
struct token_file {
  std::string path;
  std::vector<std::uint16_t> tokens;
};

//! Reads one llm.c token shard; a damaged or foreign file is one tessera:
//! error naming it (bad magic or version, shorter than its header says).
inline token_file read_shard(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK(f.good(), "cannot open the token shard '", path, "'");
  std::int32_t h[256] = {};
  f.read(reinterpret_cast<char*>(h), sizeof h);
  TESSERA_CHECK(std::size_t(f.gcount()) == sizeof h, "'", path, "' is shorter than a token shard's 1024-byte header");
  TESSERA_CHECK(h[0] == shard_magic, "'", path, "' is not a token shard: magic ", h[0], ", expected ", shard_magic,
                " (llm.c / nanoGPT format; tessera-text-to-shard makes one from text)");
  TESSERA_CHECK(h[1] == shard_version, "'", path, "': token shard version ", h[1], ", this reader knows version ",
                shard_version);
  TESSERA_CHECK(h[2] >= 0, "'", path, "': negative token count ", h[2]);
  token_file t{path, std::vector<std::uint16_t>(std::size_t(h[2]))};
  f.read(reinterpret_cast<char*>(t.tokens.data()), std::streamsize(t.tokens.size() * 2));
  TESSERA_CHECK(std::size_t(f.gcount()) == t.tokens.size() * 2, "'", path, "' is shorter than its header says: ",
                h[2], " tokens promised, ", f.gcount() / 2, " present");
  return t;
}

//! Writes tokens as an llm.c shard (tessera-text-to-shard, tests).
inline void write_shard(const std::string& path, const std::vector<std::uint16_t>& tokens) {
  std::int32_t h[256] = {};
  h[0] = shard_magic, h[1] = shard_version, h[2] = std::int32_t(tokens.size());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(h), sizeof h);
  f.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
  TESSERA_CHECK(f.good(), "cannot write '", path, "'");
}

//! The paths a --data argument names: the file itself, or a glob's matches in
//! order (`flag`: the option that named them, for the message).
inline std::vector<std::string> expand(const std::string& spec, std::string_view flag = "--data") {
  if (std::filesystem::exists(spec)) return {spec};
  glob_t g{};
  std::vector<std::string> out;
  if (::glob(spec.c_str(), 0, nullptr, &g) == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  TESSERA_CHECK(!out.empty(), flag, " ", spec, ": no such file, and no file matches it as a glob");
  return out;
}

//! A text file's bytes as tokens (vocabulary 256).
inline token_file read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK(f.good(), "cannot open the text file '", path, "'");
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  token_file t{path, std::vector<std::uint16_t>(s.size())};
  for (std::size_t i = 0; i < s.size(); ++i) t.tokens[i] = static_cast<unsigned char>(s[i]);
  return t;
}

//! Where the default text lives (Debian's fortunes package): its plain-text
//! files (no .dat index, no offensive ones), in name order.
inline std::vector<std::string> default_text_files() {
  std::vector<std::string> out;
  const std::filesystem::path dir = "/usr/share/games/fortunes";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file() && !e.path().has_extension()) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  TESSERA_CHECK(!out.empty(), "no --data given and no text in ", dir.string(),
                " (scripts/setup installs Debian's fortunes package; or pass --data FILE|GLOB)");
  return out;
}

//! B sequences of T + 1 tokens as the nets take them: inputs[b T + t] and
//! the next-token targets[b T + t].
inline void split_sequences(const std::uint16_t* seqs, std::size_t B, std::size_t T, std::uint16_t* inputs,
                            std::uint16_t* targets) {
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) {
      inputs[b * T + t] = seqs[b * (T + 1) + t];
      targets[b * T + t] = seqs[b * (T + 1) + t + 1];
    }
}

//! Every file of a run's data, and its batches (see the file comment).
class corpus {
public:
  //! `spec`: --data (a shard, a glob of shards, or "" for the default text);
  //! `text`: read the files as bytes instead of shards. Checks every token
  //! against `vocab` and that a sequence of `seq` + 1 tokens fits somewhere.
  //! `flag`: the option that named the files (--data, --val-data), for the messages.
  corpus(const std::string& spec, bool text, int vocab, int seq, std::string_view flag = "--data")
      : seq_(std::size_t(seq)) {
    const std::vector<std::string> paths = spec.empty() ? default_text_files() : expand(spec, flag);
    for (const auto& p : paths) {
      token_file f = text || spec.empty() ? read_text(p) : read_shard(p);
      for (std::size_t i = 0; i < f.tokens.size(); ++i)
        TESSERA_CHECK(f.tokens[i] < vocab, "'", p, "': token ", f.tokens[i], " at position ", i,
                      " is not below the vocabulary size ", vocab, " (--vocab)");
      if (f.tokens.size() > seq_) {
        windows_ += f.tokens.size() - seq_;
        ends_.push_back(windows_);
        bytes_ += f.tokens.size();
        files_.push_back(std::move(f));
      }
    }
    TESSERA_CHECK(windows_ > 0, flag, " ", spec.empty() ? std::string("(the default text)") : spec, ": no file holds ",
                  seq + 1, " tokens (--seq ", seq, " + 1)");
  }
  [[nodiscard]] std::size_t files() const noexcept { return files_.size(); }
  [[nodiscard]] std::size_t tokens() const noexcept { return bytes_; }

  //! The seq + 1 tokens of global sequence g of step `step` into out.
  void sequence(std::uint64_t seed, long step, std::uint64_t g, std::uint16_t* out) const {
    using tessera::splitmix64;
    const std::uint64_t h = splitmix64(splitmix64(splitmix64(seed ^ 0x243f6a8885a308d3ull) + std::uint64_t(step)) ^ g);
    window(h % windows_, out);
  }
  //! Sequence i of the fixed evaluation set: consecutive windows from the
  //! start of the data, seq tokens apart, wrapping around.
  void eval_sequence(std::uint64_t i, std::uint16_t* out) const { window((i * seq_) % windows_, out); }

private:
  void window(std::uint64_t w, std::uint16_t* out) const {
    const std::size_t f = std::size_t(std::upper_bound(ends_.begin(), ends_.end(), w) - ends_.begin());
    const std::uint64_t start = w - (f == 0 ? 0 : ends_[f - 1]);
    std::copy_n(files_[f].tokens.begin() + std::ptrdiff_t(start), seq_ + 1, out);
  }
  std::size_t seq_;
  std::vector<token_file> files_;
  std::vector<std::uint64_t> ends_;  // cumulative window counts
  std::uint64_t windows_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace gpt
