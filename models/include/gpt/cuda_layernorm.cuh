#pragma once
// GPT-2's LayerNorm on the GPU, the same arithmetic as host_kernels.hpp:
// statistics and the residual stream in fp32, the normalised output (what the
// next GEMM reads) in the compute type C. The backward pass adds into dx, can
// write dx in C as well, and sums the weight gradients per lane and block
// before adding them (layernorm_backward picks the form for D).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "gpt/workspace.hpp"
#include "tessera/backend/cuda/error.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "trainer_kit/kernels/column_sums.cuh"
#include "trainer_kit/kernels/elementwise.cuh"
#include "trainer_kit/kernels/launch.cuh"
#include "trainer_kit/kernels/loss.cuh"
#include "trainer_kit/kernels/reduce.cuh"

namespace gpt::kernels {

// The kernel kit's forms (element-wise, column sums, reductions, the loss,
// launch geometry) under GPT-2's kernels' names.
using namespace trainer_kit::kernels;
using tessera::convert;

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

// Four consecutive values of C as floats, and back (16 bytes of fp32, 8 of bf16).
template <class C>
__device__ inline float4 load4c(const C* p) {
  if constexpr (std::is_same_v<C, float>) {
    return *reinterpret_cast<const float4*>(p);
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    C e[4];
    memcpy(e, &u, sizeof u);
    return make_float4(float(e[0]), float(e[1]), float(e[2]), float(e[3]));
  }
}
template <class C>
__device__ inline void store4c(C* p, float4 v) {
  if constexpr (std::is_same_v<C, float>) {
    *reinterpret_cast<float4*>(p) = v;
  } else {
    C e[4] = {convert<C>(v.x), convert<C>(v.y), convert<C>(v.z), convert<C>(v.w)};
    uint2 u;
    memcpy(&u, e, sizeof u);
    *reinterpret_cast<uint2*>(p) = u;
  }
}

//! layernorm_kernel with the row in registers: 4 columns a lane in J groups
//! (D a multiple of 4, at most 128 J), 16-byte loads, x read once. The
//! one-value-a-lane form reads the row three times and, at GPT-2 xl's 1600
//! columns, ran at 2.6x its bytes (an H100's profile, 2026-12-05).
template <class C, int J>
__global__ void layernorm_rows_kernel(const float* x, const C* w, const C* b, C* out, float* mean, float* rstd, int n,
                                      int D) {
  const int row = int(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32), lane = threadIdx.x & 31;
  if (row >= n) return;
  const std::size_t at = std::size_t(row) * std::size_t(D);
  float4 v[J];
  float s = 0;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int c = 4 * (lane + 32 * j);
    v[j] = c < D ? *reinterpret_cast<const float4*>(x + at + std::size_t(c)) : make_float4(0.f, 0.f, 0.f, 0.f);
    s += (v[j].x + v[j].y) + (v[j].z + v[j].w);
  }
  const float mu = warp_sum(s) / float(D);
  float s2 = 0;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    if (4 * (lane + 32 * j) >= D) continue;
    const float a = v[j].x - mu, b2 = v[j].y - mu, c2 = v[j].z - mu, d2 = v[j].w - mu;
    s2 += (a * a + b2 * b2) + (c2 * c2 + d2 * d2);
  }
  const float rs = rsqrtf(warp_sum(s2) / float(D) + 1e-5f);
  if (lane == 0) mean[row] = mu, rstd[row] = rs;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int c = 4 * (lane + 32 * j);
    if (c >= D) continue;
    const float4 wv = load4c(w + c), bv = load4c(b + c);
    store4c(out + at + std::size_t(c),
            make_float4((v[j].x - mu) * rs * wv.x + bv.x, (v[j].y - mu) * rs * wv.y + bv.y,
                        (v[j].z - mu) * rs * wv.z + bv.z, (v[j].w - mu) * rs * wv.w + bv.w));
  }
}

