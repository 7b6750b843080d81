#pragma once
// GPT-2's layers on the GPU, the same arithmetic as host_kernels.hpp: the
// residual stream, GEMM outputs and statistics in fp32; what feeds a GEMM
// (LayerNorm outputs, attention outputs, GELU outputs, gradients) in the
// compute type C (fp32 or bf16). Written to be correct and simple first:
// attention holds one query row's scores in shared memory (no T x T matrix
// in global memory) but is not yet a tiled flash kernel; weight-gradient
// reductions of LayerNorm and the embeddings use atomics. The speed issue
// replaces these where the profile says the time goes.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "tessera/core/dtype.hpp"
#include "trainer_kit/host_math.hpp"

namespace gpt::kernels {

using tessera::convert;

using trainer_kit::gelu;
using trainer_kit::gelu_grad;

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide sum or max (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <bool Max>
__device__ inline float block_reduce(float v, float* smem /* 32 */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = Max ? warp_max(v) : warp_sum(v);
  __syncthreads();  // smem may still be read from a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < warps ? smem[lane] : (Max ? -FLT_MAX : 0.0f);
  return Max ? warp_max(v) : warp_sum(v);
}

//! x[i] = wte[tok[i]] + wpe[i % T] (fp32 rows of D).
template <class C>
__global__ void embed_kernel(const std::uint16_t* tok, const C* wte, const C* wpe, float* x, std::size_t n, int T, int D) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n * std::size_t(D);
       k += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t i = k / std::size_t(D), c = k % std::size_t(D);
    x[k] = float(wte[std::size_t(tok[i]) * std::size_t(D) + c]) + float(wpe[(i % std::size_t(T)) * std::size_t(D) + c]);
  }
}

//! One warp per row: out = (x - mean) rstd w + b (in C), mean and rstd kept.
template <class C>
__global__ void layernorm_kernel(const float* x, const C* w, const C* b, C* out, float* mean, float* rstd, int n, int D) {
  const int row = int(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32), lane = threadIdx.x & 31;
  if (row >= n) return;
  const float* r = x + std::size_t(row) * std::size_t(D);
  float s = 0;
  for (int c = lane; c < D; c += 32) s += r[c];
  const float mu = warp_sum(s) / float(D);
  float s2 = 0;
  for (int c = lane; c < D; c += 32) s2 += (r[c] - mu) * (r[c] - mu);
  const float rs = rsqrtf(warp_sum(s2) / float(D) + 1e-5f);
  if (lane == 0) mean[row] = mu, rstd[row] = rs;
  for (int c = lane; c < D; c += 32)
    out[std::size_t(row) * std::size_t(D) + c] = convert<C>((r[c] - mu) * rs * float(w[c]) + float(b[c]));
}

//! One warp per row: dx += LayerNorm backward of dout; dw, db accumulate (atomics).
template <class C>
__global__ void layernorm_backward_kernel(const float* dout, const float* x, const C* w, const float* mean,
                                          const float* rstd, float* dx, float* dw, float* db, int n, int D) {
  const int row = int(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32), lane = threadIdx.x & 31;
  if (row >= n) return;
  const float* g = dout + std::size_t(row) * std::size_t(D);
  const float* r = x + std::size_t(row) * std::size_t(D);
  const float mu = mean[row], rs = rstd[row];
  float m1 = 0, m2 = 0;
  for (int c = lane; c < D; c += 32) {
    const float xh = (r[c] - mu) * rs, dxh = g[c] * float(w[c]);
    m1 += dxh, m2 += dxh * xh;
    atomicAdd(dw + c, g[c] * xh);
    atomicAdd(db + c, g[c]);
  }
  m1 = warp_sum(m1) / float(D), m2 = warp_sum(m2) / float(D);
  for (int c = lane; c < D; c += 32) {
    const float xh = (r[c] - mu) * rs;
    dx[std::size_t(row) * std::size_t(D) + c] += rs * (g[c] * float(w[c]) - m1 - xh * m2);
  }
}

