// Llama 3's host net (models/include/llama/): every parameter's gradient
// against finite differences of the loss, with grouped kv heads, Llama 3's
// rotary scaling, a tied and an untied head, and recomputation; the rotary
// tables as transformers computes them; the conversion table and a
// configuration's refusals.
#define BOOST_TEST_MODULE tessera_llama
#include "common/mpi_test_main.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "llama/hf.hpp"
#include "llama/host_compute.hpp"
#include "llama/model.hpp"
#include "llama/rope.hpp"
#include "tessera/tessera.hpp"

using namespace tessera;
using Cfg = config<no_shard, ddp, full_precision<float>, sum, backend::host>;
using W = data_parallel_t<Cfg>;

namespace {
std::vector<std::uint32_t> random_tokens(std::size_t n, int vocab, std::uint64_t seed) {
  std::vector<std::uint32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = std::uint32_t(splitmix64(seed + i) % std::uint64_t(vocab));
  t[3] = t[5] = t[9];  // repeated tokens: the table's gradient rows add up
  return t;
}

llama::model_shape small(bool tied) {
  llama::model_shape s;
  s.layers = 2, s.heads = 4, s.kv_heads = 2, s.d = 16, s.ffn = 24, s.vocab = 50, s.seq = 7;
  s.max_seq = 64, s.tie_embeddings = tied;
  s.scaling = {4.0, 1.0, 4.0, 8};  // Llama 3's scaling at a scale these positions reach
  s.rope_theta = 10000.0;
  return s;
}

void check_gradients(bool tied, bool recompute) {
  comm::local<backend::host> solo;
  W m(solo);
  const llama::model_shape s = small(tied);
  const auto ids = llama::register_model(m, s);
  m.finalize();
  llama::init_model(m, ids, s, 5);
  // Larger weights than 0.02, so every path carries a gradient well above the differences' noise.
  for (std::size_t u = 0; u < m.num_units(); ++u)
    for (std::size_t t = 0; t < m.layout(unit_id{int(u)}).tensors().size(); ++t) {
      const param_id p{int(u), int(t)};
      const bool norm = m.slot(p).spec.name.find("norm") != std::string::npos;
      m.init_param(p, init::normal{.seed = 11, .stdev = 0.3, .mean = norm ? 1.0 : 0.0});
    }
  for (const param_id table : {ids.tok, ids.head}) {  // the padded rows stay zero (never given probability)
    auto v = m.get_param(table);
    std::fill(v.begin() + std::ptrdiff_t(s.vocab) * s.d, v.end(), 0.0f);
    m.set_param(table, v);
  }
  const int batch = 2;
  const auto seqs = random_tokens(std::size_t(batch) * std::size_t(s.seq + 1), s.vocab, 99);
  llama::host_llama<W> net(m, ids, s, batch, llama::net_options{.recompute = recompute});
  m.begin_micro_batch(0, 1);
  net.forward_backward(seqs.data(), batch, 1.0);  // the summed loss's gradient
  net.finish_loss();
  m.finish_grad_sync();
  std::vector<std::vector<float>> grads;
  for (std::size_t u = 0; u < m.num_units(); ++u)
    for (std::size_t t = 0; t < m.layout(unit_id{int(u)}).tensors().size(); ++t) {
      const auto g = m.shards().local_grads(param_id{int(u), int(t)});
      grads.emplace_back(g.begin(), g.end());
    }
  const double loss0 = net.take_loss();
  BOOST_TEST(std::abs(loss0 - net.forward_loss(seqs.data(), batch)) <= 1e-6 * loss0);
  int checked = 0;
  std::size_t k = 0;
  for (std::size_t u = 0; u < m.num_units(); ++u)
    for (std::size_t t = 0; t < m.layout(unit_id{int(u)}).tensors().size(); ++t) {
      const param_id p{int(u), int(t)};
      const std::vector<float>& g = grads[k++];
      const std::string name = m.layout(unit_id{int(u)}).name() + "." + m.slot(p).spec.name;
      float gmax = 0;
      std::size_t imax = 0;
      for (std::size_t i = 0; i < g.size(); ++i)
        if (std::abs(g[i]) > gmax) gmax = std::abs(g[i]), imax = i;
      BOOST_TEST_CONTEXT(name << (tied ? " (tied)" : "") << (recompute ? " (recompute)" : "")) {
        BOOST_TEST(gmax > 0.0f);  // every parameter is reached
        std::vector<std::size_t> at = {imax, std::size_t(splitmix64(t + 17 * u) % g.size()), g.size() / 2};
        if (p == ids.tok) at.push_back(std::size_t(seqs[3]) * std::size_t(s.d) + 1);  // an input row, used twice
        const auto base = m.get_param(p);
        for (std::size_t i : at) {
          const float eps = 1e-2f;
          auto v = base;
          v[i] = base[i] + eps;
          m.set_param(p, v);
          const double up = net.forward_loss(seqs.data(), batch);
          v[i] = base[i] - eps;
          m.set_param(p, v);
          const double down = net.forward_loss(seqs.data(), batch);
          const double fd = (up - down) / (2.0 * eps);
          BOOST_TEST_CONTEXT("element " << i << ": gradient " << g[i] << ", differences " << fd) {
            BOOST_TEST(std::abs(g[i] - fd) <= 0.02 * gmax + 2e-3);
          }
          ++checked;
        }
        m.set_param(p, base);
      }
    }
  BOOST_TEST(checked >= 3 * (2 + 6 * s.layers));
  const auto& gt = grads[std::size_t(ids.tok.index)];
  for (std::size_t i = std::size_t(s.vocab) * std::size_t(s.d); i < gt.size(); ++i) BOOST_TEST_REQUIRE(gt[i] == 0.0f);
}
}  // namespace

