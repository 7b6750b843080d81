#pragma once
// What every token-sequence language model brings to the loop
// (trainer_kit/loop.hpp) besides its layers: its flags (--batch, --text,
// validation, sampling), its data (trainer_kit/tokens.hpp), the data stream's
// place in a checkpoint, the micro-batches of whole sequences, the fixed
// validation set and sampling. tessera-gpt and tessera-llama derive their
// hooks from sequence_lm and add their model: registration, initialisation,
// the net, the banner.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/comm/mpi.hpp"
#include "tessera/core/random.hpp"
#include "trainer_kit/cli.hpp"
#include "trainer_kit/resume.hpp"
#include "trainer_kit/run_options.hpp"
#include "trainer_kit/tokens.hpp"

namespace trainer_kit {

//! A sequence model's flags beyond the run's: sequences per micro-batch, the
//! data as text, the fixed validation set, sampling.
struct sequence_options {
  int batch = 4, val_every = 0, val_batches = 4, sample = 0;
  std::string val_data;
  bool text = false;
};
inline void add_sequence_options(CLI::App& app, sequence_options& o) {
  app.add_option("--batch", o.batch, "sequences per micro-batch per rank")->check(CLI::Range(1, 1 << 20));
  app.add_flag("--text", o.text, "--data and --val-data are plain text files, tokenised as bytes (--vocab 256)");
  app.add_option("--val-data", o.val_data, "validation shards (a file or a glob; text with --text)")
      ->check([](const std::string& v) { return v.empty() ? std::string("--val-data needs a path") : std::string(); });
  app.add_option("--val-every", o.val_every, "evaluate on --val-data every N steps (and after the last)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--val-batches", o.val_batches, "global batches of the fixed validation set")->check(CLI::Range(1, 1 << 20));
  app.add_option("--sample", o.sample, "after training, generate N tokens from the data's first tokens and print them")
      ->check(CLI::Range(0, 1 << 16));
}
//! What is wrong with them for a model of `vocab` tokens ("" when nothing).
inline std::string sequence_options_error(const run_options& r, const sequence_options& o, int vocab) {
  if ((o.text || r.data.empty()) && vocab < 256)
    return "byte-level text needs --vocab 256 or more (it is " + std::to_string(vocab) + ")";
  if (o.val_every > 0 && o.val_data.empty()) return "--val-every needs --val-data";
  return {};
}
inline void describe_sequence_options(option_lines& put, const sequence_options& o) {
  put("batch", o.batch), put("text", o.text), put("val-data", o.val_data), put("val-every", o.val_every);
  put("val-batches", o.val_batches), put("sample", o.sample);
}

//! A run's training data and its validation data, read before MPI starts so
//! that a bad file is one message and exit 2 on every rank.
template <class Token>
struct datasets {
  corpus<Token> train;
  std::optional<corpus<Token>> val;
  //! --data (and --val-data) as the options name them.
  datasets(const run_options& r, const sequence_options& o, int vocab, int seq)
      : train(r.data, o.text, vocab, seq),
        val(o.val_data.empty() ? std::nullopt : std::optional<corpus<Token>>(std::in_place, o.val_data, o.text, vocab,
                                                                                seq, "--val-data")) {}
  //! What each option's files hold (corpus::digest), for agree_on_data.
  [[nodiscard]] std::vector<data_digest> digests() const {
    std::vector<data_digest> d{{"--data", train.digest()}};
    if (val) d.push_back({"--val-data", val->digest()});
    return d;
  }
};

//! The loop's hooks that depend only on sequences of `seq` + 1 tokens drawn
//! from `sets` (see trainer_kit/loop.hpp for the whole list); a model derives
//! from it and adds its own.
template <class Token>
class sequence_lm {
public:
  //! Every sequence model's wrapper: three gather buffers, the embed unit
  //! (held for a whole micro-batch: lookup, head, embedding backward) and two
  //! for the blocks, so the next block's gather overlaps this one's compute.
  //! tessera-plan counts the same (tools/plan/sequence.hpp).
  static constexpr tessera::wrapper_options wrapper_defaults{.gather_buffers = 3};
  [[nodiscard]] tessera::wrapper_options wrapper_options() const { return wrapper_defaults; }
  using batch = std::vector<Token>;  // a micro-batch's sequences of seq + 1 tokens
  sequence_lm(const char* program, const run_options& r, const sequence_options& o, int seq, int vocab,
              const datasets<Token>& sets)
      : program_(program), r_(r), o_(o), seq_(seq), vocab_(vocab), sets_(sets) {}
  [[nodiscard]] const run_options& run() const { return r_; }

