#pragma once
// GPT-2's element-wise layers, the exact attention and the loss on the GPU,
// the same arithmetic as host_kernels.hpp: the residual stream and statistics
// in fp32; what feeds a GEMM (attention and GELU outputs, gradients) in the
// compute type C (fp32 or bf16). The exact attention holds one query row's
// scores in shared memory (no T x T matrix in global memory): what the fp32
// trainer runs, and bf16 where the flash kernels (cuda_flash.cuh) do not
// apply. LayerNorm is cuda_layernorm.cuh; the embeddings' weight gradients
// use atomics.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "tessera/backend/cuda/error.hpp"
#include "tessera/core/dtype.hpp"
#include "trainer_kit/host_math.hpp"

namespace gpt::kernels {

using tessera::convert;

//! Blocks of 256 threads for a grid-stride loop over `total` elements.
inline unsigned grid(std::size_t total) { return unsigned(std::min<std::size_t>((total + 255) / 256, 32768)); }
//! Blocks of `kernel` (`threads` a block, `bytes` of dynamic shared memory)
//! the current device holds at once: its SM count times the occupancy
//! calculator's blocks an SM, for a grid-stride kernel that should fill the
//! device once. The last answer is kept per thread, so a launcher called with
//! the same shape every layer asks the driver once, not every launch.
inline int resident_blocks(const void* kernel, int threads, std::size_t bytes) {
  struct key {
    int device;
    const void* kernel;
    int threads;
    std::size_t bytes;
    bool operator==(const key&) const = default;
  };
  thread_local key last{-1, nullptr, 0, 0};
  thread_local int blocks = 1;
  key k{0, kernel, threads, bytes};
  TESSERA_CUDA(cudaGetDevice(&k.device));
  if (k == last) return blocks;
  int sms = 0, per_sm = 0;
  TESSERA_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, k.device));
  TESSERA_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, bytes));
  blocks = std::max(sms, 1) * std::max(per_sm, 1);
  last = k;
  return blocks;
}
//! A launch's error (a bad configuration) as a tessera error.
inline void check_launch() { TESSERA_CUDA(cudaGetLastError()); }

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

//! tanh-GELU as x sigmoid(2u) = x / (1 + e^-2u), u = sqrt(2/pi) (x + 0.044715 x^3):
//! the same function as gelu() in a few instructions instead of tanhf's many,
//! for outputs rounded to bf16 (a few fp32 ulps apart from gelu()).
__device__ inline float gelu_fast(float x) {
  const float u = 0.7978845608028654f * fmaf(0.044715f * x, x * x, x);
  return x / (1.0f + __expf(-2.0f * u));
}

