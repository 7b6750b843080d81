#pragma once
// tessera-gpt's hooks into the trainer kit's loop (trainer_kit/loop.hpp):
// GPT-2's registration and initialisation, its net (host or CUDA), what the
// net holds, its banner and summary. Sequences, validation, sampling and the
// data stream's checkpoint fields are every sequence model's
// (trainer_kit/sequence_lm.hpp); steps, checkpoints and logging the loop's.
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "gpt/data.hpp"
#include "gpt/hf.hpp"
#include "gpt/host_compute.hpp"
#include "gpt/model.hpp"
#include "options.hpp"
#include "tessera/tessera.hpp"
#include "trainer_kit/hf.hpp"
#include "trainer_kit/host_math.hpp"
#include "trainer_kit/loop.hpp"
#include "trainer_kit/sequence_lm.hpp"

namespace gpt {

using datasets = trainer_kit::datasets<token>;

//! GPT-2 as the loop trains it, Net<W> computing (host_gpt or cuda_gpt).
template <template <class> class Net>
class lm : public trainer_kit::sequence_lm<token> {
public:
  static constexpr const char* program = "tessera-gpt";
  template <class W> using net = Net<W>;

  lm(const options& o, const datasets& sets) : sequence_lm(program, o, o, o.shape.seq, o.shape.vocab, sets), o_(o) {}

  // Three gather buffers: the embed unit, held for the whole micro-batch, and
  // two for the blocks (one in use, one prefetching).
  template <class W> void build(W& w) { ids_ = register_model(w, o_.shape); }
  template <class W> void init(W& w, std::uint64_t seed) const { init_model(w, ids_, o_.shape, seed); }
  //! --init-from a Hugging Face directory: each rank reads its shard of every tensor.
  template <class View> void init_from_hf(View view, const std::filesystem::path& dir) const {
    const trainer_kit::hf::directory files(dir);
    trainer_kit::hf::load(view, files, hf_table(o_.shape), trainer_kit::hf::ignored_names(hf_table_json), "transformer.");
  }
  template <class W> Net<W> make_net(W& w, int input_slots) {
    nopt_ = {.recompute = o_.recompute, .attention = o_.attention, .deterministic = o_.deterministic,
             .input_slots = input_slots, .keep_gelu = o_.keep_gelu, .fp8 = trainer_kit::fp8_of(o_)};
    return Net<W>(w, ids_, o_.shape, o_.batch, nopt_);
  }
  template <class W> [[nodiscard]] std::size_t activation_bytes(const Net<W>& net, const W& w) const {
    const auto padded = [&](tessera::unit_id u) { return w.layout(u).padded_numel(); };
    return Net<W>::workspace_bytes(o_.shape, o_.batch, nopt_) + trainer_kit::widened_bytes<Net<W>>(ids_, padded) +
           net.runtime_workspace_bytes();
  }

  [[nodiscard]] nlohmann::json identity() const {
    return {{"layers", o_.shape.layers}, {"heads", o_.shape.heads}, {"d", o_.shape.d}, {"vocab", o_.shape.vocab},
            {"max_seq", o_.shape.positions()}};
  }
  [[nodiscard]] double flops_per_token() const { return o_.shape.flops_per_token(); }
  [[nodiscard]] std::size_t params() const { return o_.shape.params(); }

  template <class N, class W> void banner(const N& net, const W&, const trainer_kit::run_facts& f) const {
    const model_shape& s = o_.shape;
    std::printf("tessera-gpt: backend %s, %s / %s / %s%s, %d rank%s%s, %zu parameters (%d layers, %d heads, d %d, seq %d, "
                "vocab %d padded to %d), %.0f tokens per step, data %s, weights initialised in %.2f s, attention %s%s, "
                "estimated memory %s MiB on the busiest rank%s\n",
                N::backend_name, o_.wrapper.c_str(), o_.strategy.c_str(), o_.precision.c_str(),
                o_.deterministic ? " (deterministic)" : "", f.world, f.world == 1 ? "" : "s", f.mesh.c_str(), s.params(),
                s.layers, s.heads, s.d, s.seq, s.vocab, s.padded_vocab(), f.tokens_per_step, data_words().c_str(),
                f.init_s, std::string(net.attention_name()).c_str(),
                o_.keep_gelu && !o_.recompute ? ", GELU outputs kept for backward" : "",
                trainer_kit::mib(f.estimate.total()).c_str(), trainer_kit::offload_note(f.estimate, o_.offload_update).c_str());
  }
  template <class N> void summary(nlohmann::json& j, const N& net) const {
    j["attention_workspace_bytes"] = net.runtime_workspace_bytes(), j["attention"] = net.attention_name();
    j["recompute"] = o_.recompute, j["keep_gelu"] = o_.keep_gelu, j["products"] = net.products_used();
  }
  [[nodiscard]] std::map<std::string, std::string> dump_metadata() const {
    const model_shape& s = o_.shape;
    return {{"layers", std::to_string(s.layers)}, {"heads", std::to_string(s.heads)}, {"d", std::to_string(s.d)},
            {"seq", std::to_string(s.seq)}, {"max_seq", std::to_string(s.positions())},
            {"vocab", std::to_string(s.vocab)}, {"padded_vocab", std::to_string(s.padded_vocab())}};
  }

private:
  const options& o_;
  model_ids ids_;
  net_options nopt_;
};

//! --deterministic's runs on the host (exact.cpp: its own translation unit,
//! compiled in parallel with main's) and on the GPU (exact_cuda.cu, in CUDA builds).
int run_exact_host(const options& o, tessera::comm::mpi& world, const datasets& sets);
int run_exact_cuda(const options& o, tessera::comm::mpi& world, const datasets& sets);

//! Trains on the host backend with reduction R.
template <class R = tessera::float_reduction>
int run_host(const options& o, tessera::comm::mpi& world, const datasets& sets) {
  lm<host_gpt> model(o, sets);
  return trainer_kit::run_configured<tessera::backend::host, R>(o, world, world, model, trainer_kit::host_usage{});
}

}  // namespace gpt
