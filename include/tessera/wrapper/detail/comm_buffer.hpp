#pragma once
//! \file comm_buffer: n elements in memory shared with the other ranks where
//! the communicator offers it, else a plain backend buffer.
#include <cstddef>
#include <span>
#include <utility>

#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"

namespace tessera::detail {

//! n elements of T in device memory shared with the other ranks where the
//! communicator offers it (comm::handle::alloc_symmetric: collectives between
//! such buffers may take a faster path), else a plain backend buffer.
template <class T, class B>
class comm_buffer {
public:
  comm_buffer() = default;
  comm_buffer(comm::handle<B> c, std::size_t n, bool shared) : n_(n) {
    if (shared && n > 0)
      if (void* p = c.alloc_symmetric(n * sizeof(T))) {
        comm_ = std::move(c);
        ptr_ = static_cast<T*>(p);
        return;
      }
    own_ = typename backend_ops<B>::template buffer<T>(n);
    ptr_ = own_.data();
  }
  comm_buffer(comm_buffer&& o) noexcept
      : own_(std::move(o.own_)), comm_(std::move(o.comm_)), ptr_(std::exchange(o.ptr_, nullptr)),
        n_(std::exchange(o.n_, 0)) {}
  comm_buffer& operator=(comm_buffer&& o) noexcept {
    if (this != &o) {
      release();
      own_ = std::move(o.own_);
      comm_ = std::move(o.comm_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~comm_buffer() { release(); }
  [[nodiscard]] T* data() noexcept { return ptr_; }
  [[nodiscard]] std::span<T> span() noexcept { return {ptr_, n_}; }
  [[nodiscard]] std::span<const T> span() const noexcept { return {ptr_, n_}; }

private:
  void release() noexcept {
    if (comm_ && ptr_) comm_.free_symmetric(ptr_);
    comm_ = {};
    ptr_ = nullptr;
  }
  typename backend_ops<B>::template buffer<T> own_;
  comm::handle<B> comm_;  // set when the memory came from the communicator
  T* ptr_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace tessera::detail
