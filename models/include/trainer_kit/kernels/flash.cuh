#pragma once
// Causal attention on tensor cores, flash style (Dao, FlashAttention-2): the
// T x T scores are never in memory. Forward: a block of 4 warps takes 64
// query rows of one (sequence, head), each warp 16 rows, and walks the key
// tiles up to its diagonal with an online softmax; the scores, the
// probabilities and the output live in mma.sync registers. Backward: a block
// takes 64 keys, walks the query tiles from its diagonal down, keeps dK and
// dV in registers and adds dQ into fp32 memory with atomics.
//
// Operands are rounded to bf16 (q, k, v, dO, P, dS) and every product
// accumulates in fp32, as cuDNN's and PyTorch's bf16 attention do; the fp32
// trainers keep the exact kernels of kernels/attention.cuh. Head dimension 64
// (every GPT-2 size); a tile holds 64 rows, a sequence of any length (rows
// past it read as zero and are never written). mma.sync.m16n8k16 needs
// sm_80; on older targets the kernels compile to nothing and supported()
// says no.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "trainer_kit/kernels/flash_detail.cuh"

namespace trainer_kit::flash {

//! y = softmax(q k^T scale, causal) v and the rows' natural log-sum-exp,
//! grid (query tiles, B x H), 128 threads. qkv rows [q | k | v] of 3 H 64
//! floats; y rows of H 64 in C; lse[(b T + i) H + h].
template <class C, class In>
__global__ void __launch_bounds__(threads) forward_kernel(const In* qkv, C* y, float* lse, int T, int H, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace detail;
  __shared__ __align__(16) bf16 ks[tile * pitch];  // keys [key][dim]
  __shared__ __align__(16) bf16 vs[tile * pitch];  // values [key][dim]
  const auto [qt, b, h, d, row, warp, g, t] = query_tile_of(H);
  const In* base = qkv + std::size_t(b) * std::size_t(T) * row + std::size_t(h) * head_dim;
  const int r0 = qt * tile + warp * 16, rows[2] = {r0 + g, r0 + g + 8};
  std::uint32_t qa[4][4];
  load_a(base, row, r0, T, qa);
  const float sl2 = scale * log2e;  // scores in the log2 domain: exp2f
  float o[8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // the previous tile is read by every warp
    load_tile(base + d, row, kt * tile, T, ks);
    load_tile(base + 2 * d, row, kt * tile, T, vs);
    __syncthreads();
    float s[8][4] = {};
    for (int nt = 0; nt < 8; ++nt)
      for (int kk = 0; kk < 4; ++kk) mma_tile(s[nt], qa[kk], ks, nt * 8 + g, kk * 16 + 2 * t);
    float mx[2] = {-INFINITY, -INFINITY};
    for (int nt = 0; nt < 8; ++nt)
      for (int e = 0; e < 4; ++e) {
        float v = s[nt][e] * sl2;
        if (kt == qt && kt * tile + nt * 8 + 2 * t + (e & 1) > rows[e >> 1]) v = -INFINITY;  // the future
        s[nt][e] = v;
        mx[e >> 1] = fmaxf(mx[e >> 1], v);
      }
    float alpha[2];
    for (int i = 0; i < 2; ++i) {
      // Key 0 is in the first tile of every row, so m is finite from then on.
      const float mn = fmaxf(m[i], quad_max(mx[i]));
      alpha[i] = exp2f(m[i] - mn);
      m[i] = mn;
      l[i] *= alpha[i];
    }
    for (int nt = 0; nt < 8; ++nt)
      for (int e = 0; e < 4; ++e) {
        o[nt][e] *= alpha[e >> 1];
        const float p = exp2f(s[nt][e] - m[e >> 1]);
        s[nt][e] = p;
        l[e >> 1] += p;
      }
    for (int j = 0; j < 4; ++j) {
      std::uint32_t pa[4];
      to_a(s, j, pa);
      mma_rows(o, pa, vs, j * 16);  // O += P V
    }
  }
  for (int i = 0; i < 2; ++i) {
    const float sum = quad_sum(l[i]);
    const int r = rows[i];
    if (r >= T) continue;
    const float inv = 1.0f / sum;
    C* out = y + (std::size_t(b) * std::size_t(T) + std::size_t(r)) * std::size_t(d) + std::size_t(h) * head_dim;
    for (int nt = 0; nt < 8; ++nt) {
      out[nt * 8 + 2 * t] = tessera::convert<C>(o[nt][2 * i] * inv);
      out[nt * 8 + 2 * t + 1] = tessera::convert<C>(o[nt][2 * i + 1] * inv);
    }
    if (t == 0) lse[(std::size_t(b) * std::size_t(T) + std::size_t(r)) * std::size_t(H) + std::size_t(h)] = (m[i] + log2f(sum)) / log2e;
  }
#else
  __trap();  // built for a target without bf16 mma: never silently zero
#endif
}

//! D[(b T + i) H + h] = dy_i . y_i over the head's 64 columns: a warp per (row, head).
template <class C, class In>
__global__ void row_dot_kernel(const In* dy, const C* y, float* D, std::size_t rows_heads) {
  const std::size_t w = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = int(threadIdx.x) & 31;
  if (w >= rows_heads) return;
  const std::size_t off = w * head_dim;  // (row H + h) 64 = row d + h 64
  float s = float(dy[off + lane]) * float(y[off + lane]) + float(dy[off + lane + 32]) * float(y[off + lane + 32]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) D[w] = s;
}

//! The gradients of forward_kernel: grid (key tiles, B x H), 128 threads,
//! backward_smem bytes of dynamic shared memory. dy rows of H 64 floats; D
//! from row_dot_kernel; dqkv rows [dq | dk | dv]: dq is added to (zero it
//! first), dk and dv are written. DQ false (--deterministic): dq is left to
//! dq_kernel, which sums it in a fixed order instead of with atomics.
template <class In, bool DQ = true>
__global__ void __launch_bounds__(threads) backward_kernel(const In* dy, const In* qkv, const float* lse,
                                                          const float* D, float* dqkv, int T, int H, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace detail;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);  // queries [query][dim]
  bf16* gs = qs + tile * pitch;               // dO [query][dim]
  bf16* ks = gs + tile * pitch;               // this block's keys [key][dim]
  bf16* dss = ks + tile * pitch;              // dS [query][key]
  float* ls = reinterpret_cast<float*>(dss + tile * pitch);  // lse (log2 domain) of the tile's queries
  float* ds_row = ls + tile;                                 // D of the tile's queries
  const int nq = int(gridDim.x), kt = int(blockIdx.x);       // key tile 0 has the most work: first
  const int b = int(blockIdx.y) / H, h = int(blockIdx.y) % H, d = H * head_dim;
  const std::size_t row = 3 * std::size_t(d);
  const int warp = int(threadIdx.x) >> 5, g = (int(threadIdx.x) & 31) >> 2, t = int(threadIdx.x) & 3;
  const std::size_t first = std::size_t(b) * std::size_t(T);
  const In* base = qkv + first * row + std::size_t(h) * head_dim;
  float* dbase = dqkv + first * row + std::size_t(h) * head_dim;
  const In* gbase = dy + first * std::size_t(d) + std::size_t(h) * head_dim;
  const int k0 = kt * tile + warp * 16, keys[2] = {k0 + g, k0 + g + 8};
  std::uint32_t ka[4][4], va[4][4];
  load_a(base + d, row, k0, T, ka);
  load_a(base + 2 * d, row, k0, T, va);
  load_tile(base + d, row, kt * tile, T, ks);
  const float sl2 = scale * log2e;
  float dk[8][4] = {}, dv[8][4] = {};
  for (int qt = kt; qt < nq; ++qt) {
    __syncthreads();  // every warp is done with the previous tile and its dS
    load_tile(base, row, qt * tile, T, qs);
    load_tile(gbase, std::size_t(d), qt * tile, T, gs);
    for (int i = int(threadIdx.x); i < tile; i += int(blockDim.x)) {
      const int r = qt * tile + i;
      const std::size_t at = (first + std::size_t(r)) * std::size_t(H) + std::size_t(h);
      ls[i] = r < T ? lse[at] * log2e : INFINITY;  // rows past T: p = 0
      ds_row[i] = r < T ? D[at] : 0.f;
    }
    __syncthreads();
    // This warp's 16 keys against the tile's 64 queries, transposed: S^T = K Q^T, dP^T = V dO^T.
    float s[8][4] = {}, dp[8][4] = {};
    for (int nt = 0; nt < 8; ++nt)
      for (int kk = 0; kk < 4; ++kk) {
        mma_tile(s[nt], ka[kk], qs, nt * 8 + g, kk * 16 + 2 * t);
        mma_tile(dp[nt], va[kk], gs, nt * 8 + g, kk * 16 + 2 * t);
      }
    for (int nt = 0; nt < 8; ++nt)
      for (int e = 0; e < 4; ++e) {
        const int ql = nt * 8 + 2 * t + (e & 1);
        float p = exp2f(s[nt][e] * sl2 - ls[ql]);
        if (qt == kt && qt * tile + ql < keys[e >> 1]) p = 0.f;  // the future
        s[nt][e] = p;
        dp[nt][e] = p * (dp[nt][e] - ds_row[ql]) * scale;  // dS^T
        if constexpr (DQ) dss[ql * pitch + warp * 16 + g + 8 * (e >> 1)] = __float2bfloat16_rn(dp[nt][e]);
      }
    for (int j = 0; j < 4; ++j) {
      std::uint32_t pa[4], da[4];
      to_a(s, j, pa);
      to_a(dp, j, da);
      mma_rows(dv, pa, gs, j * 16);  // dV += P^T dO
      mma_rows(dk, da, qs, j * 16);  // dK += dS^T Q
    }
    if constexpr (DQ) {
      __syncthreads();  // dS complete
      // dQ (this warp's 16 queries x 64) += dS K, added into memory.
      float dq[8][4] = {};
      const bf16* a_rows = dss + (warp * 16 + g) * pitch;
      for (int j = 0; j < 4; ++j) {
        const std::uint32_t a[4] = {ld32(a_rows + j * 16 + 2 * t), ld32(a_rows + 8 * pitch + j * 16 + 2 * t),
                                    ld32(a_rows + j * 16 + 2 * t + 8), ld32(a_rows + 8 * pitch + j * 16 + 2 * t + 8)};
        mma_rows(dq, a, ks, j * 16);
      }
      for (int i = 0; i < 2; ++i) {
        const int q = qt * tile + warp * 16 + g + 8 * i;
        if (q >= T) continue;
        float* out = dbase + std::size_t(q) * row;
        for (int nt = 0; nt < 8; ++nt) {
          atomicAdd(out + nt * 8 + 2 * t, dq[nt][2 * i]);
          atomicAdd(out + nt * 8 + 2 * t + 1, dq[nt][2 * i + 1]);
        }
      }
    }
  }
  for (int i = 0; i < 2; ++i) {
    if (keys[i] >= T) continue;
    float* out = dbase + std::size_t(keys[i]) * row;
    for (int nt = 0; nt < 8; ++nt) {
      const int c = nt * 8 + 2 * t;
      out[d + c] = dk[nt][2 * i], out[d + c + 1] = dk[nt][2 * i + 1];
      out[2 * d + c] = dv[nt][2 * i], out[2 * d + c + 1] = dv[nt][2 * i + 1];
    }
  }
#else
  __trap();
#endif
}

