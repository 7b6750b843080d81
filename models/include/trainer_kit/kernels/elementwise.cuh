#pragma once
// The reference models' element-wise kernels, as forms over small functors
// (CUTLASS's epilogue visitors, cuBLASLt's epilogues): a unary map (an
// activation, a cast), a binary map (an activation's gradient, SwiGLU), a
// bias added over rows, a bias and an activation whose input is kept for
// backward; and the bookkeeping the nets run around their products (sums
// handed on, spans zeroed). The functors are the ones a fused product runs,
// so a model's fused and separate forms compute the same function. Each map
// moves 16 bytes a thread where its pointers allow (one element a thread ran
// at a third of copy speed), the tail one element at a time; arithmetic in
// fp32, each output rounded once.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "tessera/backend/cuda/stream.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/vec.hpp"
#include "trainer_kit/host_math.hpp"
#include "trainer_kit/kernels/launch.cuh"

namespace trainer_kit::kernels {

using tessera::convert;

// ---- the functors (float in, float out) ----
//! GELU (tanh form): gelu_fast where the output is rounded to 16 bits
//! (host_math.hpp: the same function, fewer instructions), gelu() for fp32
//! outputs (the host's arithmetic).
template <bool Fast>
struct gelu_op {
  TESSERA_HOST_DEVICE float operator()(float x) const { return Fast ? gelu_fast(x) : gelu(x); }
};
template <class Out> using gelu_for = gelu_op<sizeof(Out) == 2>;
//! dL/dh = dL/da gelu'(h).
struct gelu_backward_op {
  TESSERA_HOST_DEVICE float operator()(float da, float h) const { return da * gelu_grad(h); }
};
struct silu_op {
  TESSERA_HOST_DEVICE float operator()(float x) const { return silu(x); }
};
//! SwiGLU: silu(gate) up.
struct swiglu_op {
  TESSERA_HOST_DEVICE float operator()(float gate, float up) const { return silu(gate) * up; }
};
struct identity_op {
  TESSERA_HOST_DEVICE float operator()(float x) const { return x; }
};

//! Elements a thread moves at once: 16 bytes of the wider type.
template <class A, class B> inline constexpr int vec_width = int(16 / std::max(sizeof(A), sizeof(B)));

template <class In, class Out, class F>
__global__ void map_kernel(const In* in, Out* out, std::size_t total, F f, bool vectors) {
  constexpr int V = vec_width<In, Out>;
  const std::size_t first = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x, stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t done = 0;
  if (vectors) {
    const std::size_t vecs = total / V;
    for (std::size_t k = first; k < vecs; k += stride) {
      const tessera::vec<In, V> x = tessera::load_vec<V>(in + k * V);
      tessera::vec<Out, V> y;
#pragma unroll
      for (int i = 0; i < V; ++i) y.v[i] = convert<Out>(f(convert<float>(x.v[i])));
      tessera::store_vec<V>(out + k * V, y);
    }
    done = vecs * V;
  }
  for (std::size_t k = done + first; k < total; k += stride) out[k] = convert<Out>(f(convert<float>(in[k])));
}

template <class A, class B, class Out, class F>
__global__ void map2_kernel(const A* a, const B* b, Out* out, std::size_t total, F f, bool vectors) {
  constexpr int V = std::min(vec_width<A, Out>, vec_width<B, Out>);
  const std::size_t first = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x, stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t done = 0;
  if (vectors) {
    const std::size_t vecs = total / V;
    for (std::size_t k = first; k < vecs; k += stride) {
      const tessera::vec<A, V> x = tessera::load_vec<V>(a + k * V);
      const tessera::vec<B, V> z = tessera::load_vec<V>(b + k * V);
      tessera::vec<Out, V> y;
#pragma unroll
      for (int i = 0; i < V; ++i) y.v[i] = convert<Out>(f(convert<float>(x.v[i]), convert<float>(z.v[i])));
      tessera::store_vec<V>(out + k * V, y);
    }
    done = vecs * V;
  }
  for (std::size_t k = done + first; k < total; k += stride)
    out[k] = convert<Out>(f(convert<float>(a[k]), convert<float>(b[k])));
}

//! out[k] = f(in[k]) over `total` elements (in and out may be the same array).
template <class In, class Out, class F>
void map(const In* in, Out* out, std::size_t total, F f, cudaStream_t s = tessera::cuda::current_stream()) {
  if (total == 0) return;
  constexpr int V = vec_width<In, Out>;
  const bool vectors = reinterpret_cast<std::uintptr_t>(in) % (sizeof(In) * V) == 0 &&
                       reinterpret_cast<std::uintptr_t>(out) % (sizeof(Out) * V) == 0;
  map_kernel<<<grid(total), 256, 0, s>>>(in, out, total, f, vectors);
  check_launch();
}
//! out[k] = f(a[k], b[k]) over `total` elements (out may be a or b).
template <class A, class B, class Out, class F>
void map2(const A* a, const B* b, Out* out, std::size_t total, F f, cudaStream_t s = tessera::cuda::current_stream()) {
  if (total == 0) return;
  constexpr int V = std::min(vec_width<A, Out>, vec_width<B, Out>);
  const bool vectors = reinterpret_cast<std::uintptr_t>(a) % (sizeof(A) * V) == 0 &&
                       reinterpret_cast<std::uintptr_t>(b) % (sizeof(B) * V) == 0 &&
                       reinterpret_cast<std::uintptr_t>(out) % (sizeof(Out) * V) == 0;
  map2_kernel<<<grid(total), 256, 0, s>>>(a, b, out, total, f, vectors);
  check_launch();
}

//! a = gelu(h): a block's activation (recomputed in backward from its kept input).
template <class H, class C>
void gelu(const H* h, C* a, std::size_t total, cudaStream_t s = tessera::cuda::current_stream()) {
  map(h, a, total, gelu_for<C>{}, s);
}
//! dh = da gelu'(h) (dh may be da: in place).
template <class DA, class H, class C>
void gelu_backward(const DA* da, const H* h, C* dh, std::size_t total, cudaStream_t s = tessera::cuda::current_stream()) {
  map2(da, h, dh, total, gelu_backward_op{}, s);
}
//! out = in, converted (fp32 to the compute type or back).
template <class In, class Out>
void convert_into(const In* in, Out* out, std::size_t total, cudaStream_t s = tessera::cuda::current_stream()) {
  map(in, out, total, identity_op{}, s);
}

// Y[r, c] += b[c] (Y and b of any element types): thread x of the grid's x
// extent takes columns [V x, V x + V) and keeps their bias in registers; the
// grid's y extent strides over rows. No index division (the element-wise
// form's 64-bit modulo per element made it several times slower than a copy).
template <class Y, class Bias, int V>
__global__ void add_bias_vec_kernel(Y* y, const Bias* b, int n, int cols) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c >= cols) return;
  const tessera::vec<Bias, V> bv = tessera::load_vec<V>(b + c);
  float bias[V];
