#pragma once
// The pieces the flash attention kernels (kernels/flash.cuh) are built from:
// the tile geometry, bf16 packing, mma.sync.m16n8k16 and ldmatrix fragments,
// the tiles' shared-memory loads. sm_80 or newer; on older targets they
// compile to nothing.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tessera/core/dtype.hpp"

namespace trainer_kit::flash {

inline constexpr int head_dim = 64;
inline constexpr int tile = 64;   // rows of a query or key tile
inline constexpr int pitch = 72;  // bf16 per shared-memory row: 64 + 8 keeps fragment loads off one bank
inline constexpr int threads = 128;
using bf16 = __nv_bfloat16;

//! Shared memory of the backward kernel: four bf16 tiles and two rows of 64 floats.
inline constexpr std::size_t backward_smem = 4 * std::size_t(tile) * pitch * sizeof(bf16) + 2 * tile * sizeof(float);

namespace detail {

__device__ inline std::uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}
__device__ inline std::uint32_t ld32(const bf16* p) { return *reinterpret_cast<const std::uint32_t*>(p); }

// c += a b for a 16x16 bf16 A fragment and a 16x8 B fragment (fp32 accumulate).
__device__ inline void mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// B fragment k-pair at row n of a [n][k] tile (k contiguous), k-step ks: the two registers.
__device__ inline void mma_tile(float (&c)[4], const std::uint32_t (&a)[4], const bf16* tile_nk, int n, int k) {
  mma(c, a, ld32(tile_nk + n * pitch + k), ld32(tile_nk + n * pitch + k + 8));
}

// B fragments of two neighbouring 16x8 tiles from a row-major [k][n] tile in
// shared memory (rows [k0, k0 + 16), columns [n0, n0 + 16)): ldmatrix.trans
// hands each thread its k-pairs, so nothing is stored transposed. b[0], b[1]
// for columns n0.., b[2], b[3] for n0 + 8... Rows are pitch apart: 144 bytes,
// 16-byte aligned, and eight of them fall on 32 different banks.
__device__ inline void b_pair_trans(std::uint32_t (&b)[4], const bf16* tile_kn, int k0, int n0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int lane = int(threadIdx.x & 31);
  const bf16* p = tile_kn + (k0 + (lane & 15)) * pitch + n0 + (lane >> 4) * 8;
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
               : "r"(addr));
#endif
}
// c[n-tiles of 8 columns] += a x (rows [k0, k0 + 16) of a row-major [k][64] tile).
__device__ inline void mma_rows(float (&c)[8][4], const std::uint32_t (&a)[4], const bf16* tile_kn, int k0) {
  for (int np = 0; np < 4; ++np) {
    std::uint32_t b[4];
    b_pair_trans(b, tile_kn, k0, np * 16);
    mma(c[2 * np], a, b[0], b[1]);
    mma(c[2 * np + 1], a, b[2], b[3]);
  }
}

// The 16x16 A fragment of columns [16 j, 16 j + 16) of a warp's 16 x 64 fp32
// accumulators (8 tiles of 16x8): the C layout of two neighbouring tiles is
// the A layout.
__device__ inline void to_a(const float (&c)[8][4], int j, std::uint32_t (&a)[4]) {
  a[0] = pack(c[2 * j][0], c[2 * j][1]);
  a[1] = pack(c[2 * j][2], c[2 * j][3]);
  a[2] = pack(c[2 * j + 1][0], c[2 * j + 1][1]);
  a[3] = pack(c[2 * j + 1][2], c[2 * j + 1][3]);
}

// A fragments (16 rows x 64 columns) straight from fp32 rows r0..r0+15 of a
// matrix with row stride `stride`; rows >= T read as zero.
template <class In>
__device__ inline void load_a(const In* src, std::size_t stride, int r0, int T, std::uint32_t (&a)[4][4]) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  auto pair = [&](int r, int c) -> std::uint32_t {
    if (r >= T) return 0u;
    if constexpr (std::is_same_v<In, float>) {
      const float2 v = *reinterpret_cast<const float2*>(src + std::size_t(r) * stride + std::size_t(c));
      return pack(v.x, v.y);
    } else {  // two bf16 are already a packed pair
      static_assert(sizeof(In) == 2, "flash attention reads fp32 or bf16");
      return *reinterpret_cast<const std::uint32_t*>(src + std::size_t(r) * stride + std::size_t(c));
    }
  };
  for (int ks = 0; ks < 4; ++ks) {
    const int c = ks * 16 + 2 * t;
    a[ks][0] = pair(r0 + g, c);
    a[ks][1] = pair(r0 + g + 8, c);
    a[ks][2] = pair(r0 + g, c + 8);
    a[ks][3] = pair(r0 + g + 8, c + 8);
  }
}

// Rows [r0, r0 + 64) x 64 columns of an fp32 or bf16 matrix (row stride
// `stride`) into shared memory as bf16 rows ([row][col], pitch apart); rows
// >= T are zero. bf16 rows move 16 bytes a thread, fp32 rows are converted.
template <class In>
__device__ inline void load_tile(const In* src, std::size_t stride, int r0, int T, bf16* rows) {
  if constexpr (std::is_same_v<In, float>) {
    for (int k = int(threadIdx.x); k < tile * head_dim / 4; k += int(blockDim.x)) {
      const int r = k / (head_dim / 4), c = (k % (head_dim / 4)) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r0 + r < T) v = *reinterpret_cast<const float4*>(src + std::size_t(r0 + r) * stride + std::size_t(c));
      *reinterpret_cast<__nv_bfloat162*>(rows + r * pitch + c) = __floats2bfloat162_rn(v.x, v.y);
      *reinterpret_cast<__nv_bfloat162*>(rows + r * pitch + c + 2) = __floats2bfloat162_rn(v.z, v.w);
    }
  } else {
    static_assert(sizeof(In) == 2, "flash attention reads fp32 or bf16");
    for (int k = int(threadIdx.x); k < tile * head_dim / 8; k += int(blockDim.x)) {
      const int r = k / (head_dim / 8), c = (k % (head_dim / 8)) * 8;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (r0 + r < T) v = *reinterpret_cast<const uint4*>(src + std::size_t(r0 + r) * stride + std::size_t(c));
      *reinterpret_cast<uint4*>(rows + r * pitch + c) = v;
    }
  }
}

__device__ inline float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ inline float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

inline constexpr float log2e = 1.4426950408889634f;

// Where a thread of a query-tile grid (query tiles, B x H; 4 warps) works:
// its query tile (the longest rows first), sequence, head, the width d = H 64,
// qkv's row of 3 d, and its warp, group and thread in the mma fragments.
struct query_tile {
  int qt, b, h, d;
  std::size_t row;
  int warp, g, t;
};
__device__ inline query_tile query_tile_of(int H) {
  const int d = H * head_dim;
  return {int(gridDim.x) - 1 - int(blockIdx.x), int(blockIdx.y) / H, int(blockIdx.y) % H, d, 3 * std::size_t(d),
          int(threadIdx.x) >> 5, (int(threadIdx.x) & 31) >> 2, int(threadIdx.x) & 3};
}

}  // namespace detail

}  // namespace trainer_kit::flash
