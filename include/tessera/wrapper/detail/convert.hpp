#pragma once
//! \file The element functors the wrapper runs over gradient and weight
//! buffers: dtype conversion with a scale, and accumulation. Shared by both
//! backends (backend_ops<B>::for_each).
#include <cstddef>

#include "tessera/core/config.hpp"
#include "tessera/core/dtype.hpp"

namespace tessera::detail {

//! y[i] = convert(x[i]) * s
template <class To, class From>
struct scale_convert {
  const From* x;
  To* y;
  double s;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const { y[i] = convert<To>(convert<float>(x[i]) * float(s)); }
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

}  // namespace tessera::detail
