#pragma once
// A net's buffers as one list (llm.c's fill_in_activation_sizes): one
// function names each buffer and its size, the net's constructor allocates
// the list as one block and takes each buffer's span from it, and the memory
// planner sums the same list. Nothing keeps two lists equal by hand: a buffer
// the planner does not count is a buffer the net does not have.
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/core/error.hpp"

namespace trainer_kit {

//! Where one buffer of T lies in a buffer_list's block.
template <class T>
struct buffer_slot {
  std::size_t offset = 0, count = 0;
};

class buffer_list {
public:
  //! Every buffer starts 256 bytes past a multiple of 256, as a buffer of its
  //! own would (cudaMalloc's alignment): vector loads and cuBLASLt's fastest
  //! kernels see the same alignment in the block.
  static constexpr std::size_t alignment = 256;

  //! Adds a buffer of `count` elements of T (none: an empty span, nothing held).
  template <class T>
  buffer_slot<T> add(std::string_view name, std::size_t count) {
    const std::size_t at = count ? (end_ + alignment - 1) / alignment * alignment : end_;
    entries_.push_back({std::string(name), at, count * sizeof(T)});
    if (count) end_ = at + count * sizeof(T);
    return {at, count};
  }
  //! Bytes held apart from the block but counted with it: scratch a library
  //! call allocates for a moment (the products' kernel tuning).
  void reserve(std::string_view name, std::size_t bytes) {
    entries_.push_back({std::string(name), npos, bytes});
    reserved_ += bytes;
  }
  //! The block's bytes: every buffer, each aligned.
  [[nodiscard]] std::size_t block_bytes() const noexcept { return end_; }
  //! What the net holds at its peak: the block and what is reserved beside it.
  [[nodiscard]] std::size_t bytes() const noexcept { return end_ + reserved_; }
  //! "name MiB" per buffer, largest first is the reader's to sort (tessera-plan's breakdown).
  struct entry {
    std::string name;
    std::size_t offset, bytes;
  };
  [[nodiscard]] const std::vector<entry>& entries() const noexcept { return entries_; }

private:
  static constexpr std::size_t npos = ~std::size_t(0);
  std::vector<entry> entries_;
  std::size_t end_ = 0, reserved_ = 0;
};

//! One allocation of a buffer_list's block in Buffer (tessera::cuda::buffer,
//! tessera::host::buffer: the library's memory counts it), and each buffer's span.
template <template <class> class Buffer>
class buffer_block {
public:
  buffer_block() = default;
  explicit buffer_block(const buffer_list& l) : block_(l.block_bytes()) {}
  template <class T>
  [[nodiscard]] std::span<T> operator[](buffer_slot<T> s) {
    TESSERA_CHECK(s.offset + s.count * sizeof(T) <= block_.size(), "buffer_block: a slot past the block");
    return s.count ? std::span<T>(reinterpret_cast<T*>(block_.data() + s.offset), s.count) : std::span<T>();
  }

private:
  Buffer<std::byte> block_;
};

}  // namespace trainer_kit
