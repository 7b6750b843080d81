#pragma once
//! \file backend_ops<backend::cuda>: device buffers, and element-wise and
//! reduction kernels on the current stream (tessera::cuda::current_stream()).
//! Compile with nvcc.
//!
//! Which tool and why:
//! - for_each: a hand-written grid-stride kernel. The optimizer's functors fuse
//!   the whole update (and the compute-weight cast) into one pass, which no
//!   library call offers; where the functor has a 4-wide path and aligned
//!   pointers it moves 16 bytes per thread per array.
//! - fill / copy: a functor through for_each, and cudaMemcpyAsync.
//! - sum_squares_into: a block reduction (cub::BlockReduce) in double with one
//!   atomicAdd per block, accumulating into device memory so that every unit's
//!   partial norm and the all-reduce stay on the device until one copy out;
//!   every unit's gradients in one launch (a batch of spans). exact_reduction's
//!   two passes (max_abs_into, sum_squares_fixed_into) walk the same batches.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <memory>
#include <span>

#include "tessera/backend/cuda/buffer.hpp"
#include "tessera/backend/cuda/stream.hpp"
#include "tessera/backend/ops.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/fixed_point.hpp"
#include "tessera/core/vec.hpp"

namespace tessera {

namespace cuda {
//! How a vector for_each spreads its chunks of V elements over threads
//! (backend_ops<backend::cuda>::for_each_vector; benchmarks compare them).
enum class spread {
  grid_stride,     //!< a grid that fills the device once; each thread loops
  one_per_thread,  //!< one chunk per thread, as many blocks as it takes
  unrolled,        //!< grid_stride with the loop unrolled 4 times (more loads in flight)
};
}  // namespace cuda

namespace cuda::detail {

template <class F>
__global__ void for_each_kernel(std::size_t n, F f) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    f(i);
}

template <int V, spread Mode, bool Stream, class F>
__global__ void for_each_vec_kernel(std::size_t n, F f) {
  const std::size_t chunks = n / V;
  const std::size_t tid = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  if constexpr (Mode == spread::one_per_thread) {
    if (tid < chunks) f.template run<V, Stream>(tid * V);
  } else if constexpr (Mode == spread::grid_stride) {
    for (std::size_t c = tid; c < chunks; c += stride) f.template run<V, Stream>(c * V);
  } else {
#pragma unroll 4
    for (std::size_t c = tid; c < chunks; c += stride) f.template run<V, Stream>(c * V);
  }
  const std::size_t t = chunks * V + tid;  // the last n % V elements
  if (t < n) f(t);
}

template <class T>
struct fill_fn {
  T* p;
  T v;
  __device__ void operator()(std::size_t i) const { p[i] = v; }
};

// Up to span_batch_size spans of one dtype, read by one launch (the global
// norm's passes over every unit's gradients).
inline constexpr int span_batch_size = 64;
template <class T>
struct span_batch {
  const T* p[span_batch_size];
  std::size_t n[span_batch_size];
  bool aligned[span_batch_size];  // p[k] allows 16-byte loads
  int count;
};

// f(x) for this thread's share of every element of every span: a grid-stride
// walk over each span in turn, 16-byte loads (four in flight) where the span
// allows them. No barrier between spans, so a thread done with one goes on
// to the next: one launch for all of them, and no tail per span.
template <int Threads, class T, class F>
__device__ void for_each_element(const span_batch<T>& xs, F&& f) {
  constexpr int V = 16 / sizeof(T) > 0 ? int(16 / sizeof(T)) : 1;
  const std::size_t tid = std::size_t(blockIdx.x) * Threads + threadIdx.x;
  const std::size_t stride = std::size_t(gridDim.x) * Threads;
  for (int k = 0; k < xs.count; ++k) {
    const T* x = xs.p[k];
    const std::size_t n = xs.n[k];
    std::size_t done = 0;
    if (xs.aligned[k]) {
      const std::size_t chunks = n / V;
#pragma unroll 4
      for (std::size_t c = tid; c < chunks; c += stride) {
        const auto v = load_vec<V, true>(x + c * V);
        TESSERA_UNROLL
        for (int l = 0; l < V; ++l) f(v.v[l]);
      }
      done = chunks * V;
    }
    for (std::size_t i = done + tid; i < n; i += stride) f(x[i]);
  }
}

// Summed in double: the FP64 rate is far above what memory delivers here,
// so it costs nothing.
template <class T, int Threads>
__global__ void sum_squares_kernel(span_batch<T> xs, double* acc) {
  double s = 0, bad = 0;
  for_each_element<Threads>(xs, [&](T e) {
    const double f = convert<double>(e);
    if (isfinite(f)) s += f * f;
    else bad += 1;
  });
  using reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename reduce::TempStorage tmp[2];
  const double bs = reduce(tmp[0]).Sum(s);
  const double bb = reduce(tmp[1]).Sum(bad);
  if (threadIdx.x == 0) {
    atomicAdd(acc, bs);
    if (bb > 0) atomicAdd(acc + 1, bb);
  }
}

// exact_reduction's passes: the largest magnitude, then the squares on a
// fixed-point grid. Integer and max reductions give the same result in any
// order, so the atomics across blocks are deterministic.
template <int Threads>
__device__ void block_max_into(double m, double* acc) {
  using reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename reduce::TempStorage tmp;
  const double bm = reduce(tmp).Reduce(m, [](double a, double b) { return a > b ? a : b; });
  // Non-negative doubles order as their bit patterns do.
  if (threadIdx.x == 0)
    atomicMax(reinterpret_cast<unsigned long long*>(acc), static_cast<unsigned long long>(__double_as_longlong(bm)));
}
template <class F, int Threads>
__global__ void for_each_max_kernel(std::size_t n, F f, double* acc) {
  double m = 0;
  for (std::size_t i = std::size_t(blockIdx.x) * Threads + threadIdx.x; i < n; i += std::size_t(gridDim.x) * Threads)
    m = fmax(m, f(i));
  block_max_into<Threads>(m, acc);
}
template <class T, int Threads>
__global__ void max_abs_kernel(span_batch<T> xs, double* acc) {
  double m = 0;
  for_each_element<Threads>(xs, [&](T e) { m = fmax(m, fixed::magnitude(convert<double>(e))); });
  block_max_into<Threads>(m, acc);
}
template <class T, int Threads>
__global__ void sum_squares_fixed_kernel(span_batch<T> xs, const double* max, std::uint64_t* acc) {
  const double m = *max;
  if (!(m > 0) || !isfinite(m)) return;
  const int t = fixed::square_shift(m);
  constexpr int K = int(fixed::norm_limbs);
  std::uint64_t l[K] = {};
  for_each_element<Threads>(xs, [&](T e) { fixed::add_square(convert<double>(e), t, l); });
  using reduce = cub::BlockReduce<unsigned long long, Threads>;
  __shared__ typename reduce::TempStorage tmp[K];
  unsigned long long b[K];
  for (int k = 0; k < K; ++k) b[k] = reduce(tmp[k]).Sum(static_cast<unsigned long long>(l[k]));
  if (threadIdx.x == 0)
    for (int k = 0; k < K; ++k) atomicAdd(reinterpret_cast<unsigned long long*>(acc + k), b[k]);
}

//! Resident blocks of `threads` that fill the device once (cached per device).
inline unsigned full_grid(int threads) {
  thread_local int device = -1, sms = 0, per_sm = 0;
  int d = 0;
  TESSERA_CUDA(cudaGetDevice(&d));
  if (d != device) {
    TESSERA_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d));
    TESSERA_CUDA(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, d));
    device = d;
  }
  return unsigned(sms * std::max(1, per_sm / threads));
}