#pragma unroll
  for (int k = 0; k < V; ++k) bias[k] = convert<float>(bv.v[k]);
  for (int r = int(blockIdx.y); r < n; r += int(gridDim.y)) {
    Y* row = y + std::size_t(r) * std::size_t(cols) + std::size_t(c);
    tessera::vec<Y, V> x = tessera::load_vec<V>(row);
#pragma unroll
    for (int k = 0; k < V; ++k) x.v[k] = convert<Y>(convert<float>(x.v[k]) + bias[k]);
    tessera::store_vec<V>(row, x);
  }
}
template <class Y, class Bias>
__global__ void add_bias_kernel(Y* y, const Bias* b, std::size_t n, int cols) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n * std::size_t(cols);
       k += std::size_t(gridDim.x) * blockDim.x)
    y[k] = convert<Y>(convert<float>(y[k]) + convert<float>(b[k % std::size_t(cols)]));
}
//! Y[n, cols] += b.
template <class Y, class Bias>
void add_bias(Y* y, const Bias* b, std::size_t n, int cols, cudaStream_t s = tessera::cuda::current_stream()) {
  const std::size_t total = n * std::size_t(cols);
  if (total == 0) return;
  constexpr int V = vec_width<Y, Bias>;
  if (cols % V == 0 && aligned16(y) && aligned16(b) && n <= (std::size_t(1) << 31)) {
    const unsigned threads = unsigned(std::min(128, ((cols / V + 31) / 32) * 32));
    const unsigned bx = unsigned((cols / V + int(threads) - 1) / int(threads));
    // About 4096 blocks in all, each over at least two rows.
    const unsigned by = unsigned(std::max<std::size_t>(1, std::min<std::size_t>((n + 1) / 2, 4096 / bx + 1)));
    add_bias_vec_kernel<Y, Bias, V><<<dim3(bx, by), threads, 0, s>>>(y, b, int(n), cols);
  } else {
    add_bias_kernel<<<grid(total), 256, 0, s>>>(y, b, n, cols);
  }
  check_launch();
}