//! Calls f(std::integral_constant<int, J>{}) for the least J of 2, 4, 8, 13,
//! 16 that holds `groups` 4-column groups a lane (at most 16): the widths
//! the register forms of LayerNorm are compiled for.
template <class F>
void with_lane_groups(int groups, F&& f) {
  if (groups <= 2) f(std::integral_constant<int, 2>{});
  else if (groups <= 4) f(std::integral_constant<int, 4>{});
  else if (groups <= 8) f(std::integral_constant<int, 8>{});
  else if (groups <= 13) f(std::integral_constant<int, 13>{});
  else f(std::integral_constant<int, 16>{});
}

inline bool aligned_to(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

//! LayerNorm forward over n rows of D, a warp a row (8 rows a block of 256):
//! the registers' form where D is a multiple of 4 up to 2048 and the operands
//! are aligned for it (every GPT-2 size), else one value a lane.
template <class C>
void layernorm(const float* x, const C* w, const C* b, C* out, float* mean, float* rstd, int n, int D, cudaStream_t s) {
  if (n <= 0) return;
  const unsigned grid = unsigned((n + 7) / 8);
  const int groups = (D / 4 + 31) / 32;
  const bool vec = D % 4 == 0 && groups <= 16 && aligned_to(x, 16) && aligned_to(w, 4 * sizeof(C)) &&
                   aligned_to(b, 4 * sizeof(C)) && aligned_to(out, 4 * sizeof(C));
  if (!vec) {
    layernorm_kernel<C><<<grid, 256, 0, s>>>(x, w, b, out, mean, rstd, n, D);
    return;
  }
  with_lane_groups(groups, [&](auto j) {
    layernorm_rows_kernel<C, decltype(j)::value><<<grid, 256, 0, s>>>(x, w, b, out, mean, rstd, n, D);
  });
}

//! dx += LayerNorm backward of dout, and where dxc is given the new dx in C
//! too (what the next GEMM reads, so no conversion pass follows); dw, db
//! accumulate. A warp per row, the rows strided over the grid. The forms
//! layernorm_backward_columns_kernel does not take: J = 0 (any D) adds every
//! row's share of dw and db into shared memory (2 D floats, dynamic; one
//! global atomic per row and column, as this kernel first had, took four
//! times the rest of it), then the block adds its sums once. Ordered
//! (--deterministic; J > 0, D a multiple of 4 up to 128 J): each lane takes 4
//! columns at a time (16-byte loads) and keeps its columns' share of dw and db
//! in registers over all its rows; the warps add theirs to shared memory one
//! after another and the block writes its sums to partial[blockIdx.x][2 D],
//! for column_finish_kernel to add in block order. Two blocks an SM at most
//! 128 registers a thread: at J = 13 (GPT-2 xl) the kernel took 150 and one
//! block an SM ran.
template <class C, int J, bool Ordered = false>
__global__ void __launch_bounds__(256, 2) layernorm_backward_kernel(const float* dout, const float* x, const C* w, const float* mean,
                                          const float* rstd, float* dx, C* dxc, float* dw, float* db, int n, int D,
                                          float* partial) {
  static_assert(Ordered == (J > 0), "the register form is the ordered one (the fast form is the columns kernel)");
  extern __shared__ float acc[];  // dw (D), then db (D)
  for (int c = threadIdx.x; c < 2 * D; c += blockDim.x) acc[c] = 0;
  __syncthreads();
  const int warps = int(blockDim.x / 32), lane = int(threadIdx.x & 31);
  float4 rw[J > 0 ? J : 1], rb[J > 0 ? J : 1];
  for (int j = 0; j < (J > 0 ? J : 1); ++j) rw[j] = rb[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int row = int(blockIdx.x) * warps + int(threadIdx.x / 32); row < n; row += int(gridDim.x) * warps) {
    const std::size_t at = std::size_t(row) * std::size_t(D);
    const float* g = dout + at;
    const float* r = x + at;
    const float mu = mean[row], rs = rstd[row];
    float m1 = 0, m2 = 0;
    if constexpr (J > 0) {
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int c = 4 * (lane + 32 * j);
        if (c < D) {
          const float4 gv = *reinterpret_cast<const float4*>(g + c), xv = *reinterpret_cast<const float4*>(r + c),
                       wv = load4c(w + c);
          const float4 xh = make_float4((xv.x - mu) * rs, (xv.y - mu) * rs, (xv.z - mu) * rs, (xv.w - mu) * rs);
          m1 += gv.x * wv.x + gv.y * wv.y + gv.z * wv.z + gv.w * wv.w;
          m2 += gv.x * wv.x * xh.x + gv.y * wv.y * xh.y + gv.z * wv.z * xh.z + gv.w * wv.w * xh.w;
          rw[j].x += gv.x * xh.x, rw[j].y += gv.y * xh.y, rw[j].z += gv.z * xh.z, rw[j].w += gv.w * xh.w;
          rb[j].x += gv.x, rb[j].y += gv.y, rb[j].z += gv.z, rb[j].w += gv.w;
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
    if constexpr (J > 0) {
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const int c = 4 * (lane + 32 * j);
        if (c < D) {
          const float4 gv = *reinterpret_cast<const float4*>(g + c), xv = *reinterpret_cast<const float4*>(r + c),
                       wv = load4c(w + c);
          float4 v = *reinterpret_cast<const float4*>(dx + at + std::size_t(c));
          v.x += rs * (gv.x * wv.x - m1 - (xv.x - mu) * rs * m2);
          v.y += rs * (gv.y * wv.y - m1 - (xv.y - mu) * rs * m2);
          v.z += rs * (gv.z * wv.z - m1 - (xv.z - mu) * rs * m2);
          v.w += rs * (gv.w * wv.w - m1 - (xv.w - mu) * rs * m2);
          *reinterpret_cast<float4*>(dx + at + std::size_t(c)) = v;
          if (dxc) store4c(dxc + at + std::size_t(c), v);
        }
      }
    } else {
      for (int c = lane; c < D; c += 32) {
        const float xh = (r[c] - mu) * rs;
        const float v = dx[at + std::size_t(c)] + rs * (g[c] * float(w[c]) - m1 - xh * m2);
        dx[at + std::size_t(c)] = v;
        if (dxc) dxc[at + std::size_t(c)] = convert<C>(v);
      }
    }
  }
  if constexpr (Ordered) {
    for (int turn = 0; turn < warps; ++turn) {  // the same order on every run
      if (int(threadIdx.x / 32) == turn) {
#pragma unroll
        for (int j = 0; j < J; ++j) {
          const int c = 4 * (lane + 32 * j);
          if (c < D) {
            acc[c] += rw[j].x, acc[c + 1] += rw[j].y, acc[c + 2] += rw[j].z, acc[c + 3] += rw[j].w;
            acc[D + c] += rb[j].x, acc[D + c + 1] += rb[j].y, acc[D + c + 2] += rb[j].z, acc[D + c + 3] += rb[j].w;
          }
        }
      }
      __syncthreads();
    }
  }
  __syncthreads();
  if constexpr (Ordered) {
    for (int c = threadIdx.x; c < 2 * D; c += blockDim.x) partial[std::size_t(blockIdx.x) * 2 * std::size_t(D) + c] = acc[c];
  } else {
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
      atomicAdd(dw + c, acc[c]);
      atomicAdd(db + c, acc[D + c]);
    }
  }
}

//! The backward's fast form (D a multiple of 4 up to 4 * 1024, operands
//! aligned): a thread owns 4 columns (a block of D / 4 threads, rounded up to
//! warps) and the block takes R rows at a time. It loads their dout, x and dx
//! once into registers, sums each row's two dot products over the block (one
//! barrier per R rows; the sums in shared memory, double-buffered so the next
//! rows need no second barrier), adds into dx, and keeps its own columns' dw
//! and db in 8 registers over all its rows: one atomic each at the end. The
//! warp-a-row form held every column's share a lane (104 registers at GPT-2
//! xl's 1600 columns, one or two blocks an SM) and read dout and x twice: on
//! an H100 it ran at 2.4x its bytes. With dsum, the column sums of the new dx
//! as well (4 more registers, 4 more atomics a thread): dx is the gradient of
//! the residual stream, whose column sums are the bias gradient of the product
//! that joined it (attention's proj, the MLP's fc_proj); summed here they cost
//! no second pass over dx (cuBLASLt's bias-gradient epilogue reads it again).
//! At most 64 registers: dsum's 4 took it to 72, 3 blocks an SM instead of 4
//! at GPT-2 medium's 1024 columns; capped, it spills 12 bytes.
template <class C, int R>
__global__ void __maxnreg__(64)
    layernorm_backward_columns_kernel(const float* dout, const float* x, const C* w, const float* mean,
                                      const float* rstd, float* dx, C* dxc, float* dw, float* db, int n, int D,
                                      float* dsum) {
  __shared__ float2 red[2][32][R];  // [buffer][warp][row]: (sum of dout w, sum of dout w xhat)
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31), warps = int(blockDim.x / 32);
  const int c = 4 * int(threadIdx.x);
  const bool mine = c < D;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  const float4 wv = mine ? load4c(w + c) : zero;
  float4 aw = zero, ab = zero, as = zero;
  int buf = 0;
  for (int row0 = int(blockIdx.x) * R; row0 < n; row0 += int(gridDim.x) * R, buf ^= 1) {
    float4 g[R], xh[R], v[R];
    float rs[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool live = mine && row0 + r < n;
      const std::size_t at = std::size_t(row0 + r) * std::size_t(D) + std::size_t(c);
      g[r] = live ? *reinterpret_cast<const float4*>(dout + at) : zero;
      xh[r] = live ? *reinterpret_cast<const float4*>(x + at) : zero;
      v[r] = live ? *reinterpret_cast<const float4*>(dx + at) : zero;
      const float mu = row0 + r < n ? mean[row0 + r] : 0.f;
      rs[r] = row0 + r < n ? rstd[row0 + r] : 0.f;
      xh[r] = make_float4((xh[r].x - mu) * rs[r], (xh[r].y - mu) * rs[r], (xh[r].z - mu) * rs[r],
                          (xh[r].w - mu) * rs[r]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {  // a row past n has g = 0: it adds nothing
      const float4 gw = make_float4(g[r].x * wv.x, g[r].y * wv.y, g[r].z * wv.z, g[r].w * wv.w);
      const float m1 = warp_sum((gw.x + gw.y) + (gw.z + gw.w));
      const float m2 = warp_sum((gw.x * xh[r].x + gw.y * xh[r].y) + (gw.z * xh[r].z + gw.w * xh[r].w));
      if (lane == 0) red[buf][warp][r] = make_float2(m1, m2);
      aw.x += g[r].x * xh[r].x, aw.y += g[r].y * xh[r].y, aw.z += g[r].z * xh[r].z, aw.w += g[r].w * xh[r].w;
      ab.x += g[r].x, ab.y += g[r].y, ab.z += g[r].z, ab.w += g[r].w;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float m1 = 0, m2 = 0;
      for (int k = 0; k < warps; ++k) m1 += red[buf][k][r].x, m2 += red[buf][k][r].y;
      m1 /= float(D), m2 /= float(D);
      if (!mine || row0 + r >= n) continue;
      const std::size_t at = std::size_t(row0 + r) * std::size_t(D) + std::size_t(c);
      v[r].x += rs[r] * (g[r].x * wv.x - m1 - xh[r].x * m2);
      v[r].y += rs[r] * (g[r].y * wv.y - m1 - xh[r].y * m2);
      v[r].z += rs[r] * (g[r].z * wv.z - m1 - xh[r].z * m2);
      v[r].w += rs[r] * (g[r].w * wv.w - m1 - xh[r].w * m2);
      *reinterpret_cast<float4*>(dx + at) = v[r];
      if (dxc) store4c(dxc + at, v[r]);
      as.x += v[r].x, as.y += v[r].y, as.z += v[r].z, as.w += v[r].w;
    }
  }
  if (mine) {
    atomicAdd(dw + c, aw.x), atomicAdd(dw + c + 1, aw.y), atomicAdd(dw + c + 2, aw.z), atomicAdd(dw + c + 3, aw.w);
    atomicAdd(db + c, ab.x), atomicAdd(db + c + 1, ab.y), atomicAdd(db + c + 2, ab.z), atomicAdd(db + c + 3, ab.w);
    if (dsum)
      atomicAdd(dsum + c, as.x), atomicAdd(dsum + c + 1, as.y), atomicAdd(dsum + c + 2, as.z),
          atomicAdd(dsum + c + 3, as.w);
  }
}

//! Rows layernorm_backward_columns_kernel's block takes at a time: 2 keeps a
//! bf16 thread at 64 registers, two 13-warp blocks an SM at GPT-2 xl's 1600
//! columns (4 took 116 registers: one block, every warp waiting at its barrier).
inline constexpr int layernorm_backward_rows = 2;

//! Most columns layernorm_backward takes: its shared memory holds 2 D floats.
inline constexpr int layernorm_backward_max_d = 6144;

//! Launches the LayerNorm backward over n rows of D on `blocks` blocks (0: as
//! many as the device holds at once, or fewer where n is small).
//! layernorm_backward_columns_kernel where D is a multiple of 4 up to 4096
//! and the operands are aligned for it (every GPT-2 size), else
//! layernorm_backward_kernel's shared-memory form. With `partial`
//! (workspace::layernorm_partial_floats; --deterministic): the ordered form on
//! up to workspace::layernorm_ordered_blocks blocks, then its sums added in
//! block order. With dsum: dsum[c] += the sum over rows of the new dx[., c]
//! (in the columns kernel, else a column_sum pass after the other forms; not
//! with `partial`: the ordered callers sum their bias gradients in row order).
template <class C>
void layernorm_backward(const float* dout, const float* x, const C* w, const float* mean, const float* rstd, float* dx,
                        C* dxc, float* dw, float* db, int n, int D, cudaStream_t s, int blocks = 0,
                        float* partial = nullptr, float* dsum = nullptr) {
  TESSERA_CHECK(!(partial && dsum), "the ordered LayerNorm backward sums no columns of dx (dsum): it would add them "
                "with atomics, in no fixed order");
  if (n <= 0) return;
  // The 4-column forms read dout, x, dx as float4 and w, dxc as 4 C at a time: every one of them aligned.
  const auto aligned = aligned_to;
  const bool vec = D % 4 == 0 && aligned(dout, 16) && aligned(x, 16) && aligned(dx, 16) && aligned(w, 4 * sizeof(C)) &&
                   (!dxc || aligned(dxc, 4 * sizeof(C)));
  const std::size_t smem = 2 * std::size_t(D) * sizeof(float);
  if (partial) {
    TESSERA_CHECK(workspace::layernorm_ordered_fits(D), workspace::layernorm_ordered_refusal(D));
    TESSERA_CHECK(vec, "--deterministic: the CUDA LayerNorm backward's operands are not 16-byte aligned");
    const unsigned grid = unsigned(std::min(blocks > 0 ? blocks : (n + 7) / 8, workspace::layernorm_ordered_blocks));
    with_lane_groups((D / 4 + 31) / 32, [&](auto j) {
      layernorm_backward_kernel<C, decltype(j)::value, true>
          <<<grid, 256, smem, s>>>(dout, x, w, mean, rstd, dx, dxc, dw, db, n, D, partial);
    });
    column_finish(partial, int(grid), 2 * D, dw, false, s, D, db);
    return;
  }
  constexpr int R = layernorm_backward_rows;
  if (vec && D <= 4096) {
    const int threads = (D / 4 + 31) / 32 * 32;
    if (blocks <= 0)
      blocks = resident_blocks(reinterpret_cast<const void*>(&layernorm_backward_columns_kernel<C, R>), threads, 0);
    layernorm_backward_columns_kernel<C, R><<<unsigned(std::min(blocks, (n + R - 1) / R)), unsigned(threads), 0, s>>>(
        dout, x, w, mean, rstd, dx, dxc, dw, db, n, D, dsum);
    return;
  }
  if (blocks <= 0) blocks = resident_blocks(reinterpret_cast<const void*>(&layernorm_backward_kernel<C, 0>), 256, smem);
  layernorm_backward_kernel<C, 0>
      <<<unsigned(std::min(blocks, (n + 7) / 8)), 256, smem, s>>>(dout, x, w, mean, rstd, dx, dxc, dw, db, n, D, nullptr);
  if (dsum) column_add_atomic(dx, n, D, dsum, s);
}

}  // namespace gpt::kernels