  // --deterministic: --accum global micro-batches, rank r running r, r + N, ...
  void on_world(int rank, int N) {
    TESSERA_CHECK(!r_.deterministic || r_.accum % N == 0, "--deterministic: ", r_.accum, " micro-batches (--accum) "
                  "do not split evenly over ", N, " ranks; choose a world size that divides ", r_.accum);
    rank_ = rank, N_ = N, count_ = r_.deterministic ? r_.accum / N : r_.accum;
    // The fixed validation set reads the file from its start, sequences seq
    // tokens apart: past the file's end it repeats itself, measuring nothing
    // new at any cost (1048576 batches of a 40 kB file ran for hours).
    if (sets_.val) {
      const std::uint64_t want = std::uint64_t(validation_micro_batches()) * std::uint64_t(N) * std::uint64_t(o_.batch);
      const std::uint64_t holds = (sets_.val->windows() + std::uint64_t(seq_) - 1) / std::uint64_t(seq_);
      TESSERA_CHECK(want <= holds, "--val-batches ", o_.val_batches, " asks for ", want, " validation sequences of ",
                    seq_, " tokens (", r_.deterministic ? "the global batch" : "--batch x ranks", " per batch); --val-data "
                    "holds ", holds, " before it repeats: give --val-batches ", std::max<std::uint64_t>(1, o_.val_batches * holds / want),
                    " or less, or more validation data");
    }
  }

  [[nodiscard]] nlohmann::json position(int N, int count) const {
    nlohmann::json x{{"global_sequences", (long long)o_.batch * N * count}, {"seq", seq_}};
    if (r_.deterministic) x["deterministic_batch"] = o_.batch;
    return x;
  }
  //! The checkpoint's data stream is this run's: the same global batch and
  //! sequence length, and deterministic (of the same micro-batch) or not.
  void check_resume(const nlohmann::json& x, const std::string& path, int N, int count) const {
    const long long mine = (long long)o_.batch * N * count;
    const long long global = resume_field(x, path, "global_sequences", 1, 1LL << 40, program_),
                    seq = resume_field(x, path, "seq", 1, 1 << 20, program_);
    if (global != mine || seq != seq_)
      throw tessera::error("checkpoint '" + path + "' was trained on global batches of " + std::to_string(global) +
                           " sequences of " + std::to_string(seq) + " tokens; this run has " + std::to_string(mine) +
                           " of " + std::to_string(seq_) + " (--batch x ranks x --accum, --seq): resume with the same "
                           "to continue its data stream");
    // A deterministic run's bits depend on its micro-batch; it continues only
    // deterministically, from a deterministic checkpoint of the same micro-batch.
    const long long micro = x.contains("deterministic_batch") && x["deterministic_batch"].is_number_integer()
                                ? x["deterministic_batch"].get<long long>() : 0;
    if (micro != (r_.deterministic ? o_.batch : 0))
      throw tessera::error("checkpoint '" + path + "' was written " +
                           (micro ? "with --deterministic --batch " + std::to_string(micro)
                                  : std::string("without --deterministic")) +
                           "; resume it the same way (a run is deterministic from its first step or not at all)");
  }

  [[nodiscard]] double tokens_per_step(int N, int count) const { return double(o_.batch) * N * count * seq_; }
  [[nodiscard]] batch make_batch() const { return batch(std::size_t(o_.batch) * row()); }
  //! Rank r's sequences of its micro-batch mb: global indices (mb N + r) batch + j
  //! (under --deterministic global micro-batch mb N + r holds the same sequences at any N).
  void sample(batch& b, std::uint64_t seed, long step, int mb) const {
    for (int j = 0; j < o_.batch; ++j)
      sets_.train.sequence(seed, step, std::uint64_t((long(mb) * N_ + rank_) * o_.batch + j),
                           b.data() + std::size_t(j) * row());
  }
  template <class Net> void forward_backward(Net& net, const batch& b, double tokens) {
    net.forward_backward(b.data(), o_.batch, tokens);
  }
  template <class Net> void stage(Net& net, int slot, const batch& b) { net.stage(slot, b.data(), o_.batch); }
  template <class Net> void forward_backward_slots(Net& net, int count, double tokens) {
    net.forward_backward_slots(count, o_.batch, tokens);
  }

