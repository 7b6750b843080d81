#pragma once
// Training bytes and the batch sampler. The global batch of a step is a
// function of (seed, step, micro-batch) alone, and each rank takes a
// contiguous slice of it, so every world size trains on the same tokens.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tessera/core/error.hpp"
#include "tessera/core/hash.hpp"

namespace mlp_lm {

inline std::uint64_t hash64(std::uint64_t x) { return tessera::splitmix64(x); }

//! Deterministic English-like text: sentences from a small grammar, so that a
//! byte model has structure to learn at every scale (spelling, spacing, word order).
inline std::string generate_text(std::size_t bytes, std::uint64_t seed) {
  static const char* subjects[] = {"the cat", "a dog", "the old man", "my sister", "the river", "a small bird",
                                   "the teacher", "our neighbour", "the machine", "every child"};
  static const char* verbs[] = {"sees", "likes", "follows", "finds", "carries", "watches", "paints", "remembers"};
  static const char* objects[] = {"the red ball", "a quiet house", "the long road", "an open window",
                                  "the green field", "a wooden box", "the bright moon", "some warm bread"};
  static const char* tails[] = {" today", " at night", " in the morning", " again", "", "", " slowly", " with care"};
  std::string s;
  s.reserve(bytes + 64);
  std::uint64_t h = seed * 0x2545f4914f6cdd1dull + 17;
  while (s.size() < bytes) {
    auto pick = [&](std::size_t n) { return std::size_t((h = hash64(h)) % n); };
    std::string sentence = std::string(subjects[pick(10)]) + " " + verbs[pick(8)] + " " + objects[pick(8)] +
                           tails[pick(8)] + (pick(4) == 0 ? "!" : ".");
    sentence[0] = char(sentence[0] - 'a' + 'A');
    s += sentence;
    s += pick(6) == 0 ? "\n" : " ";
  }
  s.resize(bytes);
  return s;
}

class corpus {
public:
  //! The bytes of `path`, or 1 MiB of generated text when path is empty.
  corpus(const std::string& path, std::uint64_t seed, int ctx) : ctx_(ctx) {
    if (path.empty()) {
      const std::string t = generate_text(1 << 20, seed);
      bytes_.assign(t.begin(), t.end());
    } else {
      // A directory or a FIFO would fail late with a raw stream message, or block.
      std::error_code ec;
      TESSERA_CHECK(std::filesystem::is_regular_file(path, ec), "--data '", path, "' is not a regular file");
      std::ifstream f(path, std::ios::binary);
      TESSERA_CHECK(f.good(), "cannot open --data file '", path, "'");
      bytes_.assign(std::istreambuf_iterator<char>(f), {});
    }
    TESSERA_CHECK(bytes_.size() > std::size_t(ctx) + 1, "--data file '", path, "' holds ", bytes_.size(),
                  " bytes; it needs more than --ctx + 1");
  }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_.size(); }

  //! Global token j of micro-batch mb of step s: fills ctx context bytes and returns the target.
  std::uint8_t sample(std::uint64_t seed, long step, int mb, long j, std::uint8_t* context) const {
    const std::uint64_t h = hash64(hash64(hash64(seed ^ 0x51ed270b27d4a3c5ull) + std::uint64_t(step)) * 31 +
                                   std::uint64_t(mb) * 1000003ull + std::uint64_t(j));
    const std::size_t pos = std::size_t(ctx_) + std::size_t(h % (bytes_.size() - std::size_t(ctx_)));
    for (int k = 0; k < ctx_; ++k) context[k] = bytes_[pos - std::size_t(ctx_) + std::size_t(k)];
    return bytes_[pos];
  }

private:
  int ctx_;
  std::vector<std::uint8_t> bytes_;
};

}  // namespace mlp_lm
