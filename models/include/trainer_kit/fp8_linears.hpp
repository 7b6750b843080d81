#pragma once
// The reference nets' linear layers in fp8 (--precision fp8), as the host
// backend emulates them: each product's two operands are cast per tensor to
// fp8 codes (tessera::fp8's casts, bit for bit the GPU's) and multiplied in
// fp32, the result scaled by the two inverse scales, as cuBLASLt's fp8 GEMM
// does with its scale pointers. Activations and weights are E4M3, gradients
// E5M2 (Transformer Engine's "hybrid" format); the embedding, the classifier,
// the norms, attention and every bias stay in the compute type.
//
// A product's three operands (its input x, its weight W, the gradient dy of
// its output) are numbered per net: linear k's operand op is slot 3 k + op.
// Under the current recipe each cast takes the amax of what it casts; the
// forward's casts of x and W are repeated in backward (for dgrad and wgrad),
// which gives the same codes because the same amax gives the same scale.
// Under the delayed recipe a step's casts all use the scale of the largest
// amax in the slot's history of past steps (the first step, with none, its
// own amax), and end_step records the step's amax: the largest over every
// micro-batch of every rank (one max all-reduce of 3 x linears floats), so a
// run's scales do not depend on how its micro-batches are spread over ranks.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "tessera/backend/host/blas.hpp"
#include "tessera/backend/host/ops.hpp"
#include "tessera/comm/mpi.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/fp8.hpp"
#include "tessera/core/fp8_scaling.hpp"
#include "trainer_kit/fp8_options.hpp"

namespace trainer_kit {

//! One net's fp8 casts: each slot's amax history (delayed) and this step's amax.
class fp8_casts {
public:
  enum operand : std::size_t { input = 0, weight = 1, grad = 2 };
  fp8_casts() = default;
  fp8_casts(const fp8_options& o, std::size_t linears)
      : o_(o), running_(o.on ? 3 * linears : 0, 0.0f),
        history_(o.on && delayed() ? 3 * linears * std::size_t(o.scaling.history) : 0, 0.0f) {
    if (o.on) o.scaling.check();
  }
  [[nodiscard]] bool on() const noexcept { return o_.on; }
  [[nodiscard]] bool delayed() const noexcept { return o_.scaling.kind == tessera::fp8::recipe::delayed; }
  //! Whether casts count toward the step's amax: training forwards and
  //! backwards do; an evaluation or sampling forward does not.
  void record(bool on) noexcept { record_ = on; }

  //! The n values of src cast to fp8 (E4M3, E5M2 for `grad`) with the slot's
  //! scale, written to dst as the codes' values; returns the inverse scale.
  float cast(std::size_t linear, operand op, const float* src, float* dst, std::size_t n) {
    return op == grad ? cast_as<tessera::e5m2>(slot(linear, op), src, dst, n)
                      : cast_as<tessera::e4m3>(slot(linear, op), src, dst, n);
  }

  //! After a step's micro-batches, on every rank of `world` (collective under
  //! the delayed recipe): the step's amax of every slot into its history.
  void end_step(tessera::comm::mpi& world) {
    if (!o_.on || !delayed()) return;
    tessera::comm::all_reduce(world, std::span<float>(running_), tessera::comm::reduce_op::max);
    const std::size_t len = std::size_t(o_.scaling.history);
    for (std::size_t s = 0; s < running_.size(); ++s) history_[s * len + steps_ % len] = running_[s];
    std::fill(running_.begin(), running_.end(), 0.0f);
    ++steps_;
  }

  //! The delayed recipe's state for a checkpoint (null when there is none to keep).
  [[nodiscard]] nlohmann::json state() const {
    if (!o_.on || !delayed()) return nullptr;
    return {{"recipe", "delayed"}, {"history", o_.scaling.history}, {"slots", running_.size()},
            {"steps", steps_}, {"amax", history_}};
  }
  //! Resumes the history a checkpoint kept (`where` names it in errors). A
  //! checkpoint without one (fp32, bf16 or the current recipe) starts a fresh
  //! history: the first step casts with its own amaxes.
  void restore(const nlohmann::json& s, const std::string& where) {
    if (!o_.on || !delayed() || s.is_null()) return;
    TESSERA_CHECK(s.value("recipe", "") == "delayed" && s.contains("amax") && s.contains("steps"), where,
                  ": its fp8 state is damaged (no recipe, amax history or step count)");
    const int len = s.value("history", 0);
    const std::size_t slots = s.value("slots", std::size_t(0));
    TESSERA_CHECK(len == o_.scaling.history && slots == running_.size(), where, ": its fp8 amax history has ", slots,
                  " casts of ", len, " steps; this run keeps ", running_.size(), " of ", o_.scaling.history);
    auto amax = s["amax"].get<std::vector<float>>();
    TESSERA_CHECK(amax.size() == history_.size(), where, ": its fp8 amax history holds ", amax.size(),
                  " values, not ", history_.size());
    history_ = std::move(amax), steps_ = s["steps"].get<std::size_t>();
  }

private:
  [[nodiscard]] std::size_t slot(std::size_t linear, operand op) const {
    const std::size_t s = 3 * linear + std::size_t(op);
    TESSERA_CHECK(s < running_.size(), "fp8 cast of linear layer ", linear, " of ", running_.size() / 3);
    return s;
  }
  template <class F>
  float cast_as(std::size_t s, const float* src, float* dst, std::size_t n) {
    double largest = 0.0;  // +inf where a value is not finite: the step is skipped; its scale must not outlive it
    tessera::backend_ops<tessera::backend::host>::max_abs_into(std::span<const float>(src, n), &largest);
    const bool finite = std::isfinite(largest);
    const float amax = float(largest);
    float use = amax;
    if (delayed()) {
      const std::size_t len = std::size_t(o_.scaling.history);
      use = tessera::fp8::delayed_amax(history_.data() + s * len, int(len), steps_, amax);
      if (record_ && finite) running_[s] = std::max(running_[s], amax);
    }
    // 1 where nothing sets a scale (zeros, non-finite values): stateless, so
    // every rank and every world size casts a micro-batch alike.
    const float scale = tessera::fp8::scale_for<F>(use, 1.0f, o_.scaling.margin);
    for (std::size_t i = 0; i < n; ++i) dst[i] = float(tessera::fp8::cast<F>(src[i], scale));
    return 1.0f / scale;
  }