//! dq of forward_kernel in a fixed order (--deterministic; backward_kernel
//! with DQ false gives dk and dv): grid (query tiles, B x H), 128 threads,
//! each warp 16 query rows walking the key tiles up to its diagonal as the
//! forward does, P from the saved lse (no online softmax), dS = P (dP - D)
//! scale with dP = dO V^T, and dQ += dS K in registers; dq written once.
template <class In>
__global__ void __launch_bounds__(threads) dq_kernel(const In* dy, const In* qkv, const float* lse, const float* D,
                                                     float* dqkv, int T, int H, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace detail;
  __shared__ __align__(16) bf16 ks[tile * pitch];  // keys [key][dim]
  __shared__ __align__(16) bf16 vs[tile * pitch];  // values [key][dim]
  const auto [qt, b, h, d, row, warp, g, t] = query_tile_of(H);
  const std::size_t first = std::size_t(b) * std::size_t(T);
  const In* base = qkv + first * row + std::size_t(h) * head_dim;
  const In* gbase = dy + first * std::size_t(d) + std::size_t(h) * head_dim;
  const int r0 = qt * tile + warp * 16, rows[2] = {r0 + g, r0 + g + 8};
  std::uint32_t qa[4][4], ga[4][4];
  load_a(base, row, r0, T, qa);
  load_a(gbase, std::size_t(d), r0, T, ga);
  float l2[2], drow[2];  // each row's lse (log2 domain) and D; rows past T: p = 0
  for (int i = 0; i < 2; ++i) {
    const std::size_t at = (first + std::size_t(rows[i])) * std::size_t(H) + std::size_t(h);
    l2[i] = rows[i] < T ? lse[at] * log2e : INFINITY;
    drow[i] = rows[i] < T ? D[at] : 0.f;
  }
  const float sl2 = scale * log2e;
  float dq[8][4] = {};
  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();  // the previous tile is read by every warp
    load_tile(base + d, row, kt * tile, T, ks);
    load_tile(base + 2 * d, row, kt * tile, T, vs);
    __syncthreads();
    float s[8][4] = {}, dp[8][4] = {};
    for (int nt = 0; nt < 8; ++nt)
      for (int kk = 0; kk < 4; ++kk) {
        mma_tile(s[nt], qa[kk], ks, nt * 8 + g, kk * 16 + 2 * t);   // S = Q K^T
        mma_tile(dp[nt], ga[kk], vs, nt * 8 + g, kk * 16 + 2 * t);  // dP = dO V^T
      }
    for (int nt = 0; nt < 8; ++nt)
      for (int e = 0; e < 4; ++e) {
        float p = exp2f(s[nt][e] * sl2 - l2[e >> 1]);
        if (kt == qt && kt * tile + nt * 8 + 2 * t + (e & 1) > rows[e >> 1]) p = 0.f;  // the future
        s[nt][e] = p * (dp[nt][e] - drow[e >> 1]) * scale;                            // dS
      }
    for (int j = 0; j < 4; ++j) {
      std::uint32_t a[4];
      to_a(s, j, a);
      mma_rows(dq, a, ks, j * 16);  // dQ += dS K
    }
  }
  for (int i = 0; i < 2; ++i) {
    if (rows[i] >= T) continue;
    float* out = dqkv + (first + std::size_t(rows[i])) * row + std::size_t(h) * head_dim;
    for (int nt = 0; nt < 8; ++nt) out[nt * 8 + 2 * t] = dq[nt][2 * i], out[nt * 8 + 2 * t + 1] = dq[nt][2 * i + 1];
  }
