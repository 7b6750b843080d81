#pragma once
// Launch geometry for the reference models' kernels, one place: grid-stride
// grids, exact covers, the blocks a device holds at once, 16-byte alignment
// and a launch's error as a tessera error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "tessera/backend/cuda/error.hpp"

namespace trainer_kit::kernels {

//! Blocks of 256 threads for a grid-stride loop over `total` elements (at
//! most 32768: enough to fill any device, every thread then loops).
inline unsigned grid(std::size_t total) { return unsigned(std::min<std::size_t>((total + 255) / 256, 32768)); }

//! Blocks of `per_block` items each that cover n items exactly (for a kernel
//! whose block b takes items [b per_block, (b + 1) per_block), no stride
//! loop); at least 1, at most 2^30.
inline unsigned blocks_for(std::size_t n, unsigned per_block) {
  const std::size_t b = (n + per_block - 1) / per_block;
  return unsigned(std::clamp<std::size_t>(b, 1, std::size_t(1) << 30));
}

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

//! Whether p allows 16-byte vector accesses (load_vec / store_vec, uint4).
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

//! A launch's error (a bad configuration) as a tessera error.
inline void check_launch() { TESSERA_CUDA(cudaGetLastError()); }

}  // namespace trainer_kit::kernels
