#pragma once
//! \file Element functors for backend_ops<B>::for_each over gradient and
//! weight buffers: dtype conversion with a scale, and accumulation. The
//! wrappers run them around every collective; public, so that a benchmark or
//! a trainer times and runs the very same passes.
#include <cstddef>

#include "tessera/core/config.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/vec.hpp"

namespace tessera {

//! y[i] = convert(x[i]) * s (x == y allowed). Eight elements per thread with
//! vector accesses where both pointers allow it: the wire conversion before
//! every reduction ran at 0.19-0.25 of the device's copy speed element by
//! element (bench/RESULTS.md, fsdp2 row copies).
template <class To, class From>
struct scale_convert {
  const From* x;
  To* y;
  float s;
  bool vector_ok;
  static constexpr int vector_width = 8;
  scale_convert(const From* x_, To* y_, double s_) noexcept
      : x(x_), y(y_), s(float(s_)), vector_ok(aligned_for<vector_width>(x_, y_)) {}
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const { y[i] = convert<To>(convert<float>(x[i]) * s); }
  template <int V, bool Stream = false>
  TESSERA_HOST_DEVICE void run(std::size_t base) const {
    const auto in = load_vec<V, Stream>(x + base);
    vec<To, V> out;
    TESSERA_UNROLL
    for (int l = 0; l < V; ++l) out.v[l] = convert<To>(convert<float>(in.v[l]) * s);
    store_vec<V, Stream>(y + base, out);
  }
};

//! y[i] += convert(x[i]) * s  (or = when overwrite)
template <class To, class From>
struct accumulate_convert {
  const From* x;
  To* y;
  float s;
  bool overwrite;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const {
    const float v = convert<float>(x[i]) * s;
    y[i] = overwrite ? convert<To>(v) : convert<To>(convert<float>(y[i]) + v);
  }
};

}  // namespace tessera
