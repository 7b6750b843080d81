#pragma once
//! \file V consecutive elements moved as one aligned access: 8, 16 or 32
//! bytes per thread on the device (16 is the widest single instruction; 32 is
//! two), a loop on the host. The pointer must be aligned to sizeof(T) * V.
//! `Stream` marks data read or written once (the optimizer's state): on the
//! device it uses the evict-first cache hint (ld.global.cs / st.global.cs) so
//! it does not push reusable lines out of L2.
#include <cstddef>

#include "tessera/core/config.hpp"

namespace tessera {

template <class T, int V>
struct alignas(sizeof(T) * V) vec {
  T v[V];
};

namespace detail {
#if defined(__CUDA_ARCH__)
template <class W, bool Stream> __device__ inline W ld(const W* p) {
  if constexpr (Stream) return __ldcs(p);
  else return *p;
}
template <class W, bool Stream> __device__ inline void st(W* p, const W& x) {
  if constexpr (Stream) __stcs(p, x);
  else *p = x;
}
#endif
}  // namespace detail

template <int V, bool Stream = false, class T>
TESSERA_HOST_DEVICE inline vec<T, V> load_vec(const T* p) {
#if defined(__CUDA_ARCH__)
  vec<T, V> r;
  constexpr std::size_t bytes = sizeof(T) * V;
  if constexpr (bytes % 16 == 0) {
    TESSERA_UNROLL
    for (std::size_t k = 0; k < bytes / 16; ++k)
      reinterpret_cast<int4*>(&r)[k] = detail::ld<int4, Stream>(reinterpret_cast<const int4*>(p) + k);
  } else if constexpr (bytes == 8) {
    *reinterpret_cast<int2*>(&r) = detail::ld<int2, Stream>(reinterpret_cast<const int2*>(p));
  } else {
    r = *reinterpret_cast<const vec<T, V>*>(p);
  }
  return r;
#else
  vec<T, V> r;
  for (int i = 0; i < V; ++i) r.v[i] = p[i];
  return r;
#endif
}

template <int V, bool Stream = false, class T>
TESSERA_HOST_DEVICE inline void store_vec(T* p, const vec<T, V>& x) {
#if defined(__CUDA_ARCH__)
  constexpr std::size_t bytes = sizeof(T) * V;
  if constexpr (bytes % 16 == 0) {
    TESSERA_UNROLL
    for (std::size_t k = 0; k < bytes / 16; ++k)
      detail::st<int4, Stream>(reinterpret_cast<int4*>(p) + k, reinterpret_cast<const int4*>(&x)[k]);
  } else if constexpr (bytes == 8) {
    detail::st<int2, Stream>(reinterpret_cast<int2*>(p), *reinterpret_cast<const int2*>(&x));
  } else {
    *reinterpret_cast<vec<T, V>*>(p) = x;
  }
#else
  for (int i = 0; i < V; ++i) p[i] = x.v[i];
#endif
}

//! True when every pointer is aligned for V-wide accesses of its type.
template <int V, class... T>
[[nodiscard]] inline bool aligned_for(const T*... p) noexcept {
  return ((reinterpret_cast<std::size_t>(p) % (sizeof(T) * V) == 0) && ...);
}

}  // namespace tessera
