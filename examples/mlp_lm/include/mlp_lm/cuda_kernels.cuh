#pragma once
// The MLP language model's own CUDA kernels: embedding gather and its
// gradient, softmax cross-entropy, bias and GELU where cuBLASLt's epilogues
// do not run them, and deterministic column sums for bias gradients.
//
// Every reduction here runs in a fixed order (no floating-point atomics on
// the results), so a run is reproducible bit for bit on the same GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <span>

#include "tessera/backend/cuda/error.hpp"
#include "tessera/core/error.hpp"
#include "tessera/backend/cuda/stream.hpp"
#include "mlp_lm/workspace.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/vec.hpp"
#include "trainer_kit/grouped_rows.cuh"
#include "trainer_kit/host_math.hpp"

namespace mlp_lm::gpu {

using tessera::convert;
using tessera::load_vec;
using tessera::store_vec;
using tessera::vec;
constexpr int vocab = 256;

// The tanh form of GELU, as the host trainer and cuBLASLt's epilogue use (the trainer kit's).
using trainer_kit::gelu;
using trainer_kit::gelu_grad;

//! Whether p allows 16-byte vector accesses (load_vec / store_vec).
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }
inline unsigned blocks_for(std::size_t n, unsigned threads) {
  const std::size_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > (1u << 30) ? (1u << 30) : b));
}

// X[j, k e + c] = E[ctx[j, k], c], moved in words of W (16 bytes where rows allow).
template <class W>
__global__ void embed_forward_kernel(const W* E, const std::uint8_t* ctx, std::size_t rows, int ew, W* X) {
  const std::size_t total = rows * std::size_t(ew);
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t r = i / std::size_t(ew);  // row r = token j, position k
    X[i] = E[std::size_t(ctx[r]) * std::size_t(ew) + i % std::size_t(ew)];
  }
}

//! X[n, ctx*e] from the embedding table E[256, e] (compute type C).
template <class C>
void embed_forward(const C* E, const std::uint8_t* ctx, int n, int ctxlen, int e, C* X) {
  const std::size_t rows = std::size_t(n) * std::size_t(ctxlen);
  if (rows == 0) return;
  const cudaStream_t s = tessera::cuda::current_stream();
  if ((std::size_t(e) * sizeof(C)) % 16 == 0) {
    const int ew = int(std::size_t(e) * sizeof(C) / 16);
    embed_forward_kernel<<<blocks_for(rows * std::size_t(ew), 256), 256, 0, s>>>(
        reinterpret_cast<const uint4*>(E), ctx, rows, ew, reinterpret_cast<uint4*>(X));
  } else {
    embed_forward_kernel<<<blocks_for(rows * std::size_t(e), 256), 256, 0, s>>>(E, ctx, rows, e, X);
  }
  TESSERA_CUDA(cudaGetLastError());
}

// S[r, v] = (bytes[r] == v): the one-hot rows whose product S^T dX is the
// embedding gradient (a GEMM: fast, exact products, a fixed summation order).
template <class C>
__global__ void one_hot_kernel(const std::uint8_t* bytes, std::size_t rows, C* S) {
  const std::size_t total = rows * vocab;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += std::size_t(gridDim.x) * blockDim.x)
    S[i] = convert<C>(bytes[i / vocab] == std::uint8_t(i % vocab) ? 1.0f : 0.0f);
}
template <class C>
void one_hot(const std::uint8_t* bytes, std::size_t rows, C* S) {
  if (rows == 0) return;
  one_hot_kernel<<<blocks_for(rows * vocab, 256), 256, 0, tessera::cuda::current_stream()>>>(bytes, rows, S);
  TESSERA_CUDA(cudaGetLastError());
}

