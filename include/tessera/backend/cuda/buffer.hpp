#pragma once
//! \file Device buffers (counted in memory_of<backend::cuda>()) and pinned
//! host buffers for staging.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <utility>

#include "tessera/backend/cuda/error.hpp"
#include "tessera/backend/memory.hpp"
#include "tessera/policy/backend.hpp"

namespace tessera::cuda {

//! n elements of T in device memory (cudaMalloc: 256-byte aligned), or with
//! placement::host in pinned host memory that kernels reach across PCIe
//! (UVA: the same pointer on both sides; counted in memory_of<host_resident>()),
//! uninitialised.
template <class T>
class buffer {
public:
  buffer() = default;
  explicit buffer(std::size_t n, placement where = placement::device) : size_(n), where_(where) {
    if (n == 0) return;
    if (where == placement::host) {
      const cudaError_t rc = cudaMallocHost(reinterpret_cast<void**>(&data_), n * sizeof(T));
      if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        data_ = nullptr;
        tessera::detail::fail(tessera::detail::concat("out of pinned host memory allocating ", n * sizeof(T),
                                                      " bytes for offloaded state: ", cudaGetErrorString(rc)));
      }
      memory_of<host_resident>().add(n * sizeof(T));
      return;
    }
    const cudaError_t rc = cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T));
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      std::size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      tessera::detail::fail(tessera::detail::concat("out of device memory allocating ", n * sizeof(T), " bytes (",
                                                    free_b, " of ", total_b, " free): ", cudaGetErrorString(rc)));
    }
    memory_of<backend::cuda>().add(n * sizeof(T));
  }
  buffer(buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), where_(o.where_) {}
  buffer& operator=(buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      where_ = o.where_;
    }
    return *this;
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  ~buffer() { release(); }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] placement where() const noexcept { return where_; }
  [[nodiscard]] std::span<T> span() noexcept { return {data_, size_}; }
  [[nodiscard]] std::span<const T> span() const noexcept { return {data_, size_}; }

private:
  void release() noexcept {
    if (data_) {
      // Both implicitly synchronise: no kernel still reads the memory.
      if (where_ == placement::host) {
        cudaFreeHost(data_);
        memory_of<host_resident>().sub(size_ * sizeof(T));
      } else {
        cudaFree(data_);
        memory_of<backend::cuda>().sub(size_ * sizeof(T));
      }
    }
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
  placement where_ = placement::device;
};

//! n elements of T in page-locked host memory, for asynchronous staging.
template <class T>
class pinned_buffer {
public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t n) : size_(n) {
    if (n) TESSERA_CUDA(cudaMallocHost(reinterpret_cast<void**>(&data_), n * sizeof(T)));
  }
  pinned_buffer(pinned_buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() {
    if (data_) cudaFreeHost(data_);
  }
  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! Grows (never shrinks) to at least n elements; contents are not kept.
  void reserve(std::size_t n) {
    if (n > size_) *this = pinned_buffer(n);
  }

private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace tessera::cuda