//! a = gelu(h) in C (recomputed in backward). Where h and a are 16-bit and
//! 16-byte aligned, 8 elements a thread at a time with gelu_fast (one element
//! a thread with tanhf ran at 40% of copy speed), the tail one at a time;
//! an fp32 output (the host's arithmetic) with gelu().
template <class H, class C>
__global__ void gelu_kernel(const H* h, C* a, std::size_t total) {
  const std::size_t first = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x, stride = std::size_t(gridDim.x) * blockDim.x;
  std::size_t done = 0;
  if constexpr (sizeof(H) == 2 && sizeof(C) == 2) {
    if (((reinterpret_cast<std::uintptr_t>(h) | reinterpret_cast<std::uintptr_t>(a)) & 15) == 0) {
      const std::size_t vecs = total / 8;
      for (std::size_t k = first; k < vecs; k += stride) {
        uint4 u = reinterpret_cast<const uint4*>(h)[k];
        H in[8];
        C out[8];
        memcpy(in, &u, sizeof u);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = convert<C>(gelu_fast(float(in[i])));
        memcpy(&u, out, sizeof u);
        reinterpret_cast<uint4*>(a)[k] = u;
      }
      done = vecs * 8;
    }
  }
  for (std::size_t k = done + first; k < total; k += stride)
    a[k] = convert<C>(sizeof(C) == 2 ? gelu_fast(float(h[k])) : gelu(float(h[k])));
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

//! out += in, then in = 0: a sum handed on, its buffer ready to gather the next.
template <class T = float>
__global__ void drain_kernel(T* in, float* out, int total) {
  for (int k = int(blockIdx.x * blockDim.x + threadIdx.x); k < total; k += int(gridDim.x * blockDim.x)) {
    out[k] += float(in[k]);
    in[k] = T(0);
  }
}

//! Up to 8 float spans, zeroed by one zero_spans_kernel launch.
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
inline void zero_spans(const float_spans& s, cudaStream_t stream) {
  if (s.count == 0) return;
  const int most = *std::max_element(s.n, s.n + s.count);
  const unsigned blocks = unsigned(std::clamp((most + 1023) / 1024, 1, 1024));  // 4 elements a thread
  zero_spans_kernel<float_spans><<<dim3(blocks, unsigned(s.count)), 256, 0, stream>>>(s);
  check_launch();
}

//! out = in, converted (fp32 to C).
template <class C>
__global__ void convert_kernel(const float* in, C* out, std::size_t total) {
  for (std::size_t k = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; k < total; k += std::size_t(gridDim.x) * blockDim.x)
    out[k] = convert<C>(in[k]);
}

//! out[c] += sum over rows of y[row, c]: blocks of 256 columns x 256 rows,
//! one atomic per column and block, or (--deterministic) each block's sums
//! written to partial[blockIdx.y][c] for column_finish_kernel (cuda_ordered.cuh).
template <class T>
__global__ void column_sum_kernel(const T* y, int n, int cols, float* out, float* partial) {
  const int c = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= cols) return;
  const int r0 = int(blockIdx.y) * 256, r1 = min(n, r0 + 256);
  float s = 0;
  for (int r = r0; r < r1; ++r) s += float(y[std::size_t(r) * std::size_t(cols) + c]);
  if (partial) partial[std::size_t(blockIdx.y) * std::size_t(cols) + std::size_t(c)] = s;
  else atomicAdd(out + c, s);
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

//! Attention backward, one block per (query row i, b x h): dq_i written;
//! dk_j and dv_j accumulated with atomics into dqkv (zeroed before), or with
//! Dvec (--deterministic) none of them: D_i = dy_i . y_i goes to Dvec, and
//! attention_backward_kv_kernel adds dk and dv in a fixed order.
template <class C, class Q = float>
__global__ void attention_backward_kernel(const Q* dy, const Q* qkv, const C* y, const float* lse, float* dqkv,
                                          int T, int H, int hd, float* Dvec = nullptr) {
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
  if (Dvec && threadIdx.x == 0) Dvec[(std::size_t(b) * T + i) * H + h] = D;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const std::size_t kj = (std::size_t(b) * T + j) * std::size_t(row) + d + std::size_t(h) * hd;
    const Q* k = qkv + kj;
    const Q* v = qkv + kj + d;
    float dot = 0, dp = 0;
    for (int c = 0; c < hd; ++c) dot += float(q[c]) * float(k[c]), dp += float(g[c]) * float(v[c]);
    const float pj = __expf(dot * scale - l);
    const float ds = pj * (dp - D) * scale;
    p[j] = ds;
    if (Dvec) continue;
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

//! dk_j and dv_j of attention without atomics (--deterministic), after
//! attention_backward_kernel with Dvec: one block per (key row j, b x h)
//! walks the query rows i >= j in order, a chunk at a time: p_ij and ds_ij
//! into shared memory, then each thread adds its columns' share in i's order
//! (dqkv's dk and dv zeroed before).
template <class Q>
__global__ void attention_backward_kv_kernel(const Q* dy, const Q* qkv, const float* lse, const float* Dvec, float* dqkv,
                                             int T, int H, int hd) {
  constexpr int chunk = 512;
  __shared__ float p[chunk], ds[chunk];
  const int j = int(blockIdx.x), bh = int(blockIdx.y), b = bh / H, h = bh % H;
  const int d = H * hd, row = 3 * d;
  const float scale = rsqrtf(float(hd));
  const std::size_t first = std::size_t(b) * std::size_t(T), kj = (first + j) * std::size_t(row) + d + std::size_t(h) * hd;
  const Q* k = qkv + kj;
  const Q* v = qkv + kj + d;
  for (int i0 = j; i0 < T; i0 += chunk) {
    const int i1 = min(T, i0 + chunk);
    __syncthreads();  // the previous chunk's p and ds are read
    for (int i = i0 + int(threadIdx.x); i < i1; i += int(blockDim.x)) {
      const Q* q = qkv + (first + i) * std::size_t(row) + std::size_t(h) * hd;
      const Q* g = dy + (first + i) * std::size_t(d) + std::size_t(h) * hd;
      float dot = 0, dp = 0;
      for (int c = 0; c < hd; ++c) dot += float(q[c]) * float(k[c]), dp += float(g[c]) * float(v[c]);
      const std::size_t at = (first + i) * std::size_t(H) + std::size_t(h);
      const float pj = __expf(dot * scale - lse[at]);
      p[i - i0] = pj;
      ds[i - i0] = pj * (dp - Dvec[at]) * scale;
    }
    __syncthreads();
    for (int c = int(threadIdx.x); c < hd; c += int(blockDim.x)) {
      float ak = 0, av = 0;
      for (int i = i0; i < i1; ++i) {
        ak += ds[i - i0] * float(qkv[(first + i) * std::size_t(row) + std::size_t(h) * hd + c]);
        av += p[i - i0] * float(dy[(first + i) * std::size_t(d) + std::size_t(h) * hd + c]);
      }
      dqkv[kj + c] += ak;
      dqkv[kj + d + c] += av;
    }
  }
}

//! One block per row of logits in C (fp32, or bf16 as the bf16 classifier
//! writes them), rows ld apart with the real vocabulary V <= ld first: the
//! row's cross-entropy over the V real entries into *loss (double atomics;
//! or, with row_loss, into row_loss[row] for a sum in a fixed order) and,
//! with `grad`, dloss/dz x scale written over the logits in place, zero
//! in the ld - V padded columns (so the padded rows of a tied table get no
//! gradient). 16 bytes a thread at a time (ld a multiple of 16 / sizeof(C),
//! rows 16-byte aligned: cross_entropy() checks), several loads in flight:
//! one element a thread at a time left the kernel waiting on memory, 3x
//! slower than its bytes. Three passes (max; sum of exp; gradient), each
//! element independent of the last: an online softmax chains every element's
//! update on the one before and left the kernel bound by that latency.
//! Cached: the first pass keeps the row in shared memory, so global memory
//! sees one read and one write of it (a GPT-2 row of bf16 logits is 98 KiB:
//! two rows per SM); otherwise each pass reads it again. The padding lets
//! the classifier's GEMMs run on aligned rows.
template <class C, bool Cached>
__global__ void cross_entropy_kernel(C* z, const std::uint16_t* target, int V, int ld, float scale, bool grad,
                                     double* loss, double* row_loss) {
  constexpr int N = 16 / int(sizeof(C));  // elements per 16-byte chunk
  constexpr float log2e = 1.4426950408889634f;
  extern __shared__ uint4 cache[];        // Cached: the row, ld / N chunks
  __shared__ float red[32];
  const std::size_t r = blockIdx.x;
  C* row = z + r * std::size_t(ld);
  uint4* chunks = reinterpret_cast<uint4*>(row);
  const uint4* from = Cached ? cache : chunks;  // passes 2 and 3 read here
  const int nchunks = ld / N;
  auto unpack = [](const uint4& u, float* v) {
    C e[N];
    memcpy(e, &u, sizeof u);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = float(e[i]);
  };
  float m = -FLT_MAX;
#pragma unroll 4
  for (int k = int(threadIdx.x); k < nchunks; k += int(blockDim.x)) {
    const uint4 u = chunks[k];
    if constexpr (Cached) cache[k] = u;
    float v[N];
    unpack(u, v);
#pragma unroll
    for (int i = 0; i < N; ++i) m = fmaxf(m, k * N + i < V ? v[i] : -FLT_MAX);
  }
  m = block_reduce<true>(m, red);  // its __syncthreads: the cached row is whole
  const float mb = m * log2e;      // exp(v - m) = 2^(v log2 e - m log2 e)
  float s = 0;
#pragma unroll 4
  for (int k = int(threadIdx.x); k < nchunks; k += int(blockDim.x)) {
    float v[N];
    unpack(from[k], v);
#pragma unroll
    for (int i = 0; i < N; ++i) s += k * N + i < V ? exp2f(fmaf(v[i], log2e, -mb)) : 0.0f;
  }
  s = block_reduce<false>(s, red);
  const int t = target[r];
  const float zt = float(reinterpret_cast<const C*>(from)[t]);
  if (threadIdx.x == 0) {
    const double l = double(logf(s) + m - zt);
    if (row_loss) row_loss[r] = l;
    else atomicAdd(loss, l);
  }
  if (!grad) return;
  if constexpr (!Cached) __syncthreads();  // every thread has read row[t] before it is overwritten
  const float inv = scale / s;
#pragma unroll 4
  for (int k = int(threadIdx.x); k < nchunks; k += int(blockDim.x)) {
    float v[N];
    unpack(from[k], v);
    C e[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int c = k * N + i;
      e[i] = convert<C>(c < V ? fmaf(exp2f(fmaf(v[i], log2e, -mb)), inv, c == t ? -scale : 0.0f) : 0.0f);
    }
    uint4 u;
    memcpy(&u, e, sizeof u);
    chunks[k] = u;
  }
}

//! The largest row (bytes) cross_entropy() keeps in shared memory on the
//! current device: its opt-in limit less the kernel's static arrays, raised
//! for the kernel once per device (the attribute is the device's; a process
//! may drive several). Past 64 devices: 0, the streamed form.
template <class C>
std::size_t cross_entropy_cache_limit() {
  constexpr int max_devices = 64;
  static std::array<std::once_flag, max_devices> once;
  static std::array<std::size_t, max_devices> limit{};
  int dev = 0;
  TESSERA_CUDA(cudaGetDevice(&dev));
  if (dev < 0 || dev >= max_devices) return 0;
  std::call_once(once[std::size_t(dev)], [dev] {
    int optin = 0;
    TESSERA_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const std::size_t bytes = std::size_t(optin) > 1024 ? std::size_t(optin) - 1024 : 0;
    TESSERA_CUDA(cudaFuncSetAttribute(cross_entropy_kernel<C, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(bytes)));
    limit[std::size_t(dev)] = bytes;
  });
  return limit[std::size_t(dev)];
}

//! Launches cross_entropy_kernel over `rows` rows on stream s: the cached
//! form (512 threads) where a row fits in shared memory, else the one that
//! reads the row from global memory in each of its three passes. With
//! row_loss, each row's loss goes there instead of into *loss.
template <class C>
void cross_entropy(C* z, const std::uint16_t* target, int V, int ld, float scale, bool grad, double* loss,
                   std::size_t rows, cudaStream_t s, bool allow_cache = true, double* row_loss = nullptr) {
  constexpr int N = 16 / int(sizeof(C));
  TESSERA_CHECK(ld % N == 0 && reinterpret_cast<std::uintptr_t>(z) % 16 == 0 && V <= ld,
                "cross_entropy: rows of ", ld, " logits must be 16-byte aligned and hold the vocabulary of ", V);
  if (rows == 0) return;
  const std::size_t bytes = std::size_t(ld) * sizeof(C);
  if (allow_cache && bytes <= cross_entropy_cache_limit<C>())
    cross_entropy_kernel<C, true><<<unsigned(rows), 512, bytes, s>>>(z, target, V, ld, scale, grad, loss, row_loss);
  else
    cross_entropy_kernel<C, false><<<unsigned(rows), 256, 0, s>>>(z, target, V, ld, scale, grad, loss, row_loss);
  check_launch();
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