BOOST_AUTO_TEST_CASE(gradients_match_finite_differences_untied) { check_gradients(false, false); }
BOOST_AUTO_TEST_CASE(gradients_match_finite_differences_tied) { check_gradients(true, false); }
BOOST_AUTO_TEST_CASE(gradients_match_finite_differences_with_recompute) { check_gradients(false, true); }

// The rotary frequencies as transformers' _compute_llama3_parameters gives
// them (Llama 3.2 1B's configuration: theta 500000, factor 32, 1 / 4, 8192;
// head dimension 64): the high frequencies kept, the low ones divided by the
// factor, the band between blended; figures printed by transformers 5.25.
BOOST_AUTO_TEST_CASE(rotary_frequencies_follow_llama3) {
  llama::model_shape s;
  BOOST_REQUIRE(llama::preset("llama3.2-1b", s));
  BOOST_TEST(s.head_dim() == 64);
  const auto inv = llama::inverse_frequencies(s);
  BOOST_TEST(inv.size() == 32u);
  BOOST_TEST(inv[0] == 1.0f);                                  // wavelength 2 pi: kept
  BOOST_TEST(std::abs(inv[31] / (1.0 / std::pow(500000.0, 62.0 / 64) / 32) - 1) < 1e-6);  // the lowest, / factor
  const double plain = 1.0 / std::pow(500000.0, 2.0 * 16 / 64);  // a wavelength between 2048 and 8192: blended
  const double wavelen = 2 * 3.141592653589793 / plain, smooth = (8192 / wavelen - 1) / 3;
  BOOST_TEST(wavelen > 2048.0); BOOST_TEST(wavelen < 8192.0);
  BOOST_TEST(std::abs(inv[16] / ((1 - smooth) * plain / 32 + smooth * plain) - 1) < 1e-5);
  const llama::rope_tables t(s, 3);
  BOOST_TEST(t.cos[0] == 1.0f);
  BOOST_TEST(std::abs(t.sin[32] - std::sin(1.0)) < 1e-6);  // position 1, the first pair: angle 1
}

// A Hugging Face configuration: the fields Tessera computes read, and one
// tessera error naming any field that asks for another network.
BOOST_AUTO_TEST_CASE(hf_configurations_and_their_refusals) {
  nlohmann::json c = {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"num_hidden_layers", 2},
                      {"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                      {"intermediate_size", 176}, {"vocab_size", 300}, {"max_position_embeddings", 64},
                      {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", true}, {"hidden_act", "silu"},
                      {"rope_theta", 500000.0},
                      {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                        {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 16}}}};
  const auto s = llama::shape_from_hf(c, "dir", 16);
  BOOST_TEST(s.layers == 2); BOOST_TEST(s.kv_heads == 2); BOOST_TEST(s.ffn == 176); BOOST_TEST(s.tie_embeddings);
  BOOST_TEST(s.scaling.factor == 8.0); BOOST_TEST(s.scaling.original_max_position == 16); BOOST_TEST(s.seq == 16);
  // transformers 5's rope_parameters say the same.
  auto v5 = c;
  v5.erase("rope_theta"), v5.erase("rope_scaling");
  v5["rope_parameters"] = c["rope_scaling"], v5["rope_parameters"]["rope_theta"] = 500000.0;
  const auto s5 = llama::shape_from_hf(v5, "dir", 16);
  BOOST_TEST(s5.rope_theta == s.rope_theta); BOOST_TEST(s5.scaling.factor == s.scaling.factor);
  auto refused = [&](auto edit, const std::string& field) {
    auto bad = c;
    edit(bad);
    try {
      (void)llama::shape_from_hf(bad, "dir", 16);
      BOOST_ERROR("accepted a configuration with " << field);
    } catch (const tessera::error& e) {
      BOOST_TEST_CONTEXT(e.what()) { BOOST_TEST(std::string(e.what()).find(field) != std::string::npos); }
    }
  };
  refused([](auto& j) { j["attention_bias"] = true; }, "'attention_bias'");
  refused([](auto& j) { j["mlp_bias"] = true; }, "'mlp_bias'");
  refused([](auto& j) { j["sliding_window"] = 4096; }, "'sliding_window'");
  refused([](auto& j) { j["num_local_experts"] = 8; }, "'num_local_experts'");
  refused([](auto& j) { j["rope_scaling"]["rope_type"] = "yarn"; }, "'rope_scaling.rope_type'");
  refused([](auto& j) { j["hidden_act"] = "gelu"; }, "'hidden_act'");
  refused([](auto& j) { j["model_type"] = "mistral"; }, "'model_type'");
  refused([](auto& j) { j["num_key_value_heads"] = 3; }, "--kv-heads 3 does not divide --heads 4");
  refused([](auto& j) { j.erase("hidden_size"); }, "'hidden_size'");
  // The table names every tensor once: 3 for the embed unit (2 tied) and 6 a block.
  BOOST_TEST(llama::hf_table(s).size() == 2u + 6u * 2u);
  auto untied = s;
  untied.tie_embeddings = false;
  BOOST_TEST(llama::hf_table(untied).size() == 3u + 6u * 2u);
}