template <class F>
concept vector_functor = requires(const F& f) {
  f.template run<F::vector_width, false>(std::size_t(0));
  { f.vector_ok } -> std::convertible_to<bool>;
};

}  // namespace cuda::detail

template <>
struct backend_ops<backend::cuda> {
  using tessera_backend_ops = void;
  template <class T> using buffer = cuda::buffer<T>;
  //! Pinned host memory for staging copies (DMA at full speed, no bounce in the driver).
  template <class T> using staging = cuda::pinned_buffer<T>;
  static constexpr int threads = 256;

  template <class T> static void fill(std::span<T> dst, T value) {
    for_each(dst.size(), cuda::detail::fill_fn<T>{dst.data(), value});
  }
  template <class T> static void copy(std::span<T> dst, std::span<const T> src) {
    TESSERA_CHECK(dst.size() == src.size(), "copy of ", src.size(), " elements into ", dst.size());
    if (!src.empty())
      TESSERA_CUDA(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDefault,
                                   cuda::current_stream()));
  }
  //! Host to device; returns once the host memory may be reused.
  template <class T> static void copy_from_host(std::span<T> dst, std::span<const T> src) {
    TESSERA_CHECK(dst.size() == src.size(), "copy of ", src.size(), " elements into ", dst.size());
    if (src.empty()) return;
    TESSERA_CUDA(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDefault, cuda::current_stream()));
    TESSERA_CUDA(cudaStreamSynchronize(cuda::current_stream()));
  }
  //! Device to host; returns when the values are there.
  template <class T> static void copy_to_host(std::span<T> dst, std::span<const T> src) {
    TESSERA_CHECK(dst.size() == src.size(), "copy of ", src.size(), " elements into ", dst.size());
    if (src.empty()) return;
    TESSERA_CUDA(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDefault, cuda::current_stream()));
    TESSERA_CUDA(cudaStreamSynchronize(cuda::current_stream()));
  }

  //! Device to host on the current stream without waiting (dst: staging
  //! memory); the values are there once a marker recorded after it is reached.
  template <class T> static void copy_to_host_async(std::span<T> dst, std::span<const T> src) {
    TESSERA_CHECK(dst.size() == src.size(), "copy of ", src.size(), " elements into ", dst.size());
    if (!src.empty())
      TESSERA_CUDA(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDefault,
                                   cuda::current_stream()));
  }
  //! Host (staging memory) to device on the current stream without waiting:
  //! src must stay unchanged until the stream passes the copy.
  template <class T> static void copy_from_host_async(std::span<T> dst, std::span<const T> src) {
    TESSERA_CHECK(dst.size() == src.size(), "copy of ", src.size(), " elements into ", dst.size());
    if (!src.empty())
      TESSERA_CUDA(cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDefault,
                                   cuda::current_stream()));
  }
  //! Host work in stream order (cudaLaunchHostFunc): f runs on the driver's
  //! callback thread once the current stream reaches it, and the stream's
  //! later work waits for it. f must not call CUDA and must not throw (an
  //! exception ends the process: a stream has nobody to report to).
  template <class F> static void host_task(F f) {
    auto* p = new F(std::move(f));
    const cudaError_t rc = cudaLaunchHostFunc(
        cuda::current_stream(),
        [](void* q) {
          std::unique_ptr<F> g(static_cast<F*>(q));
          (*g)();
        },
        p);
    if (rc != cudaSuccess) delete p;
    TESSERA_CUDA(rc);
  }
  //! A point in the work issued so far on the current stream: record() sets
  //! it, done() asks whether the work before it finished, wait() blocks the
  //! host until it did.
  struct marker {
    cuda::event e;
    void record() { e.record(cuda::current_stream()); }
    [[nodiscard]] bool done() const { return e.done(); }
    void wait() const { e.synchronize(); }
  };

  //! f(i) for i in [0, n) on the device; vector_width-wide where f offers it
  //! and says its pointers allow it (f.vector_ok). The launch shape is the one
  //! tessera-bench-optim --variants measured fastest on an H200 (2026-11-29,
  //! 2^30 elements): one 4-wide chunk per thread, default caching — fused
  //! AdamW at 98% of the device copy, against 92% for a grid-stride loop, 91%
  //! unrolled, 92-93% 8-wide; evict-first hints cost the bf16 path 6 points.
  template <class F> static void for_each(std::size_t n, const F& f) {
    if constexpr (cuda::detail::vector_functor<F>) {
      if (f.vector_ok) return for_each_vector<F::vector_width, cuda::spread::one_per_thread, false>(n, f);
    }
    if (n == 0) return;
    const unsigned blocks = unsigned(std::min<std::size_t>(cuda::detail::full_grid(threads), (n + threads - 1) / threads));
    cuda::detail::for_each_kernel<<<blocks, threads, 0, cuda::current_stream()>>>(n, f);
    TESSERA_CUDA(cudaGetLastError());
  }

  //! for_each over chunks of V elements with an explicit spread and cache
  //! policy (Stream: evict-first loads and stores); the benchmark's knob.
  template <int V, cuda::spread Mode, bool Stream, class F>
  static void for_each_vector(std::size_t n, const F& f) {
    if (n == 0) return;
    const std::size_t work = std::max<std::size_t>(n / V, 1);
    std::size_t blocks = (work + threads - 1) / threads;
    if (Mode != cuda::spread::one_per_thread) blocks = std::min<std::size_t>(blocks, cuda::detail::full_grid(threads));
    TESSERA_CHECK(blocks < (std::size_t(1) << 31), "for_each over ", n, " elements exceeds the grid");
    cuda::detail::for_each_vec_kernel<V, Mode, Stream><<<unsigned(blocks), threads, 0, cuda::current_stream()>>>(n, f);
    TESSERA_CUDA(cudaGetLastError());
  }

  //! for_each over memory across PCIe (placement::host buffers): a grid of
  //! `blocks` (enough 16-byte requests in flight to fill the link) instead
  //! of one chunk per thread, so that the update leaves the SMs to the
  //! compute stream while it waits on the link.
  template <class F> static void for_each_streaming(std::size_t n, const F& f, unsigned blocks = 64) {
    if (n == 0) return;
    if constexpr (cuda::detail::vector_functor<F>) {
      if (f.vector_ok) {
        cuda::detail::for_each_vec_kernel<F::vector_width, cuda::spread::grid_stride, false>
            <<<blocks, threads, 0, cuda::current_stream()>>>(n, f);
        TESSERA_CUDA(cudaGetLastError());
        return;
      }
    }
    cuda::detail::for_each_kernel<<<blocks, threads, 0, cuda::current_stream()>>>(n, f);
    TESSERA_CUDA(cudaGetLastError());
  }

  template <class T> static void sum_squares_into(std::span<const T> x, double* acc) {
    sum_squares_into(std::span<const std::span<const T>>(&x, 1), acc);
  }
  //! The same over several spans, span_batch_size of them per launch (the
  //! global norm's every unit in one: no tail and no launch per unit).
  template <class T> static void sum_squares_into(std::span<const std::span<const T>> xs, double* acc) {
    over_span_batches(xs, [&](const cuda::detail::span_batch<T>& b, unsigned blocks) {
      cuda::detail::sum_squares_kernel<T, threads><<<blocks, threads, 0, cuda::current_stream()>>>(b, acc);
    });
  }

  //! f(i) for i in [0, n), each returning a magnitude; acc[0] (device
  //! memory) becomes the largest of them and itself (see the host backend).
  template <class F> static void for_each_max(std::size_t n, const F& f, double* acc) {
    if (n == 0) return;
    const unsigned blocks = unsigned(std::min<std::size_t>(cuda::detail::full_grid(threads), (n + threads - 1) / threads));
    cuda::detail::for_each_max_kernel<F, threads><<<blocks, threads, 0, cuda::current_stream()>>>(n, f, acc);
    TESSERA_CUDA(cudaGetLastError());
  }

  //! acc[0] = max(acc[0], largest |x[i]|), +inf where some element is not
  //! finite (device memory; see the host backend).
  template <class T> static void max_abs_into(std::span<const T> x, double* acc) {
    max_abs_into(std::span<const std::span<const T>>(&x, 1), acc);
  }
  //! The same over several spans, span_batch_size of them per launch.
  template <class T> static void max_abs_into(std::span<const std::span<const T>> xs, double* acc) {
    over_span_batches(xs, [&](const cuda::detail::span_batch<T>& b, unsigned blocks) {
      cuda::detail::max_abs_kernel<T, threads><<<blocks, threads, 0, cuda::current_stream()>>>(b, acc);
    });
  }
  //! The squares of x on the fixed-point grid of *max, added to three uint64 limbs (see the host backend).
  template <class T> static void sum_squares_fixed_into(std::span<const T> x, const double* max, std::uint64_t* acc) {
    sum_squares_fixed_into(std::span<const std::span<const T>>(&x, 1), max, acc);
  }
  //! The same over several spans, span_batch_size of them per launch.
  template <class T>
  static void sum_squares_fixed_into(std::span<const std::span<const T>> xs, const double* max, std::uint64_t* acc) {
    over_span_batches(xs, [&](const cuda::detail::span_batch<T>& b, unsigned blocks) {
      cuda::detail::sum_squares_fixed_kernel<T, threads><<<blocks, threads, 0, cuda::current_stream()>>>(b, max, acc);
    });
  }

  //! Work that must follow an asynchronous operation, off the compute stream:
  //! a side stream waits for the compute stream's work so far, then `wait()`
  //! (a request's wait: the current stream waits for it) and `then()` (kernels
  //! on the current stream) are queued there at once. Returns a callable that
  //! makes the caller's current stream wait for all of it. So a gather's
  //! copy-out runs as soon as the gather lands, while the compute stream works
  //! on the unit before; the host does not wait. Each `Lane` has its own side
  //! stream (0: gathers' copies; 1: the optimizer's deferred updates, which
  //! would otherwise hold copy-outs up behind them; 2: offloaded units' host updates,
  //! behind their gradients' copies on lane 1).
  template <int Lane = 0, class Wait, class Then> static auto after(Wait wait, Then then) {
    auto& side = detail_side<Lane>();
    const cudaStream_t compute = cuda::current_stream();
    side.ready.record(compute);
    side.ready.wait_on(side.stream.get());
    {
      const cuda::scoped_stream on_side(side.stream.get());
      wait();
      then();
    }
    auto done = side.done.next();
    done->record(side.stream.get());
    return [done] { done->wait_on(cuda::current_stream()); };
  }

  static void synchronize() { TESSERA_CUDA(cudaStreamSynchronize(cuda::current_stream())); }
  //! Whether the current stream is being captured into a CUDA graph (work
  //! issued now runs when the graph is launched, not now).
  [[nodiscard]] static bool capturing() {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    TESSERA_CUDA(cudaStreamIsCapturing(cuda::current_stream(), &st));
    return st == cudaStreamCaptureStatusActive;
  }

