#pragma once
// Causal attention in fp32 arithmetic with grouped kv heads (GPT-2: as many
// kv heads as heads), the host layer's arithmetic (trainer_kit/host_layers.hpp)
// on the GPU: one block per (query row, sequence x head) keeps the row's
// scores in shared memory (no T x T matrix in global memory). What the fp32
// trainers run, and bf16 where no faster kernel applies (cuDNN's fused SDPA,
// GPT-2's flash kernels). Rows of qkv are [q (H heads) | k (KV) | v (KV)],
// each head's hd columns together; q head h reads kv head h / (H / KV).
#include <cuda_runtime.h>

#include <cfloat>
#include <cstddef>

#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "trainer_kit/kernels/launch.cuh"
#include "trainer_kit/kernels/reduce.cuh"

namespace trainer_kit::kernels {

//! Where a packed qkv row keeps each head (the device's copy of host::qkv_layout).
struct attention_shape {
  int H, KV, hd;
  __host__ __device__ int row() const { return (H + 2 * KV) * hd; }
  __host__ __device__ int q(int h) const { return h * hd; }
  __host__ __device__ int k(int h) const { return H * hd + (h / (H / KV)) * hd; }
  __host__ __device__ int v(int h) const { return (H + KV) * hd + (h / (H / KV)) * hd; }
};

//! One block per (query row i, sequence b x head h): the row's scores in
//! shared memory (T floats), its log-sum-exp kept for backward; y rows H hd (in C).
template <class C, class Q = float>
__global__ void attention_kernel(const Q* qkv, C* y, float* lse, int T, attention_shape A) {
  extern __shared__ float sh[];
  float* s = sh;        // T scores
  float* red = sh + T;  // 32 for reductions
  const int i = int(blockIdx.x), bh = int(blockIdx.y), b = bh / A.H, h = bh % A.H, hd = A.hd;
  const int d = A.H * hd, row = A.row();
  const float scale = rsqrtf(float(hd));
  const Q* q = qkv + (std::size_t(b) * T + i) * std::size_t(row) + A.q(h);
  float mx = -FLT_MAX;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const Q* k = qkv + (std::size_t(b) * T + j) * std::size_t(row) + A.k(h);
    float dot = 0;
    for (int c = 0; c < hd; ++c) dot += float(q[c]) * float(k[c]);
    s[j] = dot * scale;
    mx = fmaxf(mx, s[j]);
  }
  mx = block_reduce<true>(mx, red);
  float sum = 0;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) sum += __expf(s[j] - mx);
  sum = block_reduce<false>(sum, red);
  const float l = mx + __logf(sum);
  if (threadIdx.x == 0) lse[(std::size_t(b) * T + i) * A.H + h] = l;
  __syncthreads();
  for (int j = threadIdx.x; j <= i; j += blockDim.x) s[j] = __expf(s[j] - l);
  __syncthreads();
  C* out = y + (std::size_t(b) * T + i) * std::size_t(d) + std::size_t(h) * hd;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float acc = 0;
    for (int j = 0; j <= i; ++j) acc += s[j] * float(qkv[(std::size_t(b) * T + j) * std::size_t(row) + A.v(h) + c]);
    out[c] = tessera::convert<C>(acc);
  }
}

//! Attention backward, one block per (query row i, b x h): dq_i written;
//! dk_j and dv_j accumulated with atomics into dqkv (zeroed before), or with
//! Dvec (--deterministic) none of them: D_i = dy_i . y_i goes to Dvec, and
//! attention_backward_kv_kernel adds dk and dv in a fixed order.
template <class C, class Q = float>
__global__ void attention_backward_kernel(const Q* dy, const Q* qkv, const C* y, const float* lse, float* dqkv, int T,
                                          attention_shape A, float* Dvec = nullptr) {
  extern __shared__ float sh[];
  float* p = sh;        // T probabilities, then ds
  float* red = sh + T;  // 32
  const int i = int(blockIdx.x), bh = int(blockIdx.y), b = bh / A.H, h = bh % A.H, hd = A.hd;
  const int d = A.H * hd, row = A.row();
  const float scale = rsqrtf(float(hd));
  const std::size_t qi = (std::size_t(b) * T + i) * std::size_t(row) + A.q(h);
  const Q* q = qkv + qi;
  const Q* g = dy + (std::size_t(b) * T + i) * std::size_t(d) + std::size_t(h) * hd;
  const C* o = y + (std::size_t(b) * T + i) * std::size_t(d) + std::size_t(h) * hd;
  float Dp = 0;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) Dp += float(g[c]) * float(o[c]);
  const float D = block_reduce<false>(Dp, red);
  const float l = lse[(std::size_t(b) * T + i) * A.H + h];
  if (Dvec && threadIdx.x == 0) Dvec[(std::size_t(b) * T + i) * A.H + h] = D;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const std::size_t rj = (std::size_t(b) * T + j) * std::size_t(row);
    const Q* k = qkv + rj + A.k(h);
    const Q* v = qkv + rj + A.v(h);
    float dot = 0, dp = 0;
    for (int c = 0; c < hd; ++c) dot += float(q[c]) * float(k[c]), dp += float(g[c]) * float(v[c]);
    const float pj = __expf(dot * scale - l);
    const float ds = pj * (dp - D) * scale;
    p[j] = ds;
    if (Dvec) continue;
    for (int c = 0; c < hd; ++c) {
      atomicAdd(dqkv + rj + A.k(h) + c, ds * float(q[c]));
      atomicAdd(dqkv + rj + A.v(h) + c, pj * float(g[c]));
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float acc = 0;
    for (int j = 0; j <= i; ++j) acc += p[j] * float(qkv[(std::size_t(b) * T + j) * std::size_t(row) + A.k(h) + c]);
    dqkv[qi + c] = acc;
  }
}

