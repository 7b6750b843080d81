#pragma once
// Training data as llm.c and nanoGPT store it, and the sequences drawn from
// it, for every token language model trainer (tessera-gpt, tessera-llama).
//
// A token shard is a 256 x int32 header (magic, version, the token count, the
// rest unused) followed by exactly that many tokens: llm.c's GPT-2 shards
// (magic 20240520, version 1, uint16 tokens) and its Llama 3 shards (magic
// 20240801, version 7, uint32 tokens). --data takes one file or a glob of
// shards; with --text (or without --data) plain text files are read as bytes
// (vocabulary 256), by default the English prose of Debian's fortunes package
// that scripts/setup installs.
//
// Files are opened as checkpoints are: a path that is not a regular file (a
// directory, a FIFO that would block, a device) is refused before it is
// opened, and a shard whose size is not its header's count to the byte (a
// header that lies, a trailing byte) is refused before anything is allocated.
//
// Sequences: sequence g of step s starts at a window chosen by hash(seed, s,
// g) among every window of every file (with replacement, as nanoGPT's sampler
// draws them), so a sequence depends on (seed, step, g) alone. Rank r's j-th
// sequence of micro-batch k is g = (k x ranks + r) x batch + j: the global
// batch holds the same sequences whatever the world size (--batch 6 on one
// rank and --batch 2 on three train on the same data).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/hash.hpp"
#include "trainer_kit/paths.hpp"

namespace trainer_kit {

//! The two shard formats llm.c writes.
struct shard_format {
  std::int32_t magic, version;
  std::size_t token_bytes;
  const char* model;
};
inline constexpr shard_format gpt2_shards{20240520, 1, 2, "GPT-2"}, llama3_shards{20240801, 7, 4, "Llama 3"};
inline constexpr std::size_t shard_header_bytes = 256 * sizeof(std::int32_t);

//! One file's tokens and where they came from.
template <class Token>
struct token_file {
  std::string path;
  std::vector<Token> tokens;
};

//! The size of the regular file `path`, or a tessera error naming `flag`
//! where it is not one (checked before it is opened: a FIFO would block).
inline std::uint64_t regular_file_size(const std::string& path, std::string_view flag) {
  struct stat st {};
  TESSERA_CHECK(::stat(path.c_str(), &st) == 0, flag, " '", path, "': ", std::strerror(errno));
  TESSERA_CHECK(S_ISREG(st.st_mode), flag, " '", path, "' is not a regular file (",
                S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket", ")");
  return std::uint64_t(st.st_size);
}

//! Reads one llm.c token shard (either format); a damaged or foreign file is
//! one tessera error naming it: bad magic or version, a size that is not its
//! header's count, a token past `vocab`.
template <class Token>
token_file<Token> read_shard(const std::string& path, int vocab, std::string_view flag = "--data") {
  const std::uint64_t size = regular_file_size(path, flag);
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK(f.good(), "cannot open the token shard '", path, "'");
  std::int32_t h[256] = {};
  f.read(reinterpret_cast<char*>(h), sizeof h);
  TESSERA_CHECK(std::size_t(f.gcount()) == sizeof h, "'", path, "' is shorter than a token shard's 1024-byte header");
  const shard_format* fmt = h[0] == gpt2_shards.magic ? &gpt2_shards : h[0] == llama3_shards.magic ? &llama3_shards : nullptr;
  TESSERA_CHECK(fmt, "'", path, "' is not a token shard: magic ", h[0], ", expected ", gpt2_shards.magic, " (GPT-2) or ",
                llama3_shards.magic, " (Llama 3) (llm.c's formats; tools/text_to_shard.py makes one from text)");
  TESSERA_CHECK(h[1] == fmt->version, "'", path, "': ", fmt->model, " token shard version ", h[1],
                ", this reader knows version ", fmt->version);
  TESSERA_CHECK(h[2] >= 0, "'", path, "': negative token count ", h[2]);
  const std::uint64_t want = shard_header_bytes + std::uint64_t(h[2]) * fmt->token_bytes;
  TESSERA_CHECK(size == want, "'", path, "' holds ", size - shard_header_bytes, " bytes of tokens; its header promises ",
                h[2], " ", fmt->token_bytes * 8, "-bit tokens (", want - shard_header_bytes, " bytes)");
  token_file<Token> t{path, std::vector<Token>(std::size_t(h[2]))};
  const auto read = [&](void* into, std::size_t bytes) {
    f.read(static_cast<char*>(into), std::streamsize(bytes));
    TESSERA_CHECK(std::size_t(f.gcount()) == bytes, "'", path, "' could not be read to its end");
  };
  const auto bad_token = [&](std::uint64_t v, std::size_t i) {
    return tessera::error("'" + path + "': token " + std::to_string(v) + " at position " + std::to_string(i) +
                          " is not below the vocabulary size " + std::to_string(vocab) + " (--vocab)");
  };
  // Tokens of the shard's width W into Token (a GPT-2 shard for 32-bit tokens, or the reverse where they fit).
  const auto widen = [&]<class W>(W) {
    if constexpr (sizeof(W) == sizeof(Token)) {
      read(t.tokens.data(), t.tokens.size() * sizeof(Token));
    } else {
      std::vector<W> raw(t.tokens.size());
      read(raw.data(), raw.size() * sizeof(W));
      for (std::size_t i = 0; i < raw.size(); ++i) {
        if (std::uint64_t(raw[i]) >= std::uint64_t(vocab)) throw bad_token(raw[i], i);
        t.tokens[i] = Token(raw[i]);
      }
    }
  };
  if (fmt->token_bytes == 2) widen(std::uint16_t{});
  else widen(std::uint32_t{});
  for (std::size_t i = 0; i < t.tokens.size(); ++i)
    if (std::uint64_t(t.tokens[i]) >= std::uint64_t(vocab)) throw bad_token(t.tokens[i], i);
  return t;
}

//! Writes tokens as an llm.c shard of format `fmt` (tools, tests).
template <class Token>
void write_shard(const std::string& path, const std::vector<Token>& tokens, const shard_format& fmt = gpt2_shards) {
  std::int32_t h[256] = {};
  h[0] = fmt.magic, h[1] = fmt.version, h[2] = std::int32_t(tokens.size());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(h), sizeof h);
  for (const Token t : tokens) {
    const std::uint32_t v = t;
    f.write(reinterpret_cast<const char*>(&v), std::streamsize(fmt.token_bytes));  // little-endian hosts
  }
  TESSERA_CHECK(f.good(), "cannot write '", path, "'");
}