private:
  // Calls launch(batch, blocks) for each span_batch_size of the non-empty
  // spans of xs, with the grid that fills the device for the longest of the
  // batch (it serves every span), and checks the launch.
  template <class T, class Launch> static void over_span_batches(std::span<const std::span<const T>> xs, Launch launch) {
    for (std::size_t k = 0; k < xs.size();) {
      cuda::detail::span_batch<T> b{};
      std::size_t longest = 0;
      for (; k < xs.size() && b.count < cuda::detail::span_batch_size; ++k) {
        if (xs[k].empty()) continue;
        b.p[b.count] = xs[k].data();
        b.n[b.count] = xs[k].size();
        b.aligned[b.count] = aligned_for<16 / sizeof(T)>(xs[k].data());
        longest = std::max(longest, xs[k].size());
        ++b.count;
      }
      if (b.count == 0) continue;
      launch(b, unsigned(std::min<std::size_t>(cuda::detail::full_grid(threads), (longest + threads - 1) / threads)));
      TESSERA_CUDA(cudaGetLastError());
    }
  }
  // after()'s side stream and events, one set per host thread (streams are per thread's work).
  struct side_stream {
    cuda::stream stream;
    cuda::event ready;
    cuda::event_pool done;
  };
  template <int Lane> static side_stream& detail_side() {
    thread_local side_stream s;
    return s;
  }
};

}  // namespace tessera
