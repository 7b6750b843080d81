#pragma once
// Llama's rotary tables: the cos and sin of each position's rotation, as
// transformers computes them (LlamaRotaryEmbedding with rope_type default or
// llama3), in fp32 step by step, so that the trainer's rotations are those
// of LlamaForCausalLM: inv_freq = 1 / theta^(2i / hd); Llama 3's scaling
// divides the low frequencies by `factor`, keeps the high ones and blends
// between; the angle of position p is p inv_freq, rounded once.
#include <cmath>
#include <cstddef>
#include <vector>

#include "llama/model.hpp"

namespace llama {

//! inv_freq[i], i < head_dim / 2.
inline std::vector<float> inverse_frequencies(const model_shape& s) {
  const int dim = s.head_dim(), half = dim / 2;
  std::vector<float> inv(static_cast<std::size_t>(half));
  for (int i = 0; i < half; ++i) inv[std::size_t(i)] = 1.0f / std::pow(float(s.rope_theta), float(2 * i) / float(dim));
  if (!s.scaling.on()) return inv;
  const rope_scaling& r = s.scaling;
  const float factor = float(r.factor), low = float(r.low_freq_factor);
  const float old = float(r.original_max_position);
  const float low_wavelen = float(double(r.original_max_position) / r.low_freq_factor);
  const float high_wavelen = float(double(r.original_max_position) / r.high_freq_factor);
  const float span = float(r.high_freq_factor - r.low_freq_factor);
  for (float& f : inv) {
    const float wavelen = float(2.0 * 3.141592653589793) / f;
    const float scaled = wavelen > low_wavelen ? f / factor : f;
    const float smooth = (old / wavelen - low) / span;
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    f = medium ? smoothed : scaled;
  }
  return inv;
}

//! cos and sin [rows, head_dim / 2] for positions 0 .. rows - 1.
struct rope_tables {
  std::vector<float> cos, sin;
  rope_tables(const model_shape& s, int rows) {
    const std::vector<float> inv = inverse_frequencies(s);
    const std::size_t half = inv.size();
    cos.resize(std::size_t(rows) * half), sin.resize(std::size_t(rows) * half);
    for (int p = 0; p < rows; ++p)
      for (std::size_t i = 0; i < half; ++i) {
        const float a = float(p) * inv[i];
        cos[std::size_t(p) * half + i] = std::cos(a);
        sin[std::size_t(p) * half + i] = std::sin(a);
      }
  }
};

}  // namespace llama