//! The paths a --data argument names: the file itself, or a glob's matches in
//! order (`flag`: the option that named them, for the message).
inline std::vector<std::string> expand(const std::string& spec, std::string_view flag = "--data") {
  const std::vector<std::string> out = matching_paths(spec);
  TESSERA_CHECK(!out.empty(), flag, " ", spec, ": no such file, and no file matches it as a glob");
  return out;
}

//! A text file's bytes as tokens (vocabulary 256).
template <class Token>
token_file<Token> read_text(const std::string& path, std::string_view flag = "--data") {
  const std::uint64_t size = regular_file_size(path, flag);
  std::ifstream f(path, std::ios::binary);
  TESSERA_CHECK(f.good(), "cannot open the text file '", path, "'");
  std::string s(size, '\0');
  f.read(s.data(), std::streamsize(size));
  s.resize(std::size_t(f.gcount()));
  token_file<Token> t{path, std::vector<Token>(s.size())};
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
template <class Token>
void split_sequences(const Token* seqs, std::size_t B, std::size_t T, Token* inputs, Token* targets) {
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) {
      inputs[b * T + t] = seqs[b * (T + 1) + t];
      targets[b * T + t] = seqs[b * (T + 1) + t + 1];
    }
}

//! Every file of a run's data, and its sequences (see the file comment).
template <class Token>
class corpus {
public:
  //! `spec`: --data (a shard, a glob of shards, or "" for the default text);
  //! `text`: read the files as bytes instead of shards. Checks every token
  //! against `vocab` and that a sequence of `seq` + 1 tokens fits somewhere.
  //! `flag`: the option that named the files (--data, --val-data), for the messages.
  corpus(const std::string& spec, bool text, int vocab, int seq, std::string_view flag = "--data")
      : seq_(std::size_t(seq)) {
    TESSERA_CHECK(vocab <= 1 + int(std::numeric_limits<Token>::max()) || sizeof(Token) >= 4, "a vocabulary of ", vocab,
                  " in ", 8 * sizeof(Token), "-bit tokens");
    const std::vector<std::string> paths = spec.empty() ? default_text_files() : expand(spec, flag);
    for (const auto& p : paths) {
      token_file<Token> f = text || spec.empty() ? read_text<Token>(p, flag) : read_shard<Token>(p, vocab, flag);
      if (text || spec.empty())
        for (std::size_t i = 0; i < f.tokens.size(); ++i)
          TESSERA_CHECK(f.tokens[i] < Token(vocab), "'", p, "': token ", f.tokens[i], " at position ", i,
                        " is not below the vocabulary size ", vocab, " (--vocab)");
      if (f.tokens.size() > seq_) {
        windows_ += f.tokens.size() - seq_;
        ends_.push_back(windows_);
        tokens_ += f.tokens.size();
        files_.push_back(std::move(f));
      }
    }
    TESSERA_CHECK(windows_ > 0, flag, " ", spec.empty() ? std::string("(the default text)") : spec, ": no file holds ",
                  seq + 1, " tokens (--seq ", seq, " + 1)");
  }
  [[nodiscard]] std::size_t files() const noexcept { return files_.size(); }
  //! What the files hold, as one number: every file's token count and up to
  //! 3 x 4096 tokens of it (its start, middle and end). Ranks that agree on
  //! --data's text can still read other files (the same relative path from
  //! other working directories, a copy per node that differs): the ranks
  //! compare this (agree_on_data) instead of trusting the names.
  [[nodiscard]] std::uint64_t digest() const {
    std::uint64_t h = tessera::splitmix64(files_.size());
    for (const auto& f : files_) {
      const std::size_t n = f.tokens.size(), w = std::min<std::size_t>(n, 4096);
      h = tessera::splitmix64(h ^ n);
      for (const std::size_t at : {std::size_t(0), (n - w) / 2, n - w})
        for (std::size_t i = at; i < at + w; ++i) h = tessera::splitmix64(h ^ std::uint64_t(f.tokens[i]));
    }
    return h;
  }
  [[nodiscard]] std::size_t tokens() const noexcept { return tokens_; }
  //! Windows of seq + 1 tokens in all: what a validation pass over the data can hold.
  [[nodiscard]] std::uint64_t windows() const noexcept { return windows_; }