// The embedding gradient without a GEMM (when cuBLASLt has none for the row width):
// gE[v, c] (+)= sum over rows r with byte v of dX[r, c]. `order` lists the rows
// grouped by byte (starts[v] .. starts[v+1]): trainer_kit's grouped rows, a
// fixed summation order with no atomics.
template <class C>
void embed_backward(const C* dX, const int* order, const int* starts, int e, float* gE, bool overwrite) {
  trainer_kit::grouped_rows(dX, order, starts, nullptr, vocab, e, gE, overwrite, tessera::cuda::current_stream());
}

// One warp per token: loss = logsumexp(z) - z[target], and dZ = scale (softmax(z) - onehot(target))
// written over Z. Each block adds its tokens' loss to *loss in fixed point
// (units of 2^-32 nats, an integer atomic): the same sum in any block order,
// so the logged loss is reproducible too.
inline constexpr double loss_unit = 0x1p32;
template <class C>
__global__ void softmax_xent_kernel(C* Z, const std::uint8_t* target, int n, float scale, unsigned long long* loss) {
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int j = int(blockIdx.x) * int(blockDim.x / 32) + warp;
  __shared__ double block_loss[32];
  double mine = 0;
  if (j < n) {
    C* z = Z + std::size_t(j) * vocab;
    float v[vocab / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < vocab / 32; ++i) {
      v[i] = convert<float>(z[lane + 32 * i]);
      mx = fmaxf(mx, v[i]);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0;
#pragma unroll
    for (int i = 0; i < vocab / 32; ++i) sum += __expf(v[i] - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const int t = target[j];
    const float zt = __shfl_sync(0xffffffffu, v[t / 32], t % 32);
    mine = lane == 0 ? double(logf(sum) + mx - zt) : 0.0;
    const float inv = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < vocab / 32; ++i) {
      const int c = lane + 32 * i;
      z[c] = convert<C>((__expf(v[i] - mx) * inv - (c == t ? 1.0f : 0.0f)) * scale);
    }
  }
  if (lane == 0) block_loss[warp] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0;
    for (int w = 0; w < int(blockDim.x / 32); ++w) s += block_loss[w];
    if (s != 0) atomicAdd(loss, static_cast<unsigned long long>(llrint(s * loss_unit)));  // only the logged loss
  }
}

template <class C>
void softmax_xent(C* Z, const std::uint8_t* target, int n, float scale, unsigned long long* loss) {
  if (n == 0) return;
  softmax_xent_kernel<<<blocks_for(std::size_t(n), 8), 256, 0, tessera::cuda::current_stream()>>>(Z, target, n, scale, loss);
  TESSERA_CUDA(cudaGetLastError());
}

