#pragma once
//! \file comm::local: a world of one rank. Collectives are copies (or nothing
//! when in place), so single-process programs need neither MPI nor NCCL.
#include <cstddef>

#include "tessera/backend/ops.hpp"
#include "tessera/comm/communicator.hpp"

namespace tessera::comm {

template <class B = backend::host>
class local {
public:
  using backend_type = B;

  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }

  void all_gather(const void* s, void* r, std::size_t n, dtype t) { move(s, r, n, t); }
  void reduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op o) {
    check_reducible(t, o, "comm::local");
    move(s, r, n, t);
  }
  void all_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op o) {
    check_reducible(t, o, "comm::local");
    move(s, r, n, t);
  }
  void broadcast(void*, std::size_t, dtype, int root) {
    TESSERA_CHECK(root == 0, "broadcast from root ", root, " in a world of 1 rank");
  }
  void barrier() noexcept {}
  request iall_gather(const void* s, void* r, std::size_t n, dtype t) { return all_gather(s, r, n, t), request{}; }
  request ireduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op o) {
    return reduce_scatter(s, r, n, t, o), request{};
  }
  request iall_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op o) {
    return all_reduce(s, r, n, t, o), request{};
  }
  [[nodiscard]] local split(int, int) const { return {}; }

private:
  static void move(const void* s, void* r, std::size_t n, dtype t) {
    if (s == r || n == 0) return;
    using byte = unsigned char;
    backend_ops<B>::copy(std::span<byte>(static_cast<byte*>(r), n * size_of(t)),
                         std::span<const byte>(static_cast<const byte*>(s), n * size_of(t)));
  }
};

}  // namespace tessera::comm