//! y[i, c] += b[c] (fp32 rows of cols).
template <class C>
__global__ void bias_kernel(float* y, const C* b, std::size_t n, int cols) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n * std::size_t(cols);
       k += std::size_t(gridDim.x) * blockDim.x)
    y[k] += float(b[k % std::size_t(cols)]);
}

//! h += b (the GELU input, kept in fp32); a = gelu(h) in C.
template <class C>
__global__ void bias_gelu_kernel(float* h, const C* b, C* a, std::size_t n, int cols) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n * std::size_t(cols);
       k += std::size_t(gridDim.x) * blockDim.x) {
    const float v = h[k] + float(b[k % std::size_t(cols)]);
    h[k] = v;
    a[k] = convert<C>(gelu(v));
  }
}

//! a = gelu(h) in C (recomputed in backward).
template <class C>
__global__ void gelu_kernel(const float* h, C* a, std::size_t total) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < total; k += std::size_t(gridDim.x) * blockDim.x)
    a[k] = convert<C>(gelu(h[k]));
}

//! dh = da gelu'(h), in C.
template <class C>
__global__ void gelu_backward_kernel(const float* da, const float* h, C* dh, std::size_t total) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < total; k += std::size_t(gridDim.x) * blockDim.x)
    dh[k] = convert<C>(da[k] * gelu_grad(h[k]));
}

//! out = in, converted (fp32 to C).
template <class C>
__global__ void convert_kernel(const float* in, C* out, std::size_t total) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < total; k += std::size_t(gridDim.x) * blockDim.x)
    out[k] = convert<C>(in[k]);
}

//! out[c] += sum over rows of y[row, c]: blocks of 256 columns x 256 rows, one atomic per column and block.
template <class T>
__global__ void column_sum_kernel(const T* y, int n, int cols, float* out) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= cols) return;
  const int r0 = int(blockIdx.y) * 256, r1 = min(n, r0 + 256);
  float s = 0;
  for (int r = r0; r < r1; ++r) s += float(y[std::size_t(r) * std::size_t(cols) + c]);
  atomicAdd(out + c, s);
}

//! Causal attention, one block per (query row i, sequence b x head h): the
//! row's scores in shared memory (T floats), its log-sum-exp kept for
//! backward. qkv rows [q | k | v] of 3 H hd floats; y rows H hd (in C).
template <class C>
__global__ void attention_kernel(const float* qkv, C* y, float* lse, int T, int H, int hd) {
  extern __shared__ float sh[];
  float* s = sh;           // T scores
  float* red = sh + T;     // 32 for reductions
  const int i = int(blockIdx.x), bh = int(blockIdx.y), b = bh / H, h = bh % H;
  const int d = H * hd, row = 3 * d;
  const float scale = rsqrtf(float(hd));
  const float* q = qkv + (std::size_t(b) * T + i) * std::size_t(row) + std::size_t(h) * hd;
  float mx = -FLT_MAX;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const float* k = qkv + (std::size_t(b) * T + j) * std::size_t(row) + d + std::size_t(h) * hd;
    float dot = 0;
    for (int c = 0; c < hd; ++c) dot += q[c] * k[c];
    s[j] = dot * scale;
    mx = fmaxf(mx, s[j]);
  }
  mx = block_reduce<true>(mx, red);
  float sum = 0;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) sum += __expf(s[j] - mx);
  sum = block_reduce<false>(sum, red);
  const float l = mx + __logf(sum);
  if (threadIdx.x == 0) lse[(std::size_t(b) * T + i) * H + h] = l;
  __syncthreads();
  for (int j = threadIdx.x; j <= i; j += blockDim.x) s[j] = __expf(s[j] - l);
  __syncthreads();
  C* out = y + (std::size_t(b) * T + i) * std::size_t(d) + std::size_t(h) * hd;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float acc = 0;
    for (int j = 0; j <= i; ++j) acc += s[j] * qkv[(std::size_t(b) * T + j) * std::size_t(row) + 2 * d + std::size_t(h) * hd + c];
    out[c] = convert<C>(acc);
  }
}

