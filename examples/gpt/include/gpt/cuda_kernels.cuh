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

#include <algorithm>
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

//! dx += LayerNorm backward of dout, and where dxc is given the new dx in C
//! too (what the next GEMM reads, so no conversion pass follows); dw, db
//! accumulate. A warp per row, the rows strided over the grid. Each lane
//! keeps its columns' (lane + 32 j, j < J) share of dw and db in registers
//! over all its rows; then the block's warps add theirs in shared memory (2 D
//! floats, dynamic) and the block adds the sum to the gradients once. J = 0:
//! no registers, every row adds into shared memory (any D). One atomic per
//! row and column, as this kernel first had, took four times the rest of it.
template <class C, int J>
__global__ void layernorm_backward_kernel(const float* dout, const float* x, const C* w, const float* mean,
                                          const float* rstd, float* dx, C* dxc, float* dw, float* db, int n, int D) {
  extern __shared__ float acc[];  // dw (D), then db (D)
  for (int c = threadIdx.x; c < 2 * D; c += blockDim.x) acc[c] = 0;
  __syncthreads();
  const int warps = int(blockDim.x / 32), lane = int(threadIdx.x & 31);
  float rw[J > 0 ? J : 1] = {}, rb[J > 0 ? J : 1] = {};
  for (int row = int(blockIdx.x) * warps + int(threadIdx.x / 32); row < n; row += int(gridDim.x) * warps) {
    const float* g = dout + std::size_t(row) * std::size_t(D);
    const float* r = x + std::size_t(row) * std::size_t(D);
    const float mu = mean[row], rs = rstd[row];
    float m1 = 0, m2 = 0;
    if constexpr (J > 0) {
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int c = lane + 32 * j;
        if (c < D) {
          const float gc = g[c], xh = (r[c] - mu) * rs, dxh = gc * float(w[c]);
          m1 += dxh, m2 += dxh * xh;
          rw[j] += gc * xh, rb[j] += gc;
        }
      }
    } else {
      for (int c = lane; c < D; c += 32) {
        const float xh = (r[c] - mu) * rs, dxh = g[c] * float(w[c]);
        m1 += dxh, m2 += dxh * xh;
        atomicAdd(acc + c, g[c] * xh);
        atomicAdd(acc + D + c, g[c]);
      }
    }
    m1 = warp_sum(m1) / float(D), m2 = warp_sum(m2) / float(D);
    for (int c = lane; c < D; c += 32) {
      const float xh = (r[c] - mu) * rs;
      const std::size_t k = std::size_t(row) * std::size_t(D) + std::size_t(c);
      const float v = dx[k] + rs * (g[c] * float(w[c]) - m1 - xh * m2);
      dx[k] = v;
      if (dxc) dxc[k] = convert<C>(v);
    }
  }
  if constexpr (J > 0) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = lane + 32 * j;
      if (c < D) atomicAdd(acc + c, rw[j]), atomicAdd(acc + D + c, rb[j]);
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < D; c += blockDim.x) {
    atomicAdd(dw + c, acc[c]);
    atomicAdd(db + c, acc[D + c]);
  }
}

//! Most columns layernorm_backward takes: its shared memory holds 2 D floats.
inline constexpr int layernorm_backward_max_d = 6144;

//! Launches layernorm_backward_kernel over n rows of D on `blocks` blocks of
//! 8 warps (0: two per SM of the current device, or fewer where n is small),
//! with registers for the columns where D <= 2048 (every GPT-2 size).
template <class C>
void layernorm_backward(const float* dout, const float* x, const C* w, const float* mean, const float* rstd, float* dx,
                        C* dxc, float* dw, float* db, int n, int D, cudaStream_t s, int blocks = 0) {
  if (blocks <= 0) {
    static const int sms = [] {
      int dev = 0, v = 0;
      cudaGetDevice(&dev);
      cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
      return v > 0 ? v : 1;
    }();
    blocks = std::min((n + 7) / 8, 2 * sms);
  }
  const unsigned grid = unsigned(std::max(blocks, 1));
  const std::size_t smem = 2 * std::size_t(D) * sizeof(float);
  const int per_lane = (D + 31) / 32;
  if (per_lane <= 8)
    layernorm_backward_kernel<C, 8><<<grid, 256, smem, s>>>(dout, x, w, mean, rstd, dx, dxc, dw, db, n, D);
  else if (per_lane <= 24)
    layernorm_backward_kernel<C, 24><<<grid, 256, smem, s>>>(dout, x, w, mean, rstd, dx, dxc, dw, db, n, D);
  else if (per_lane <= 64)
    layernorm_backward_kernel<C, 64><<<grid, 256, smem, s>>>(dout, x, w, mean, rstd, dx, dxc, dw, db, n, D);
  else
    layernorm_backward_kernel<C, 0><<<grid, 256, smem, s>>>(dout, x, w, mean, rstd, dx, dxc, dw, db, n, D);
}

