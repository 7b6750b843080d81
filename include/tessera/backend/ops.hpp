#pragma once
//! \file The backend interface the upper layers are written against.
//!
//! `backend_ops<B>` is specialised by backend/host/ops.hpp and
//! backend/cuda/ops.cuh. Each provides: `buffer<T>` (owning, move-only,
//! counted in memory_of<B>()), fill, copy, copy_from_host / copy_to_host,
//! for_each(n, f) calling a __host__ __device__ functor f(i) for i in [0, n),
//! sum_squares_into (adds the sum of squares in double and the count of
//! non-finite values of one span, or of a list of spans, to two doubles in
//! backend memory), exact_reduction's max_abs_into and sum_squares_fixed_into
//! (the largest magnitude, then the squares on its fixed-point grid; one span
//! or a list), and synchronize(). Element functors are shared between backends.
#include <cstddef>

#include "tessera/core/config.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/fixed_point.hpp"
#include "tessera/policy/backend.hpp"

namespace tessera {
template <class B> struct backend_ops;  // specialised per backend

namespace detail {
//! fixed::magnitude of x[i]: what backend_ops<B>::max_abs_into takes the max of.
template <class T> struct magnitude_at {
  const T* x;
  TESSERA_HOST_DEVICE double operator()(std::size_t i) const { return fixed::magnitude(convert<double>(x[i])); }
};
}  // namespace detail

//! A backend whose operations are visible in this translation unit.
template <class B>
concept backend_available = backend_policy<B> && requires { typename backend_ops<B>::tessera_backend_ops; };
}  // namespace tessera
