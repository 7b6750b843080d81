#pragma once
// tessera-mlp-lm's hooks into the trainer kit's loop (trainer_kit/loop.hpp):
// the MLP's registration and initialisation, its byte samples (each rank a
// contiguous slice of the global micro-batch), and the net's own set-up
// (fused products, GEMM shapes beside NCCL, gradient shards lent to
// activations). Everything else is the kit's.
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mlp_lm/data.hpp"
#include "mlp_lm/model.hpp"
#include "options.hpp"
#include "tessera/tessera.hpp"
#include "trainer_kit/host_math.hpp"
#include "trainer_kit/loop.hpp"

namespace mlp_lm {

//! The byte MLP as the loop trains it, Net<W> computing (host_mlp or cuda_mlp).
template <template <class> class Net>
class lm {
public:
  static constexpr const char* program = "tessera-mlp-lm";
  template <class W> using net = Net<W>;
  struct batch {
    std::vector<std::uint8_t> ctx, tgt;
  };

  explicit lm(const options& o) : o_(o), shape_{o.layers, o.d, o.ctx} {}
  [[nodiscard]] const trainer_kit::run_options& run() const { return o_; }

  //! The global micro-batch is split into contiguous, possibly uneven
  //! slices; --deterministic: whole micro-batches, rank r taking r, r + N, ...
  //! (the tokens of the global batch in the same order either way).
  void on_world(int rank, int N) {
    if (o_.deterministic)
      TESSERA_CHECK(o_.accum % N == 0, "--deterministic: ", o_.accum, " micro-batches of ", o_.micro_tokens,
                    " tokens do not split evenly over ", N, " ranks; choose a world size that divides ", o_.accum,
                    " (or another --micro-tokens)");
    else
      TESSERA_CHECK(o_.tokens / o_.accum >= N, "--tokens ", o_.tokens, " / --accum ", o_.accum, " gives ",
                    o_.tokens / o_.accum, " tokens per micro-batch over ", N, " ranks; each rank needs at least one");
    rank_ = rank, N_ = N;
    per_mb_ = o_.tokens / o_.accum;
    lo_ = o_.deterministic ? 0 : per_mb_ * rank / N, hi_ = o_.deterministic ? per_mb_ : per_mb_ * (rank + 1) / N;
  }
  [[nodiscard]] tessera::wrapper_options wrapper_options() const { return {.lend_grad_shards = o_.lend_grad_shards}; }
  template <class W> void build(W& w) { ids_ = register_model(w, shape_); }
  template <class W> void init(W& w, std::uint64_t seed) const { init_model(w, ids_, shape_, seed); }
  template <class W> Net<W> make_net(W& w, int input_slots) {
    nopt_ = {.recompute_gelu = o_.recompute_gelu, .input_slots = input_slots};
    return Net<W>(w, ids_, shape_, rows(), nopt_);
  }
  //! The products' forms (--deterministic: fused where cuBLASLt can, not by
  //! timing: two runs could time differently), GEMMs shaped for the SMs NCCL
  //! leaves, gradient shards lent to activations. Returns the bytes of the
  //! shards that did not fit there.
  template <class N, class W> std::size_t prepare(N& net, W&) {
    if (o_.fusion != "auto" || o_.deterministic) net.force_fusion(o_.fusion != "off");
    if constexpr (requires { net.set_gemm_sms(0); })
      if (o_.gemm_sms > 0 && N_ > 1) net.set_gemm_sms(o_.gemm_sms);
    if constexpr (requires { net.lend_grad_shards(); })
      if (o_.lend_grad_shards) return net.lend_grad_shards();
    return 0;
  }
  template <class W> [[nodiscard]] std::size_t activation_bytes(const Net<W>&, const W& w) const {
    const auto padded = [&](tessera::unit_id u) { return w.layout(u).padded_numel(); };
    return Net<W>::workspace_bytes(shape_, rows(), nopt_) + trainer_kit::widened_bytes<Net<W>>(ids_, padded);
  }

  [[nodiscard]] nlohmann::json identity() const { return {{"layers", o_.layers}, {"d", o_.d}, {"ctx", o_.ctx}}; }
  [[nodiscard]] nlohmann::json position(int, int) const {
    nlohmann::json x{{"tokens", o_.tokens}, {"accum", o_.accum}};
    if (o_.deterministic) x["micro_tokens"] = o_.micro_tokens;
    return x;
  }
  //! The checkpoint's data stream is this run's: the same global batch and
  //! micro-batches, deterministic (of the same micro-batch) or not.
  void check_resume(const nlohmann::json& x, const std::string& path, int, int) const {
    const long long tokens = trainer_kit::resume_field(x, path, "tokens", 1, 1L << 30, program),
                    accum = trainer_kit::resume_field(x, path, "accum", 1, 1L << 20, program);
    if (tokens != o_.tokens || accum != o_.accum)
      throw tessera::error("checkpoint '" + path + "' was trained with --tokens " + std::to_string(tokens) + " --accum " +
                           std::to_string(accum) + "; resume with the same to continue its data stream");
    const long micro = x.contains("micro_tokens") && x["micro_tokens"].is_number_integer()
                           ? x["micro_tokens"].get<long>() : 0;
    if (micro != (o_.deterministic ? o_.micro_tokens : 0))
      throw tessera::error("checkpoint '" + path + "' was trained " +
                           (micro ? "with --deterministic --micro-tokens " + std::to_string(micro)
                                  : std::string("without --deterministic")) +
                           "; resume the same way to continue its data stream");
  }

