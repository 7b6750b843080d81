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

#include "gpt/cuda_kernels.cuh"
#include "gpt/cuda_ordered.cuh"

namespace gpt::kernels {

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
//! accumulate. A warp per row, the rows strided over the grid. J > 0 (D a
//! multiple of 4, at most 128 J): each lane takes 4 columns at a time (16-byte
//! loads; one value a lane left the kernel waiting on memory) and keeps its
//! columns' share of dw and db in registers over all its rows; then the
//! block's warps add theirs in shared memory (2 D floats, dynamic) and the
//! block adds the sum to the gradients once. J = 0 (any D): every row adds
//! into shared memory. One atomic per row and column, as this kernel first
//! had, took four times the rest of it. Ordered (--deterministic, J > 0):
//! the warps add theirs one after another and the block writes its sums to
//! partial[blockIdx.x][2 D] instead, for column_finish_kernel to add in
//! block order. Two blocks an SM at most 128 registers a thread: at J = 13
//! (GPT-2 xl) the kernel took 150 and one block an SM ran (8 warps), at 2.4x
//! its bytes; 128 spills a few values to L1.
template <class C, int J, bool Ordered = false>
__global__ void __launch_bounds__(256, 2) layernorm_backward_kernel(const float* dout, const float* x, const C* w, const float* mean,
                                          const float* rstd, float* dx, C* dxc, float* dw, float* db, int n, int D,
                                          float* partial) {
  static_assert(!Ordered || J > 0, "the ordered form keeps its sums in registers");
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
  } else if constexpr (J > 0) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = 4 * (lane + 32 * j);
      if (c < D) {
        atomicAdd(acc + c, rw[j].x), atomicAdd(acc + c + 1, rw[j].y), atomicAdd(acc + c + 2, rw[j].z),
            atomicAdd(acc + c + 3, rw[j].w);
        atomicAdd(acc + D + c, rb[j].x), atomicAdd(acc + D + c + 1, rb[j].y), atomicAdd(acc + D + c + 2, rb[j].z),
            atomicAdd(acc + D + c + 3, rb[j].w);
      }
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

//! Most columns layernorm_backward takes: its shared memory holds 2 D floats.
inline constexpr int layernorm_backward_max_d = 6144;

//! Launches layernorm_backward_kernel over n rows of D on `blocks` blocks of
//! 8 warps (0: two per SM of the current device, or fewer where n is small):
//! 4 columns a lane with registers where D is a multiple of 4 up to 2048
//! (every GPT-2 size), else the shared-memory form. With `partial`
//! (workspace::layernorm_partial_floats; --deterministic): the ordered form on
//! up to workspace::layernorm_ordered_blocks blocks, then its sums added in
//! block order.
template <class C>
void layernorm_backward(const float* dout, const float* x, const C* w, const float* mean, const float* rstd, float* dx,
                        C* dxc, float* dw, float* db, int n, int D, cudaStream_t s, int blocks = 0,
                        float* partial = nullptr) {
  if (partial) {
    TESSERA_CHECK(workspace::layernorm_ordered_fits(D), workspace::layernorm_ordered_refusal(D));
    blocks = std::min(blocks > 0 ? blocks : (n + 7) / 8, workspace::layernorm_ordered_blocks);
  } else if (blocks <= 0) {
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
  // The 4-column form reads dout, x, dx as float4 and w, dxc as 4 C at a time: every one of them aligned.
  const auto aligned = aligned_to;
  const bool vec = D % 4 == 0 && aligned(dout, 16) && aligned(x, 16) && aligned(dx, 16) && aligned(w, 4 * sizeof(C)) &&
                   (!dxc || aligned(dxc, 4 * sizeof(C)));
  const int per_lane = (D / 4 + 31) / 32;  // 4-column groups a lane takes
  if (partial) {
    TESSERA_CHECK(vec, "--deterministic: the CUDA LayerNorm backward's operands are not 16-byte aligned");
    with_lane_groups(per_lane, [&](auto j) {
      layernorm_backward_kernel<C, decltype(j)::value, true>
          <<<grid, 256, smem, s>>>(dout, x, w, mean, rstd, dx, dxc, dw, db, n, D, partial);
    });
    column_finish_kernel<float><<<unsigned((2 * D + 255) / 256), 256, 0, s>>>(partial, int(grid), 2 * D, dw, D, db);
    return;
  }
  if (vec && per_lane <= 16) {
    with_lane_groups(per_lane, [&](auto j) {
      layernorm_backward_kernel<C, decltype(j)::value>
          <<<grid, 256, smem, s>>>(dout, x, w, mean, rstd, dx, dxc, dw, db, n, D, nullptr);
    });
  } else {
    layernorm_backward_kernel<C, 0><<<grid, 256, smem, s>>>(dout, x, w, mean, rstd, dx, dxc, dw, db, n, D, nullptr);
  }
}

}  // namespace gpt::kernels
