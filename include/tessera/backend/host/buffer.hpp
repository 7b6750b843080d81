#pragma once
//! \file Owning, 64-byte aligned host buffer counted in memory_of<backend::host>().
#include <cstddef>
#include <new>
#include <span>
#include <utility>

#include "tessera/backend/memory.hpp"
#include "tessera/core/error.hpp"
#include "tessera/policy/backend.hpp"

namespace tessera::host {

//! n elements of T on the host; uninitialised (trivial T) until written.
//! placement::host is the same memory, counted in memory_of<host_resident>()
//! instead: the bytes an offload would move off a device, so the host suites
//! check the offload's accounting.
template <class T>
class buffer {
  static constexpr std::size_t alignment = 64;

public:
  buffer() = default;
  explicit buffer(std::size_t n, placement where = placement::device) : size_(n), where_(where) {
    if (n == 0) return;
    data_ = static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{alignment}, std::nothrow));
    TESSERA_CHECK(data_ != nullptr, "out of host memory allocating ", n * sizeof(T), " bytes");
    counter().add(n * sizeof(T));
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
      ::operator delete(data_, std::align_val_t{alignment});
      counter().sub(size_ * sizeof(T));
    }
    data_ = nullptr;
    size_ = 0;
  }
  memory_counter& counter() const noexcept {
    return where_ == placement::host ? memory_of<host_resident>() : memory_of<backend::host>();
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
  placement where_ = placement::device;
};

}  // namespace tessera::host
