#pragma once
// Products with a fused and a separate form: a cuBLASLt GEMM with its
// epilogue (bias, GELU, GELU gradient, bias gradient), or the plain GEMM and
// a kernel after it. cuBLASLt's fused kernels are not always the faster ones
// at a given shape, so each product is timed in both forms the first time it
// runs and keeps the faster; the reference trainers (tessera-mlp-lm,
// tessera-gpt) share this. Both forms must write the same outputs, so that a
// product run twice (to time it) leaves the same state as one run.
#include <array>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "tessera/backend/cuda/stream.hpp"
#include "tessera/core/error.hpp"

namespace trainer_kit {

template <std::size_t N>
class product_forms {
public:
  static constexpr int unmeasured = -1;
  explicit product_forms(std::array<const char*, N> names) : names_(names) { choice_.fill(0); }

  //! Product p may run fused (`available`: cuBLASLt has the fused form at this
  //! shape), to be decided by timing; else it always runs separate.
  //! TESSERA_PRODUCT_FORMS=fused or separate decides without timing (a
  //! profiler's replay distorts the timing: profile the forms a normal run
  //! chose, which its JSON `products` names); unset or `timed`: timing.
  void allow(std::size_t p, bool available) {
    const int forced = forced_form();
    choice_.at(p) = forced == unmeasured ? (available ? unmeasured : 0) : forced == 1 && available ? 1 : 0;
  }
  //! Forces product p fused (if `available`) or separate, with no timing.
  void force(std::size_t p, bool fused, bool available) { choice_.at(p) = fused && available ? 1 : 0; }
  //! 1 fused, 0 separate, unmeasured: not yet run.
  [[nodiscard]] int state(std::size_t p) const { return choice_.at(p); }

  //! Runs product p through go(bool fused). The first time, both forms run
  //! twice and the second runs are timed; the separate form is kept only if
  //! it is more than 3% faster, so that timing noise does not flip a run's
  //! arithmetic between runs on the same shapes.
  template <class F>
  void run(std::size_t p, F&& go) {
    int& choice = choice_.at(p);
    if (choice != unmeasured) return go(choice == 1);
    const cudaStream_t s = tessera::cuda::current_stream();
    go(true);
    go(false);
    tessera::cuda::event a(true), b(true), c(true);
    a.record(s);
    go(true);
    b.record(s);
    go(false);
    c.record(s);
    c.synchronize();
    float fused_ms = 0, separate_ms = 0;
    TESSERA_CUDA(cudaEventElapsedTime(&fused_ms, a.get(), b.get()));
    TESSERA_CUDA(cudaEventElapsedTime(&separate_ms, b.get(), c.get()));
    choice = separate_ms < 0.97f * fused_ms ? 0 : 1;
    timings_[p] = {fused_ms, separate_ms};
  }

  //! The form each product runs in, with the timings that chose it, in words.
  [[nodiscard]] std::string describe() const {
    std::string r;
    for (std::size_t p = 0; p < N; ++p) {
      const int c = choice_[p];
      char line[160];
      std::snprintf(line, sizeof line, "%s%s: %s", r.empty() ? "" : "; ", names_[p],
                    c == unmeasured ? "not yet measured" : c == 1 ? "fused" : "separate");
      r += line;
      if (const auto [f, sep] = timings_[p]; f > 0 || sep > 0) {
        std::snprintf(line, sizeof line, " (fused %.3f ms, separate %.3f ms)", double(f), double(sep));
        r += line;
      }
    }
    return r;
  }

private:
  // TESSERA_PRODUCT_FORMS: 1 fused, 0 separate, unmeasured (timed) when unset.
  static int forced_form() {
    const char* e = std::getenv("TESSERA_PRODUCT_FORMS");
    const std::string_view v = e ? e : "timed";
    if (v == "timed") return unmeasured;
    if (v == "fused" || v == "separate") return v == "fused" ? 1 : 0;
    throw tessera::error("TESSERA_PRODUCT_FORMS=" + std::string(v) + " is not one of fused, separate, timed");
  }
  std::array<const char*, N> names_;
  std::array<int, N> choice_{};
  std::array<std::pair<float, float>, N> timings_{};
};

}  // namespace trainer_kit
