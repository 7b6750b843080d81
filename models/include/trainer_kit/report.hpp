#pragma once
// What a reference trainer prints: the logged step (a text line, or a JSON
// object with --json), the summary at the end and the memory it estimated,
// written once for every trainer (trainer_kit/loop.hpp calls these).
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "tessera/optim/step_ledger.hpp"

namespace trainer_kit {

//! The library's estimate of what a rank holds: model state and optimizer
//! state from the wrapper's plan, plus the trainer's activations and scratch.
struct memory_estimate {
  std::size_t model_state = 0, optimizer_state = 0, activations = 0, blas_workspace = 0;
  std::size_t offloaded = 0;  // host memory: offloaded main weights, optimizer state and its staging
  [[nodiscard]] std::size_t total() const { return model_state + optimizer_state + activations + blas_workspace; }
};

//! Bytes as MiB with two decimals.
inline std::string mib(std::size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", double(b) / (1 << 20));
  return s;
}

//! The banner's words for host-resident optimizer state ("" where none).
inline std::string offload_note(const memory_estimate& e, const std::string& update) {
  return e.offloaded ? ", offloaded to host memory " + mib(e.offloaded) + " MiB (" + update + " update)" : "";
}

//! One logged step's figures.
struct step_line {
  long step = 0;
  double loss = 0, seconds = 0, tokens = 0, flops_per_token = 0;
  std::size_t bytes_in_use = 0;
  double val_loss = -1;  // >= 0: a validation ran at this step
};

//! Prints a logged step on rank 0: a JSON object, or one text line.
inline void print_step(const step_line& l, const tessera::step_result& res, bool json) {
  const double tps = l.tokens / l.seconds, tflops = l.flops_per_token * tps / 1e12;
  if (json) {
    nlohmann::json j{{"step", l.step},         {"loss", l.loss},          {"grad_norm", res.grad_norm},
                     {"lr", res.lr},           {"ms", l.seconds * 1e3},   {"tokens_per_s", tps},
                     {"skipped", res.skipped}, {"tflops", tflops},        {"bytes_in_use", l.bytes_in_use}};
    if (l.val_loss >= 0) j["val_loss"] = l.val_loss;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("step %5ld  loss %.4f  grad_norm %.3f  lr %.2e  %8.2f ms  %10.0f tokens/s  %7.2f TFLOP/s  %8.1f MiB%s%s\n",
                l.step, l.loss, res.grad_norm, res.lr, l.seconds * 1e3, tps, tflops, double(l.bytes_in_use) / (1 << 20),
                l.val_loss >= 0 ? ("  val " + std::to_string(l.val_loss)).c_str() : "", res.skipped ? "  (skipped)" : "");
  }
  std::fflush(stdout);
}

//! A validation between logged steps: its own line.
inline void print_validation(long step, double val_loss, bool json) {
  if (json) std::printf("%s\n", nlohmann::json{{"step", step}, {"val_loss", val_loss}}.dump().c_str());
  else std::printf("step %5ld  val loss %.4f\n", step, val_loss);
  std::fflush(stdout);
}

//! The run's end on rank 0, as the summary object (with --json) or the done
//! line; `s` holds the summary's fields (trainer_kit/loop.hpp's and the model's own).
inline void print_summary(const nlohmann::json& s, bool json, const std::string& note) {
  if (json) {
    std::printf("%s\n", s.dump().c_str());
    return;
  }
  const auto num = [&](const char* k) { return s.contains(k) ? s[k].get<double>() : 0.0; };
  const int N = s["world"].get<int>();
  const double tps = num("tokens_per_s");
  const auto peak = std::size_t(num("peak_bytes")), est = std::size_t(num("estimated_bytes"));
  const auto device = std::size_t(num("device_used_bytes")), off = std::size_t(num("offloaded_bytes"));
  std::printf("done: final loss %.4f%s, %.0f tokens/s over %d rank%s (%.0f and %.2f TFLOP/s per rank; steps after the "
              "first), peak %s MiB per rank (library buffers; estimate %s MiB%s)%s%s\n",
              num("final_loss"), s.contains("val_loss") ? (", validation loss " + std::to_string(num("val_loss"))).c_str() : "",
              tps, N, N == 1 ? "" : "s", tps / N, num("tflops") / N, mib(peak).c_str(), mib(est).c_str(),
              s["backend"] == "host" ? "" : ("; the device's own count " + std::to_string(device >> 20) + " MiB").c_str(),
              off ? (", offloaded " + mib(off) + " MiB in host memory (estimate " +
                     mib(std::size_t(num("estimated_offloaded_bytes"))) + " MiB)").c_str()
                  : "",
              note.c_str());
}

}  // namespace trainer_kit