  //! The seq + 1 tokens of global sequence g of step `step` into out.
  void sequence(std::uint64_t seed, long step, std::uint64_t g, Token* out) const {
    using tessera::splitmix64;
    const std::uint64_t h = splitmix64(splitmix64(splitmix64(seed ^ 0x243f6a8885a308d3ull) + std::uint64_t(step)) ^ g);
    window(h % windows_, out);
  }
  //! Sequence i of the fixed evaluation set: consecutive windows from the
  //! start of the data, seq tokens apart, wrapping around.
  void eval_sequence(std::uint64_t i, Token* out) const { window((i * seq_) % windows_, out); }

private:
  void window(std::uint64_t w, Token* out) const {
    const std::size_t f = std::size_t(std::upper_bound(ends_.begin(), ends_.end(), w) - ends_.begin());
    const std::uint64_t start = w - (f == 0 ? 0 : ends_[f - 1]);
    std::copy_n(files_[f].tokens.begin() + std::ptrdiff_t(start), seq_ + 1, out);
  }
  std::size_t seq_;
  std::vector<token_file<Token>> files_;
  std::vector<std::uint64_t> ends_;  // cumulative window counts
  std::uint64_t windows_ = 0;
  std::size_t tokens_ = 0;
};

}  // namespace trainer_kit