//! h += b, kept in H (the activation's input, for backward); a = f(h) in C,
//! of h as kept (its rounding included, as backward will read it).
template <class H, class Bias, class C, class F>
__global__ void bias_act_kernel(H* h, const Bias* b, C* a, std::size_t n, int cols, F f) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n * std::size_t(cols);
       k += std::size_t(gridDim.x) * blockDim.x) {
    const H v = convert<H>(convert<float>(h[k]) + convert<float>(b[k % std::size_t(cols)]));
    h[k] = v;
    a[k] = convert<C>(f(convert<float>(v)));
  }
}
//! The bias + GELU epilogue's separate form: h[n, cols] += b (kept), a = gelu(h).
template <class H, class Bias, class C>
void bias_gelu(H* h, const Bias* b, C* a, std::size_t n, int cols, cudaStream_t s = tessera::cuda::current_stream()) {
  if (n * std::size_t(cols) == 0) return;
  bias_act_kernel<<<grid(n * std::size_t(cols)), 256, 0, s>>>(h, b, a, n, cols, gelu_for<C>{});
  check_launch();
}

//! out += in over `total` (a sum an epilogue wrote, into the accumulated one);
//! with `overwrite`, out = in.
template <class T>
__global__ void add_into_kernel(const T* in, float* out, int total, bool overwrite) {
  for (int k = int(blockIdx.x * blockDim.x + threadIdx.x); k < total; k += int(gridDim.x * blockDim.x))
    out[k] = overwrite ? convert<float>(in[k]) : out[k] + convert<float>(in[k]);
}
template <class T>
void add_into(const T* in, float* out, int total, bool overwrite = false,
              cudaStream_t s = tessera::cuda::current_stream()) {
  if (total == 0) return;
  add_into_kernel<<<grid(std::size_t(total)), 256, 0, s>>>(in, out, total, overwrite);
  check_launch();
}

//! out += in, then in = 0: a sum handed on, its buffer ready to gather the next.
template <class T = float>
__global__ void drain_kernel(T* in, float* out, int total) {
  for (int k = int(blockIdx.x * blockDim.x + threadIdx.x); k < total; k += int(gridDim.x * blockDim.x)) {
    out[k] += float(in[k]);
    in[k] = T(0);
  }
}
inline void drain(float* in, float* out, int total, cudaStream_t s = tessera::cuda::current_stream()) {
  drain_kernel<float><<<grid(std::size_t(total)), 256, 0, s>>>(in, out, total);
  check_launch();
}

//! Up to 8 float spans, zeroed by one zero_spans launch.
struct float_spans {
  static constexpr int capacity = 8;
  float* p[capacity] = {};
  int n[capacity] = {};
  int count = 0;
  void add(float* at, std::size_t elems) {
    TESSERA_CHECK(count < capacity, "float_spans holds ", capacity, " spans");
    p[count] = at, n[count] = int(elems), ++count;
  }
};
//! Zeroes each span of s, span blockIdx.y (a template: a header's kernel, defined in every unit that includes it).
template <class Spans = float_spans>
__global__ void zero_spans_kernel(Spans s) {
  const int v = int(blockIdx.y);
  for (int k = int(blockIdx.x * blockDim.x + threadIdx.x); k < s.n[v]; k += int(gridDim.x * blockDim.x)) s.p[v][k] = 0;
}
//! Zeroes s's spans in one launch (nothing when it has none).
inline void zero_spans(const float_spans& s, cudaStream_t stream = tessera::cuda::current_stream()) {
  if (s.count == 0) return;
  const int most = *std::max_element(s.n, s.n + s.count);
  const unsigned blocks = unsigned(std::clamp((most + 1023) / 1024, 1, 1024));  // 4 elements a thread
  zero_spans_kernel<float_spans><<<dim3(blocks, unsigned(s.count)), 256, 0, stream>>>(s);
  check_launch();
}

}  // namespace trainer_kit::kernels