//! Attention backward, one block per (query row i, b x h): dq_i written,
//! dk_j and dv_j accumulated with atomics into dqkv (zeroed before).
template <class C>
__global__ void attention_backward_kernel(const float* dy, const float* qkv, const C* y, const float* lse, float* dqkv,
                                          int T, int H, int hd) {
  extern __shared__ float sh[];
  float* p = sh;        // T probabilities, then ds
  float* red = sh + T;  // 32
  const int i = int(blockIdx.x), bh = int(blockIdx.y), b = bh / H, h = bh % H;
  const int d = H * hd, row = 3 * d;
  const float scale = rsqrtf(float(hd));
  const std::size_t qi = (std::size_t(b) * T + i) * std::size_t(row) + std::size_t(h) * hd;
  const float* q = qkv + qi;
  const float* g = dy + (std::size_t(b) * T + i) * std::size_t(d) + std::size_t(h) * hd;
  const C* o = y + (std::size_t(b) * T + i) * std::size_t(d) + std::size_t(h) * hd;
  float Dp = 0;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) Dp += g[c] * float(o[c]);
  const float D = block_reduce<false>(Dp, red);
  const float l = lse[(std::size_t(b) * T + i) * H + h];
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const std::size_t kj = (std::size_t(b) * T + j) * std::size_t(row) + d + std::size_t(h) * hd;
    const float* k = qkv + kj;
    const float* v = qkv + kj + d;
    float dot = 0, dp = 0;
    for (int c = 0; c < hd; ++c) dot += q[c] * k[c], dp += g[c] * v[c];
    const float pj = __expf(dot * scale - l);
    const float ds = pj * (dp - D) * scale;
    p[j] = ds;
    for (int c = 0; c < hd; ++c) {
      atomicAdd(dqkv + kj + c, ds * q[c]);
      atomicAdd(dqkv + kj + d + c, pj * g[c]);
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float acc = 0;
    for (int j = 0; j <= i; ++j) acc += p[j] * qkv[(std::size_t(b) * T + j) * std::size_t(row) + d + std::size_t(h) * hd + c];
    dqkv[qi + c] = acc;
  }
}

//! One block per row of V logits: the row's cross-entropy into *loss
//! (double atomics) and, where dz is given, dloss/dz x scale in C.
template <class C>
__global__ void cross_entropy_kernel(const float* z, const std::uint16_t* target, int V, float scale, C* dz, double* loss) {
  __shared__ float red[32];
  const std::size_t r = blockIdx.x;
  const float* row = z + r * std::size_t(V);
  float mx = -FLT_MAX;
  for (int c = threadIdx.x; c < V; c += blockDim.x) mx = fmaxf(mx, row[c]);
  mx = block_reduce<true>(mx, red);
  float sum = 0;
  for (int c = threadIdx.x; c < V; c += blockDim.x) sum += __expf(row[c] - mx);
  sum = block_reduce<false>(sum, red);
  const int t = target[r];
  if (threadIdx.x == 0) atomicAdd(loss, double(logf(sum) + mx - row[t]));
  if (!dz) return;
  const float inv = 1.0f / sum;
  for (int c = threadIdx.x; c < V; c += blockDim.x)
    dz[r * std::size_t(V) + c] = convert<C>((__expf(row[c] - mx) * inv - (c == t ? 1.0f : 0.0f)) * scale);
}

//! The embeddings' backward: gwte[tok[i]] += dx[i], gwpe[i % T] += dx[i] (atomics: tokens repeat).
template <class T = float>
__global__ void embed_backward_kernel(const T* dx, const std::uint16_t* tok, float* gwte, float* gwpe,
                                      std::size_t n, int seq, int D) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n * std::size_t(D);
       k += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t i = k / std::size_t(D), c = k % std::size_t(D);
    atomicAdd(gwte + std::size_t(tok[i]) * std::size_t(D) + c, float(dx[k]));
    atomicAdd(gwpe + (i % std::size_t(seq)) * std::size_t(D) + c, float(dx[k]));
  }
}

}  // namespace gpt::kernels