  //! The model's inputs beyond the run's (trainer_kit::input_paths): --val-data's files.
  [[nodiscard]] std::vector<input_path> input_paths() const {
    std::vector<input_path> in;
    for (const auto& p : matching_paths(o_.val_data)) in.push_back({"--val-data", p});
    return in;
  }
  [[nodiscard]] bool validation_due(long step, bool last) const {
    return sets_.val && ((o_.val_every > 0 && (step + 1) % o_.val_every == 0) || last);
  }
  //! The mean loss over the fixed validation set: --val-batches global batches
  //! (--deterministic: of this run's global batch; else of N x --batch
  //! sequences), each rank its micro-batches k N + r, summed in k's order
  //! under --deterministic (a sum over ranks would group by N).
  template <class Net> double evaluate(Net& net, tessera::comm::mpi& world) {
    const int count = validation_micro_batches();
    std::vector<double> per(r_.deterministic ? std::size_t(count) * N_ : 0);
    batch seqs = make_batch();
    double loss = 0;
    for (int k = 0; k < count; ++k) {
      for (int j = 0; j < o_.batch; ++j)
        sets_.val->eval_sequence(std::uint64_t((long(k) * N_ + rank_) * o_.batch + j), seqs.data() + std::size_t(j) * row());
      const double l = net.forward_loss(seqs.data(), o_.batch);
      if (r_.deterministic) per[std::size_t(k) * N_ + rank_] = l;
      else loss += l;
    }
    if (r_.deterministic) {
      tessera::comm::all_reduce(world, std::span<double>(per), tessera::comm::reduce_op::sum);
      for (double v : per) loss += v;
    } else {
      tessera::comm::all_reduce(world, std::span<double>(&loss, 1), tessera::comm::reduce_op::sum);
    }
    return loss / (double(count) * N_ * o_.batch * seq_);
  }

  //! --sample: every rank runs the same forwards (gathers are collective) and
  //! draws the same tokens, a counter-based draw from the softmax keyed by the
  //! seed; rank 0 prints them (as text where the vocabulary is bytes).
  template <class Net> void after(Net& net, tessera::comm::mpi& world, std::uint64_t seed) {
    if (o_.sample == 0) return;
    std::vector<Token> ctx(row());
    (sets_.val ? *sets_.val : sets_.train).eval_sequence(0, ctx.data());
    std::vector<Token> text(ctx.begin(), ctx.begin() + std::min<std::ptrdiff_t>(16, seq_));
    const std::size_t prompt = text.size();
    for (int i = 0; i < o_.sample; ++i) {
      const std::size_t len = std::min<std::size_t>(text.size(), std::size_t(seq_));
      const std::vector<float> z = net.next_logits(text.data() + text.size() - len, int(len));
      const float mx = *std::max_element(z.begin(), z.end());
      double sum = 0;
      for (float v : z) sum += std::exp(double(v - mx));
      double u = tessera::unit_interval(tessera::counter_random(seed, tessera::key_of("sample"), std::uint64_t(i)).a) * sum;
      std::size_t t = 0;
      for (; t + 1 < z.size(); ++t)
        if ((u -= std::exp(double(z[t] - mx))) <= 0) break;
      text.push_back(Token(t));
    }
    if (world.rank() != 0) return;
    std::string out;
    for (std::size_t i = 0; i < text.size(); ++i) {
      if (i == prompt) out += "|>";
      if (vocab_ > 256) {
        out += (i ? " " : "") + std::to_string(text[i]);
      } else if ((text[i] >= 32 && text[i] < 127) || text[i] == '\n') {
        out += char(text[i]);
      } else {  // bytes that are not printable ASCII, escaped: the line stays text
        char esc[8];
        std::snprintf(esc, sizeof esc, "\\x%02x", unsigned(text[i]));
        out += esc;
      }
    }
    std::printf("sample (prompt|>generated): %s\n", out.c_str());
  }

protected:
  [[nodiscard]] std::size_t row() const { return std::size_t(seq_) + 1; }
  //! Micro-batches of --batch sequences each rank runs in a validation pass.
  [[nodiscard]] int validation_micro_batches() const { return r_.deterministic ? o_.val_batches * count_ : o_.val_batches; }
  //! "data F file(s) of T tokens", for a banner.
  [[nodiscard]] std::string data_words() const {
    return std::to_string(sets_.train.files()) + " file" + (sets_.train.files() == 1 ? "" : "s") + " of " +
           std::to_string(sets_.train.tokens()) + " tokens";
  }
  const char* program_;
  const run_options& r_;
  const sequence_options& o_;
  int seq_, vocab_;
  const datasets<Token>& sets_;
  int rank_ = 0, N_ = 1, count_ = 1;
};

}  // namespace trainer_kit