//! y[i, c] += b[c] (rows of cols, fp32 or C).
template <class C, class Y = float>
__global__ void bias_kernel(Y* y, const C* b, std::size_t n, int cols) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n * std::size_t(cols);
       k += std::size_t(gridDim.x) * blockDim.x)
    y[k] = convert<Y>(float(y[k]) + float(b[k % std::size_t(cols)]));
}

//! h += b (the GELU input, kept for backward in H: fp32, or C where the
//! forward's fused form keeps it in C too); a = gelu(h) in C.
template <class H, class C>
__global__ void bias_gelu_kernel(H* h, const C* b, C* a, std::size_t n, int cols) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < n * std::size_t(cols);
       k += std::size_t(gridDim.x) * blockDim.x) {
    const H v = convert<H>(float(h[k]) + float(b[k % std::size_t(cols)]));
    h[k] = v;
    a[k] = convert<C>(gelu(float(v)));
  }
}

//! a = gelu(h) in C (recomputed in backward).
template <class H, class C>
__global__ void gelu_kernel(const H* h, C* a, std::size_t total) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < total; k += std::size_t(gridDim.x) * blockDim.x)
    a[k] = convert<C>(gelu(float(h[k])));
}

//! dh = da gelu'(h), in C.
template <class H, class C>
__global__ void gelu_backward_kernel(const float* da, const H* h, C* dh, std::size_t total) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < total; k += std::size_t(gridDim.x) * blockDim.x)
    dh[k] = convert<C>(da[k] * gelu_grad(float(h[k])));
}

//! out = in as fp32 (a bias in C for an epilogue whose output is fp32).
template <class C>
__global__ void widen_kernel(const C* in, float* out, int total) {
  for (int k = int(blockIdx.x * blockDim.x + threadIdx.x); k < total; k += int(gridDim.x * blockDim.x)) out[k] = float(in[k]);
}

//! out += in (a bias gradient an epilogue wrote, into the accumulated one).
template <class T = float>
__global__ void add_kernel(const T* in, float* out, int total) {
  for (int k = int(blockIdx.x * blockDim.x + threadIdx.x); k < total; k += int(gridDim.x * blockDim.x)) out[k] += float(in[k]);
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
//! backward. qkv rows [q | k | v] of 3 H hd (fp32, or C); y rows H hd (in C).
template <class C, class Q = float>
__global__ void attention_kernel(const Q* qkv, C* y, float* lse, int T, int H, int hd) {
  extern __shared__ float sh[];
  float* s = sh;           // T scores
  float* red = sh + T;     // 32 for reductions
  const int i = int(blockIdx.x), bh = int(blockIdx.y), b = bh / H, h = bh % H;
  const int d = H * hd, row = 3 * d;
  const float scale = rsqrtf(float(hd));
  const Q* q = qkv + (std::size_t(b) * T + i) * std::size_t(row) + std::size_t(h) * hd;
  float mx = -FLT_MAX;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const Q* k = qkv + (std::size_t(b) * T + j) * std::size_t(row) + d + std::size_t(h) * hd;
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
  if (threadIdx.x == 0) lse[(std::size_t(b) * T + i) * H + h] = l;
  __syncthreads();
  for (int j = threadIdx.x; j <= i; j += blockDim.x) s[j] = __expf(s[j] - l);
  __syncthreads();
  C* out = y + (std::size_t(b) * T + i) * std::size_t(d) + std::size_t(h) * hd;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float acc = 0;
    for (int j = 0; j <= i; ++j) acc += s[j] * float(qkv[(std::size_t(b) * T + j) * std::size_t(row) + 2 * d + std::size_t(h) * hd + c]);
    out[c] = convert<C>(acc);
  }
}