// Column sums in two fixed-order passes: partial[p, c] over a slice of rows, then out[c] (+)= sum_p.
template <class C>
__global__ void column_partial_kernel(const C* Y, int n, int cols, int rows_per_part, float* partial) {
  const int c = int(blockIdx.x) * 32 + int(threadIdx.x);
  const int r0 = int(blockIdx.y) * rows_per_part, r1 = min(n, r0 + rows_per_part);
  float s = 0, s1 = 0, s2 = 0, s3 = 0;  // four loads in flight
  if (c < cols) {
    int r = r0 + int(threadIdx.y);
    const std::size_t w = std::size_t(cols);
    for (; r + 24 < r1; r += 32) {
      s += convert<float>(Y[std::size_t(r) * w + std::size_t(c)]);
      s1 += convert<float>(Y[std::size_t(r + 8) * w + std::size_t(c)]);
      s2 += convert<float>(Y[std::size_t(r + 16) * w + std::size_t(c)]);
      s3 += convert<float>(Y[std::size_t(r + 24) * w + std::size_t(c)]);
    }
    for (; r < r1; r += 8) s += convert<float>(Y[std::size_t(r) * w + std::size_t(c)]);
    s = (s + s1) + (s2 + s3);
  }
  __shared__ float part[8][33];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0;
#pragma unroll
    for (int y = 0; y < 8; ++y) t += part[y][threadIdx.x];
    partial[std::size_t(blockIdx.y) * std::size_t(cols) + std::size_t(c)] = t;
  }
}
// The same partial sums, V columns per thread in one 16-byte load per row:
// each column is summed by the same thread rows, into the same four
// accumulators, in the same order, and the block combines them as above, so
// the partials equal column_partial_kernel's bit for bit (with 8x fewer loads).
template <class C, int V>
__global__ void column_partial_vec_kernel(const C* Y, int n, int cols, int rows_per_part, float* partial) {
  const int c = (int(blockIdx.x) * 32 + int(threadIdx.x)) * V;
  const int r0 = int(blockIdx.y) * rows_per_part, r1 = min(n, r0 + rows_per_part);
  float s[V] = {}, s1[V] = {}, s2[V] = {}, s3[V] = {};
  auto add = [](float* acc, const vec<C, V>& x) {
    TESSERA_UNROLL
    for (int k = 0; k < V; ++k) acc[k] += convert<float>(x.v[k]);
  };
  if (c < cols) {
    int r = r0 + int(threadIdx.y);
    const std::size_t w = std::size_t(cols);
    for (; r + 24 < r1; r += 32) {
      const vec<C, V> a = load_vec<V>(Y + std::size_t(r) * w + std::size_t(c));
      const vec<C, V> b = load_vec<V>(Y + std::size_t(r + 8) * w + std::size_t(c));
      const vec<C, V> d = load_vec<V>(Y + std::size_t(r + 16) * w + std::size_t(c));
      const vec<C, V> e = load_vec<V>(Y + std::size_t(r + 24) * w + std::size_t(c));
      add(s, a);
      add(s1, b);
      add(s2, d);
      add(s3, e);
    }
    for (; r < r1; r += 8) add(s, load_vec<V>(Y + std::size_t(r) * w + std::size_t(c)));
    TESSERA_UNROLL
    for (int k = 0; k < V; ++k) s[k] = (s[k] + s1[k]) + (s2[k] + s3[k]);
  }
  __shared__ float part[8][32 * V + 1];
  TESSERA_UNROLL
  for (int k = 0; k < V; ++k) part[threadIdx.y][int(threadIdx.x) * V + k] = s[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    TESSERA_UNROLL
    for (int k = 0; k < V; ++k) {
      float t = 0;
#pragma unroll
      for (int y = 0; y < 8; ++y) t += part[y][int(threadIdx.x) * V + k];
      partial[std::size_t(blockIdx.y) * std::size_t(cols) + std::size_t(c + k)] = t;
    }
  }
}
template <class T>
__global__ void column_finish_kernel(const T* partial, int parts, int cols, float* out, bool overwrite) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= cols) return;
  float t = 0;
  for (int p = 0; p < parts; ++p) t += convert<float>(partial[std::size_t(p) * std::size_t(cols) + std::size_t(c)]);
  out[c] = overwrite ? t : out[c] + t;
}

using workspace::column_parts_max;       // most row slices column_sums uses
using workspace::column_scratch_floats;  // its scratch for up to max_cols columns

