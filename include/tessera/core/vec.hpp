#pragma once
//! \file V consecutive elements moved as one aligned access: 8 or 16 bytes per
//! thread on the device (the width that saturates memory), a loop on the host.
//! The pointer must be aligned to sizeof(T) * V.
#include <cstddef>

#include "tessera/core/config.hpp"

namespace tessera {

template <class T, int V>
struct alignas(sizeof(T) * V) vec {
  T v[V];
};

template <int V, class T>
TESSERA_HOST_DEVICE inline vec<T, V> load_vec(const T* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const vec<T, V>*>(p);
#else
  vec<T, V> r;
  for (int i = 0; i < V; ++i) r.v[i] = p[i];
  return r;
#endif
}

template <int V, class T>
TESSERA_HOST_DEVICE inline void store_vec(T* p, const vec<T, V>& x) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<vec<T, V>*>(p) = x;
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
