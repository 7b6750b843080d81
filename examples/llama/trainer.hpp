#pragma once
// tessera-llama's hooks into the trainer kit's loop (trainer_kit/loop.hpp):
// Llama 3's registration and initialisation, its net (host or CUDA), what the
// net holds, the Hugging Face bridge, its banner and summary. Sequences,
// validation, sampling and the data stream's checkpoint fields are every
// sequence model's (trainer_kit/sequence_lm.hpp); steps, checkpoints and
// logging the loop's.
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "llama/hf.hpp"
#include "llama/host_compute.hpp"
#include "llama/model.hpp"
#include "options.hpp"
#include "tessera/tessera.hpp"
#include "trainer_kit/hf.hpp"
#include "trainer_kit/host_math.hpp"
#include "trainer_kit/loop.hpp"
#include "trainer_kit/sequence_lm.hpp"

namespace llama {

using datasets = trainer_kit::datasets<token>;

//! Llama 3 as the loop trains it, Net<W> computing (host_llama or cuda_llama).
template <template <class> class Net>
class lm : public trainer_kit::sequence_lm<token> {
public:
  static constexpr const char* program = "tessera-llama";
  template <class W> using net = Net<W>;

  lm(const options& o, const datasets& sets) : sequence_lm(program, o, o, o.shape.seq, o.shape.vocab, sets), o_(o) {}

  // Three gather buffers: the embed unit, held for the whole micro-batch, and
  // two for the blocks (one in use, one prefetching).
  template <class W> void build(W& w) { ids_ = register_model(w, o_.shape); }
  template <class W> void init(W& w, std::uint64_t seed) const { init_model(w, ids_, o_.shape, seed); }
  //! --init-from a Hugging Face directory: each rank reads its shard of every tensor.
  template <class View> void init_from_hf(View view, const std::filesystem::path& dir) const {
    const trainer_kit::hf::directory files(dir);
    trainer_kit::hf::load(view, files, hf_table(o_.shape), trainer_kit::hf::ignored_names(hf_table_json), "model.");
  }
  template <class W> Net<W> make_net(W& w, int input_slots) {
    nopt_ = {.recompute = o_.recompute, .attention = o_.attention, .deterministic = o_.deterministic,
             .input_slots = input_slots, .fp8 = trainer_kit::fp8_of(o_)};
    return Net<W>(w, ids_, o_.shape, o_.batch, nopt_);
  }
  template <class W> [[nodiscard]] std::size_t activation_bytes(const Net<W>& net, const W& w) const {
    const auto padded = [&](tessera::unit_id u) { return w.layout(u).padded_numel(); };
    return Net<W>::workspace_bytes(o_.shape, o_.batch, nopt_) + trainer_kit::widened_bytes<Net<W>>(ids_, padded) +
           net.runtime_workspace_bytes();
  }

  [[nodiscard]] nlohmann::json identity() const {
    const model_shape& s = o_.shape;
    // Every field of its configuration (what an export rebuilds config.json from).
    return {{"layers", s.layers}, {"heads", s.heads}, {"kv_heads", s.kv_heads}, {"d", s.d}, {"ffn", s.ffn},
            {"head_dim", s.head_dim()}, {"vocab", s.vocab}, {"max_seq", s.positions()}, {"rope_theta", s.rope_theta},
            {"rope_factor", s.scaling.factor}, {"rope_low_freq_factor", s.scaling.low_freq_factor},
            {"rope_high_freq_factor", s.scaling.high_freq_factor},
            {"rope_original_positions", s.scaling.original_max_position}, {"tie_embeddings", s.tie_embeddings},
            {"norm_eps", s.norm_eps}};
  }
  [[nodiscard]] double flops_per_token() const { return o_.shape.flops_per_token(); }
  [[nodiscard]] std::size_t params() const { return o_.shape.params(); }

  template <class N, class W> void banner(const N& net, const W&, const trainer_kit::run_facts& f) const {
    const model_shape& s = o_.shape;
    std::printf("tessera-llama: backend %s, %s / %s / %s%s, %d rank%s%s, %zu parameters (%d layers, %d heads, %d kv "
                "heads, d %d, ffn %d, head dimension %d, seq %d, vocab %d padded to %d, %s head), %.0f tokens per step, "
                "data %s, weights initialised in %.2f s, attention %s, estimated memory %s MiB on the busiest rank%s\n",
                N::backend_name, o_.wrapper.c_str(), o_.strategy.c_str(), o_.precision.c_str(),
                o_.deterministic ? " (deterministic)" : "", f.world, f.world == 1 ? "" : "s", f.mesh.c_str(), s.params(),
                s.layers, s.heads, s.kv_heads, s.d, s.ffn, s.head_dim(), s.seq, s.vocab, s.padded_vocab(),
                s.tie_embeddings ? "tied" : "untied", f.tokens_per_step, data_words().c_str(), f.init_s,
                std::string(net.attention_name()).c_str(), trainer_kit::mib(f.estimate.total()).c_str(),
                trainer_kit::offload_note(f.estimate, o_.offload_update).c_str());
  }
  template <class N> void summary(nlohmann::json& j, const N& net) const {
    j["attention_workspace_bytes"] = net.runtime_workspace_bytes(), j["attention"] = net.attention_name();
    j["recompute"] = o_.recompute, j["products"] = net.products_used();
  }
  [[nodiscard]] std::map<std::string, std::string> dump_metadata() const {
    const model_shape& s = o_.shape;
    const auto str = [](auto v) { return nlohmann::json(v).dump(); };
    return {{"layers", str(s.layers)}, {"heads", str(s.heads)}, {"kv_heads", str(s.kv_heads)}, {"d", str(s.d)},
            {"ffn", str(s.ffn)}, {"head_dim", str(s.head_dim())}, {"seq", str(s.seq)}, {"max_seq", str(s.positions())},
            {"vocab", str(s.vocab)}, {"padded_vocab", str(s.padded_vocab())}, {"rope_theta", str(s.rope_theta)},
            {"rope_factor", str(s.scaling.factor)}, {"rope_low_freq_factor", str(s.scaling.low_freq_factor)},
            {"rope_high_freq_factor", str(s.scaling.high_freq_factor)},
            {"rope_original_positions", str(s.scaling.original_max_position)}, {"norm_eps", str(s.norm_eps)},
            {"tie_embeddings", str(s.tie_embeddings)}};
  }

private:
  const options& o_;
  model_ids ids_;
  net_options nopt_;
};

//! --deterministic's runs on the host (exact.cpp) and on the GPU (exact_cuda.cu, in CUDA builds).
int run_exact_host(const options& o, tessera::comm::mpi& world, const datasets& sets);
int run_exact_cuda(const options& o, tessera::comm::mpi& world, const datasets& sets);

//! Trains on the host backend with reduction R.
template <class R = tessera::float_reduction>
int run_host(const options& o, tessera::comm::mpi& world, const datasets& sets) {
  lm<host_llama> model(o, sets);
  return trainer_kit::run_configured<tessera::backend::host, R>(o, world, world, model, trainer_kit::host_usage{});
}

}  // namespace llama