//! out[c] (+)= sum_r Y[r, c] for Y[n, cols]; scratch holds column_scratch_floats(cols) floats
//! (checked: an undersized scratch is an error, not a write past its end).
template <class C>
void column_sums(const C* Y, int n, int cols, float* out, bool overwrite, std::span<float> scratch) {
  const cudaStream_t s = tessera::cuda::current_stream();
  const int chunks = (cols + 31) / 32;
  // Enough slices for about 2048 blocks (all SMs busy with loads in flight), each of at least 64 rows.
  int parts = std::max(1, std::min({column_parts_max, (n + 63) / 64, std::max(1, 2048 / chunks)}));
  const int rows = (n + parts - 1) / std::max(parts, 1);
  parts = n == 0 ? 0 : (n + rows - 1) / rows;
  TESSERA_CHECK(std::size_t(parts) * std::size_t(std::max(cols, 0)) <= scratch.size(), "column_sums over ", n, " rows of ",
                cols, " columns needs ", std::size_t(parts) * std::size_t(cols), " floats of scratch; ", scratch.size(),
                " given");
  if (parts > 0) {
    // The slices stay those of 32-column chunks whichever kernel runs, so both give the same sums.
    constexpr int V = 16 / int(sizeof(C));
    if (cols % V == 0 && aligned16(Y)) {
      const unsigned wide = unsigned((cols / V + 31) / 32);
      column_partial_vec_kernel<C, V><<<dim3(wide, unsigned(parts)), dim3(32, 8), 0, s>>>(Y, n, cols, rows, scratch.data());
    } else {
      column_partial_kernel<<<dim3(unsigned(chunks), unsigned(parts)), dim3(32, 8), 0, s>>>(Y, n, cols, rows, scratch.data());
    }
    TESSERA_CUDA(cudaGetLastError());
  }
  column_finish_kernel<<<blocks_for(std::size_t(cols), 256), 256, 0, s>>>(scratch.data(), parts, cols, out, overwrite);
  TESSERA_CUDA(cudaGetLastError());
}

//! out[c] (+)= v[c]: a bias gradient cuBLASLt wrote in the compute type, into fp32 gradients.
template <class C>
void accumulate(const C* v, int cols, float* out, bool overwrite) {
  column_finish_kernel<<<blocks_for(std::size_t(cols), 256), 256, 0, tessera::cuda::current_stream()>>>(v, 1, cols, out,
                                                                                                         overwrite);
  TESSERA_CUDA(cudaGetLastError());
}

// ---- what the epilogues do, for when they cannot run (fp32, odd widths) ----
template <class C>
__global__ void bias_gelu_kernel(C* H, const C* b, std::size_t n, int cols, C* A) {
  const std::size_t total = n * std::size_t(cols);
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += std::size_t(gridDim.x) * blockDim.x) {
    const float h = convert<float>(H[i]) + convert<float>(b[i % std::size_t(cols)]);
    H[i] = convert<C>(h);
    A[i] = convert<C>(gelu(h));
  }
}
//! H[n, cols] += b (kept as the GELU input); A = gelu(H).
template <class C>
void bias_gelu(C* H, const C* b, int n, int cols, C* A) {
  const std::size_t total = std::size_t(n) * std::size_t(cols);
  if (total == 0) return;
  bias_gelu_kernel<<<blocks_for(total, 256), 256, 0, tessera::cuda::current_stream()>>>(H, b, std::size_t(n), cols, A);
  TESSERA_CUDA(cudaGetLastError());
}

template <class C>
__global__ void gelu_kernel(const C* H, std::size_t total, C* A) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += std::size_t(gridDim.x) * blockDim.x)
    A[i] = convert<C>(gelu(convert<float>(H[i])));
}
// 16 bytes per load and store (8 bf16): the scalar form reached about a third
// of the copy bandwidth on the 1B model's 134M-element blocks.
template <class C>
__global__ void gelu_vec_kernel(const uint4* H, std::size_t vecs, uint4* A) {
  constexpr int per = int(sizeof(uint4) / sizeof(C));
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vecs; i += std::size_t(gridDim.x) * blockDim.x) {
    const uint4 h = H[i];
    uint4 a;
    const C* hv = reinterpret_cast<const C*>(&h);
    C* av = reinterpret_cast<C*>(&a);
#pragma unroll
    for (int k = 0; k < per; ++k) av[k] = convert<C>(gelu(convert<float>(hv[k])));
    A[i] = a;
  }
}
//! A = gelu(H) elementwise: a block's activation recomputed from its kept GELU input.
template <class C>
void gelu_of(const C* H, std::size_t total, C* A) {
  if (total == 0) return;
  constexpr std::size_t per = sizeof(uint4) / sizeof(C);
  const cudaStream_t s = tessera::cuda::current_stream();
  if ((reinterpret_cast<std::uintptr_t>(H) | reinterpret_cast<std::uintptr_t>(A)) % sizeof(uint4) == 0 && total % per == 0) {
    gelu_vec_kernel<C><<<blocks_for(total / per, 256), 256, 0, s>>>(reinterpret_cast<const uint4*>(H), total / per,
                                                                  reinterpret_cast<uint4*>(A));
  } else {
    gelu_kernel<<<blocks_for(total, 256), 256, 0, s>>>(H, total, A);
  }
  TESSERA_CUDA(cudaGetLastError());
}