//! Attention backward, one block per (query row i, b x h): dq_i written,
//! dk_j and dv_j accumulated with atomics into dqkv (zeroed before).
template <class C, class Q = float>
__global__ void attention_backward_kernel(const Q* dy, const Q* qkv, const C* y, const float* lse, float* dqkv,
                                          int T, int H, int hd) {
  extern __shared__ float sh[];
  float* p = sh;        // T probabilities, then ds
  float* red = sh + T;  // 32
  const int i = int(blockIdx.x), bh = int(blockIdx.y), b = bh / H, h = bh % H;
  const int d = H * hd, row = 3 * d;
  const float scale = rsqrtf(float(hd));
  const std::size_t qi = (std::size_t(b) * T + i) * std::size_t(row) + std::size_t(h) * hd;
  const Q* q = qkv + qi;
  const Q* g = dy + (std::size_t(b) * T + i) * std::size_t(d) + std::size_t(h) * hd;
  const C* o = y + (std::size_t(b) * T + i) * std::size_t(d) + std::size_t(h) * hd;
  float Dp = 0;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) Dp += float(g[c]) * float(o[c]);
  const float D = block_reduce<false>(Dp, red);
  const float l = lse[(std::size_t(b) * T + i) * H + h];
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const std::size_t kj = (std::size_t(b) * T + j) * std::size_t(row) + d + std::size_t(h) * hd;
    const Q* k = qkv + kj;
    const Q* v = qkv + kj + d;
    float dot = 0, dp = 0;
    for (int c = 0; c < hd; ++c) dot += float(q[c]) * float(k[c]), dp += float(g[c]) * float(v[c]);
    const float pj = __expf(dot * scale - l);
    const float ds = pj * (dp - D) * scale;
    p[j] = ds;
    for (int c = 0; c < hd; ++c) {
      atomicAdd(dqkv + kj + c, ds * float(q[c]));
      atomicAdd(dqkv + kj + d + c, pj * float(g[c]));
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float acc = 0;
    for (int j = 0; j <= i; ++j) acc += p[j] * float(qkv[(std::size_t(b) * T + j) * std::size_t(row) + d + std::size_t(h) * hd + c]);
    dqkv[qi + c] = acc;
  }
}

// (max, sum of exp(v - max)) pairs combined: the online softmax's reduction.
__device__ inline void softmax_combine(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  s = s * __expf(m - mn) + s2 * __expf(m2 - mn);
  m = mn;
}

//! One block per row of logits in C (fp32, or bf16 as the bf16 classifier
//! writes them), rows ld apart with the real vocabulary V <= ld first: the
//! row's cross-entropy over the V real entries into *loss (double atomics)
//! and, with `grad`, dloss/dz x scale written over the logits in place, zero
//! in the ld - V padded columns (so the padded rows of a tied table get no
//! gradient). Max and sum in one pass (online softmax), so the logits are
//! read twice in all. The padding lets the classifier's GEMMs run on aligned
//! rows.
template <class C>
__global__ void cross_entropy_kernel(C* z, const std::uint16_t* target, int V, int ld, float scale, bool grad,
                                     double* loss) {
  __shared__ float red_m[32], red_s[32];
  const std::size_t r = blockIdx.x;
  C* row = z + r * std::size_t(ld);
  float m = -FLT_MAX, s = 0;
  for (int c = threadIdx.x; c < V; c += blockDim.x) {
    const float v = float(row[c]);
    if (v > m) s = s * __expf(m - v) + 1.0f, m = v;
    else s += __expf(v - m);
  }
  for (int o = 16; o > 0; o >>= 1)
    softmax_combine(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5), warps = int(blockDim.x >> 5);
  if (lane == 0) red_m[warp] = m, red_s[warp] = s;
  __syncthreads();
  m = lane < warps ? red_m[lane] : -FLT_MAX;
  s = lane < warps ? red_s[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1)
    softmax_combine(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  const int t = target[r];
  const float zt = float(row[t]);
  if (threadIdx.x == 0) atomicAdd(loss, double(logf(s) + m - zt));
  if (!grad) return;
  __syncthreads();  // every thread has read row[t] before it is overwritten
  const float inv = 1.0f / s;
  for (int c = threadIdx.x; c < ld; c += blockDim.x)
    row[c] = c < V ? convert<C>((__expf(float(row[c]) - m) * inv - (c == t ? 1.0f : 0.0f)) * scale) : convert<C>(0.0f);
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