  fp8_options o_{};
  std::vector<float> running_, history_;  // history_: slot s's len values from s * len
  std::size_t steps_ = 0;                 // steps recorded (delayed)
  bool record_ = true;
};

//! A net's linear layers on the host: y (+)= x W^T over n rows, in fp32 or,
//! where `casts` is on, in emulated fp8 through three code buffers (x's, W's
//! and dy's: rows x the widest input / output, the widest weight). Linear k
//! of the net is `id` k in both directions.
struct host_linears {
  fp8_casts* casts = nullptr;
  float *xq = nullptr, *wq = nullptr, *dyq = nullptr;

  [[nodiscard]] bool fp8() const noexcept { return casts && casts->on(); }
  //! y = x W^T + beta y; x [n, in], W [out, in], y [n, out].
  void forward(std::size_t id, const float* x, const float* W, float* y, std::size_t n, std::size_t in,
               std::size_t out, float beta) const {
    using tessera::host::gemm;
    if (!fp8()) return gemm(false, true, int(n), int(out), int(in), 1.0f, x, W, beta, y);
    const float ix = casts->cast(id, fp8_casts::input, x, xq, n * in);
    const float iw = casts->cast(id, fp8_casts::weight, W, wq, out * in);
    gemm(false, true, int(n), int(out), int(in), ix * iw, xq, wq, beta, y);
  }
  //! dW += dy^T x and, where dx is given, dx = dy W; dy [n, out].
  void backward(std::size_t id, const float* dy, const float* x, const float* W, float* dW, float* dx, std::size_t n,
                std::size_t in, std::size_t out) const {
    using tessera::host::gemm;
    if (!fp8()) {
      gemm(true, false, int(out), int(in), int(n), 1.0f, dy, x, 1.0f, dW);
      if (dx) gemm(false, false, int(n), int(in), int(out), 1.0f, dy, W, 0.0f, dx);
      return;
    }
    const float ig = casts->cast(id, fp8_casts::grad, dy, dyq, n * out);
    const float ix = casts->cast(id, fp8_casts::input, x, xq, n * in);
    gemm(true, false, int(out), int(in), int(n), ig * ix, dyq, xq, 1.0f, dW);
    if (!dx) return;
    const float iw = casts->cast(id, fp8_casts::weight, W, wq, out * in);
    gemm(false, false, int(n), int(in), int(out), ig * iw, dyq, wq, 0.0f, dx);
  }
};

//! What a host net keeps for its fp8 products, and the loop's hooks into
//! them (end_step, fp8_state, restore_fp8): a base of host_gpt and host_llama.
class host_fp8_products {
public:
  //! After each step's micro-batches (the loop; collective): the delayed
  //! recipe's amaxes into their histories, which a checkpoint keeps.
  void end_step(tessera::comm::mpi& world) { casts_.end_step(world); }
  [[nodiscard]] nlohmann::json fp8_state() const { return casts_.state(); }
  void restore_fp8(const nlohmann::json& s, const std::string& where) { casts_.restore(s, where); }

protected:
  //! `linears` products, their operands' codes in xq, wq and dyq (the net's
  //! buffers, unused where `o` is off).
  void use_fp8(const fp8_options& o, std::size_t linears, float* xq, float* wq, float* dyq) {
    casts_ = fp8_casts(o, linears), xq_ = xq, wq_ = wq, dyq_ = dyq;
  }
  //! A training micro-batch's casts count toward the step's amax; an
  //! evaluation's or a sample's do not.
  void training(bool on) noexcept { casts_.record(on); }
  [[nodiscard]] host_linears linears() noexcept { return {&casts_, xq_, wq_, dyq_}; }

private:
  fp8_casts casts_;
  float *xq_ = nullptr, *wq_ = nullptr, *dyq_ = nullptr;
};

}  // namespace trainer_kit