template <class C>
__global__ void add_bias_kernel(C* Y, const C* b, std::size_t n, int cols) {
  const std::size_t total = n * std::size_t(cols);
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += std::size_t(gridDim.x) * blockDim.x)
    Y[i] = convert<C>(convert<float>(Y[i]) + convert<float>(b[i % std::size_t(cols)]));
}
// The same sum, 16 bytes per access: thread x of the grid's x extent takes
// columns [V x, V x + V) and keeps their bias in registers; the grid's y
// extent strides over rows. No index division (the element-wise form's
// 64-bit modulo per element made it several times slower than a copy).
template <class C, int V>
__global__ void add_bias_vec_kernel(C* Y, const C* b, int n, int cols) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c >= cols) return;
  const vec<C, V> bv = load_vec<V>(b + c);
  float bias[V];
  TESSERA_UNROLL
  for (int k = 0; k < V; ++k) bias[k] = convert<float>(bv.v[k]);
  for (int r = int(blockIdx.y); r < n; r += int(gridDim.y)) {
    C* y = Y + std::size_t(r) * std::size_t(cols) + std::size_t(c);
    vec<C, V> x = load_vec<V>(y);
    TESSERA_UNROLL
    for (int k = 0; k < V; ++k) x.v[k] = convert<C>(convert<float>(x.v[k]) + bias[k]);
    store_vec<V>(y, x);
  }
}
//! Y[n, cols] += b.
template <class C>
void add_bias(C* Y, const C* b, int n, int cols) {
  const std::size_t total = std::size_t(n) * std::size_t(cols);
  if (total == 0) return;
  const cudaStream_t s = tessera::cuda::current_stream();
  constexpr int V = 16 / int(sizeof(C));
  if (cols % V == 0 && aligned16(Y) && aligned16(b)) {
    const unsigned threads = unsigned(std::min(128, ((cols / V + 31) / 32) * 32));
    const unsigned bx = unsigned((cols / V + int(threads) - 1) / int(threads));
    // About 4096 blocks in all, each over at least two rows.
    const unsigned by = unsigned(std::max(1, std::min((n + 1) / 2, int(4096 / bx) + 1)));
    add_bias_vec_kernel<C, V><<<dim3(bx, by), threads, 0, s>>>(Y, b, n, cols);
  } else {
    add_bias_kernel<<<blocks_for(total, 256), 256, 0, s>>>(Y, b, std::size_t(n), cols);
  }
  TESSERA_CUDA(cudaGetLastError());
}

template <class C>
__global__ void dgelu_kernel(C* dA, const C* H, std::size_t total) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += std::size_t(gridDim.x) * blockDim.x)
    dA[i] = convert<C>(convert<float>(dA[i]) * gelu_grad(convert<float>(H[i])));
}
//! dA *= gelu'(H), elementwise over total elements.
template <class C>
void dgelu(C* dA, const C* H, std::size_t total) {
  if (total == 0) return;
  dgelu_kernel<<<blocks_for(total, 256), 256, 0, tessera::cuda::current_stream()>>>(dA, H, total);
  TESSERA_CUDA(cudaGetLastError());
}

}  // namespace mlp_lm::gpu