//! dk_j and dv_j without atomics (--deterministic), after
//! attention_backward_kernel with Dvec: one block per (key row j, b x kv
//! head) walks the q heads that read it in order, and for each the query rows
//! i >= j, a chunk at a time: p_ij and ds_ij into shared memory, then each
//! thread adds its columns' share in (head, i) order (dqkv's dk and dv zeroed before).
template <class Q>
__global__ void attention_backward_kv_kernel(const Q* dy, const Q* qkv, const float* lse, const float* Dvec, float* dqkv,
                                             int T, attention_shape A) {
  constexpr int chunk = 512;
  __shared__ float p[chunk], ds[chunk];
  const int j = int(blockIdx.x), bk = int(blockIdx.y), b = bk / A.KV, kvh = bk % A.KV, hd = A.hd, group = A.H / A.KV;
  const int d = A.H * hd, row = A.row();
  const float scale = rsqrtf(float(hd));
  const std::size_t first = std::size_t(b) * std::size_t(T), rj = (first + j) * std::size_t(row);
  const std::size_t ko = std::size_t(A.H * hd + kvh * hd), vo = std::size_t((A.H + A.KV) * hd + kvh * hd);
  const Q* k = qkv + rj + ko;
  const Q* v = qkv + rj + vo;
  float ak_keep[4] = {}, av_keep[4] = {};  // hd up to 4 x blockDim.x columns a thread
  for (int hg = 0; hg < group; ++hg) {
    const int h = kvh * group + hg;
    for (int i0 = j; i0 < T; i0 += chunk) {
      const int i1 = min(T, i0 + chunk);
      __syncthreads();  // the previous chunk's p and ds are read
      for (int i = i0 + int(threadIdx.x); i < i1; i += int(blockDim.x)) {
        const Q* q = qkv + (first + i) * std::size_t(row) + std::size_t(h) * hd;
        const Q* g = dy + (first + i) * std::size_t(d) + std::size_t(h) * hd;
        float dot = 0, dp = 0;
        for (int c = 0; c < hd; ++c) dot += float(q[c]) * float(k[c]), dp += float(g[c]) * float(v[c]);
        const std::size_t at = (first + i) * std::size_t(A.H) + std::size_t(h);
        const float pj = __expf(dot * scale - lse[at]);
        p[i - i0] = pj;
        ds[i - i0] = pj * (dp - Dvec[at]) * scale;
      }
      __syncthreads();
      int slot = 0;
      for (int c = int(threadIdx.x); c < hd; c += int(blockDim.x), ++slot) {
        float ak = 0, av = 0;
        for (int i = i0; i < i1; ++i) {
          ak += ds[i - i0] * float(qkv[(first + i) * std::size_t(row) + std::size_t(h) * hd + c]);
          av += p[i - i0] * float(dy[(first + i) * std::size_t(d) + std::size_t(h) * hd + c]);
        }
        ak_keep[slot] += ak, av_keep[slot] += av;
      }
    }
  }
  int slot = 0;
  for (int c = int(threadIdx.x); c < hd; c += int(blockDim.x), ++slot) {
    dqkv[rj + ko + c] += ak_keep[slot];
    dqkv[rj + vo + c] += av_keep[slot];
  }
}

//! The exact attention's forward over B sequences of T (seq at most 8192: a
//! row of scores in shared memory).
template <class C, class Q>
void exact_attention(const Q* qkv, C* y, float* lse, int B, int T, attention_shape A, cudaStream_t s) {
  const dim3 g(unsigned(T), unsigned(B * A.H));
  attention_kernel<C, Q><<<g, 128, (std::size_t(T) + 32) * sizeof(float), s>>>(qkv, y, lse, T, A);
  check_launch();
}
//! Its backward into fp32 dqkv (zeroed by the caller); with Dvec (B T H
//! floats) dk and dv in a fixed order.
template <class C, class Q>
void exact_attention_backward(const Q* dy, const Q* qkv, const C* y, const float* lse, float* dqkv, int B, int T,
                              attention_shape A, float* Dvec, cudaStream_t s) {
  TESSERA_CHECK(!Dvec || A.hd <= 512, "the ordered attention backward keeps 4 columns a thread: head dimension at most 512");
  const dim3 g(unsigned(T), unsigned(B * A.H));
  attention_backward_kernel<C, Q><<<g, 128, (std::size_t(T) + 32) * sizeof(float), s>>>(dy, qkv, y, lse, dqkv, T, A, Dvec);
  if (Dvec)
    attention_backward_kv_kernel<Q><<<dim3(unsigned(T), unsigned(B * A.KV)), 128, 0, s>>>(dy, qkv, lse, Dvec, dqkv, T, A);
  check_launch();
}

}  // namespace trainer_kit::kernels