  [[nodiscard]] double tokens_per_step(int, int) const { return double(o_.tokens); }
  [[nodiscard]] double flops_per_token() const { return shape_.flops_per_token(); }
  [[nodiscard]] std::size_t params() const { return shape_.params(); }

  [[nodiscard]] batch make_batch() const {
    return {std::vector<std::uint8_t>(rows() * std::size_t(o_.ctx)), std::vector<std::uint8_t>(rows())};
  }
  void sample(batch& b, std::uint64_t seed, long step, int mb) {
    // The generated text (no --data) is the seed's: a resumed run's, the checkpoint's.
    if (!data_ || data_seed_ != seed) data_.emplace(o_.data, seed, o_.ctx), data_seed_ = seed;
    const long k = long(rank_) + long(mb) * N_;  // --deterministic: the global micro-batch
    for (std::size_t j = 0; j < n(); ++j)
      b.tgt[j] = o_.deterministic ? data_->sample(seed, step, 0, k * per_mb_ + long(j), &b.ctx[j * std::size_t(o_.ctx)])
                                  : data_->sample(seed, step, mb, lo_ + long(j), &b.ctx[j * std::size_t(o_.ctx)]);
  }
  template <class N> void forward_backward(N& net, const batch& b, double tokens) {
    net.forward_backward(b.ctx.data(), b.tgt.data(), n(), tokens);
  }
  template <class N> void stage(N& net, int slot, const batch& b) { net.stage(slot, b.ctx.data(), b.tgt.data(), n()); }
  template <class N> void forward_backward_slots(N& net, int count, double tokens) {
    net.forward_backward_slots(count, n(), tokens);
  }

  template <class N, class W> void banner(const N& net, const W&, const trainer_kit::run_facts& f) const {
    const trainer_kit::memory_estimate& e = f.estimate;
    std::printf("tessera-mlp-lm: backend %s%s%s%s, %s / %s / %s, %d rank%s%s, %zu parameters, %ld tokens per step, "
                "estimated memory %s MiB per rank (model state %s, optimizer %s, activations %s)%s\n",
                N::backend_name, net.fusion().empty() ? "" : " (", net.fusion().c_str(), net.fusion().empty() ? "" : ")",
                o_.wrapper.c_str(), o_.strategy.c_str(), o_.precision.c_str(), f.world, f.world == 1 ? "" : "s",
                f.mesh.c_str(), shape_.params(), o_.tokens, trainer_kit::mib(e.total()).c_str(),
                trainer_kit::mib(e.model_state).c_str(), trainer_kit::mib(e.optimizer_state).c_str(),
                trainer_kit::mib(e.activations + e.blas_workspace).c_str(),
                trainer_kit::offload_note(e, o_.offload_update).c_str());
  }
  template <class N> void summary(nlohmann::json& j, const N& net) const {
    j["fused_epilogues"] = net.fused(), j["fusion_choices"] = net.choices();
  }
  [[nodiscard]] std::map<std::string, std::string> dump_metadata() const {
    return {{"layers", std::to_string(o_.layers)}, {"d", std::to_string(o_.d)}, {"ctx", std::to_string(o_.ctx)},
            {"vocab", "256"}};
  }

private:
  [[nodiscard]] std::size_t n() const { return std::size_t(hi_ - lo_); }      // this rank's tokens a micro-batch
  [[nodiscard]] std::size_t rows() const { return std::max<std::size_t>(n(), 1); }  // what the net holds
  const options& o_;
  model_shape shape_;
  std::optional<corpus> data_;
  std::uint64_t data_seed_ = 0;
  model_ids ids_;
  net_options nopt_;
  int rank_ = 0, N_ = 1;
  long per_mb_ = 0, lo_ = 0, hi_ = 0;
};

//! One backend's training run with reduction policy R (run.hpp: the host
//! here, CUDA in cuda_main.cuh); float and exact (--deterministic)
//! instantiations live in two translation units, which compile in parallel.
int run_exact(const options& o, tessera::comm::mpi& world);

}  // namespace mlp_lm