#else
  __trap();
#endif
}

//! Whether the kernels run here: compiled for sm_80 or newer and a device of compute capability 8 or more.
inline bool supported() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return false;
  return major >= 8;
}

//! Launches (on `stream`): forward, then backward's two kernels. dqkv's dq part must be zero.
//! qkv and dy are fp32 or bf16 (In); the products run in bf16 either way.
template <class C, class In>
void forward(const In* qkv, C* y, float* lse, int B, int T, int H, cudaStream_t stream) {
  const dim3 grid(unsigned((T + tile - 1) / tile), unsigned(B * H));
  forward_kernel<C, In><<<grid, threads, 0, stream>>>(qkv, y, lse, T, H, 1.0f / std::sqrt(float(head_dim)));
}
//! deterministic: dq from dq_kernel in a fixed order instead of atomics.
template <class C, class In>
void backward(const In* dy, const In* qkv, const C* y, const float* lse, float* D, float* dqkv, int B, int T, int H,
              cudaStream_t stream, bool deterministic = false) {
  const std::size_t rows_heads = std::size_t(B) * std::size_t(T) * std::size_t(H);
  row_dot_kernel<C, In><<<unsigned((rows_heads * 32 + 255) / 256), 256, 0, stream>>>(dy, y, D, rows_heads);
  static const bool attr = [] {
    return cudaFuncSetAttribute(backward_kernel<In, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(backward_smem)) == cudaSuccess &&
           cudaFuncSetAttribute(backward_kernel<In, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(backward_smem)) == cudaSuccess;
  }();
  (void)attr;  // a failure shows as the launch's error
  const dim3 grid(unsigned((T + tile - 1) / tile), unsigned(B * H));
  const float scale = 1.0f / std::sqrt(float(head_dim));
  if (!deterministic) {
    backward_kernel<In, true><<<grid, threads, backward_smem, stream>>>(dy, qkv, lse, D, dqkv, T, H, scale);
    return;
  }
  backward_kernel<In, false><<<grid, threads, backward_smem, stream>>>(dy, qkv, lse, D, dqkv, T, H, scale);
  dq_kernel<In><<<grid, threads, 0, stream>>>(dy, qkv, lse, D, dqkv, T, H, scale);
}

}  // namespace trainer_kit::flash
