#pragma once
// Helpers of the CUDA suites: copies between host vectors and device buffers.
#include <span>
#include <vector>

#include "tessera/tessera.hpp"

namespace tessera_test {

template <class T> std::vector<T> to_host(const tessera::cuda::buffer<T>& b) {
  std::vector<T> h(b.size());
  tessera::backend_ops<tessera::backend::cuda>::copy_to_host(std::span<T>(h), b.span());
  return h;
}
template <class T> tessera::cuda::buffer<T> to_device(const std::vector<T>& h) {
  tessera::cuda::buffer<T> b(h.size());
  tessera::backend_ops<tessera::backend::cuda>::copy_from_host(b.span(), std::span<const T>(h));
  return b;
}

}  // namespace tessera_test
