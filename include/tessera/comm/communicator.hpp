#pragma once
//! \file The communicator concept, requests, the type-erased handle the
//! wrappers store, and typed helpers over spans.
//!
//! Semantics shared by every communicator (counts are elements):
//! - all_gather(send, recv, n, t): recv[r*n, (r+1)*n) = send of rank r. In place
//!   when send == recv + rank*n*size_of(t).
//! - reduce_scatter(send, recv, n, t, op): recv = op over ranks of send[rank*n, (rank+1)*n).
//!   send and recv must not overlap.
//! - all_reduce(send, recv, n, t, op): in place when send == recv.
//! - broadcast(buf, n, t, root), barrier().
//! - i-forms return a request; buffers stay untouched by the caller until wait().
//! A failed collective throws tessera::error naming the operation, rank and size.
#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/policy/backend.hpp"

namespace tessera::comm {

enum class reduce_op { sum, avg, max, min };

[[nodiscard]] constexpr std::string_view name_of(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::avg: return "avg";
    case reduce_op::max: return "max";
    case reduce_op::min: return "min";
  }
  return "?";
}

//! Refuses a reduction of fp8 elements: fp8 is gathered, never summed (its
//! rounding would compound over ranks, and MPI has no fp8 arithmetic). Every
//! communicator calls it, so one rank and many refuse alike.
inline void check_reducible(dtype t, reduce_op op, const char* comm) {
  TESSERA_CHECK(!is_fp8(t), comm, ": a ", name_of(op), " reduction of ", tessera::name_of(t),
                " elements; fp8 is gathered, not reduced (reduce in bf16 or fp32)");
}

//! An operation in flight. wait() completes it (and rethrows its failure);
//! a request destroyed while pending waits first, and terminates on failure
//! because a destructor cannot report it.
class request {
public:
  request() = default;
  explicit request(std::function<void()> wait) : wait_(std::move(wait)) {}
  request(request&& o) noexcept : wait_(std::exchange(o.wait_, nullptr)) {}
  request& operator=(request&& o) noexcept {
    if (this != &o) {
      finish_or_terminate();
      wait_ = std::exchange(o.wait_, nullptr);
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() { finish_or_terminate(); }

  [[nodiscard]] bool pending() const noexcept { return bool(wait_); }
  void wait() {
    if (auto w = std::exchange(wait_, nullptr)) w();
  }

private:
  void finish_or_terminate() noexcept {
    try {
      wait();
    } catch (...) {
      std::terminate();
    }
  }
  std::function<void()> wait_;
};

//! A tessera communicator: ranks, blocking and non-blocking collectives over
//! untyped buffers of the backend it names.
template <class C>
concept communicator = backend_policy<typename C::backend_type> &&
    requires(C& c, const C& cc, const void* s, void* r, std::size_t n, dtype t, reduce_op op, int root) {
      { cc.rank() } -> std::convertible_to<int>;
      { cc.size() } -> std::convertible_to<int>;
      c.all_gather(s, r, n, t);
      c.reduce_scatter(s, r, n, t, op);
      c.all_reduce(s, r, n, t, op);
      c.broadcast(r, n, t, root);
      c.barrier();
      { c.iall_gather(s, r, n, t) } -> std::same_as<request>;
      { c.ireduce_scatter(s, r, n, t, op) } -> std::same_as<request>;
      { c.iall_reduce(s, r, n, t, op) } -> std::same_as<request>;
    };

//! Compile-time check that Comm is a communicator of backend B.
template <class Comm, class B>
consteval void check_communicator() {
  static_assert(communicator<Comm>,
                "tessera: the argument is not a tessera communicator; pass comm::local, comm::mpi or comm::nccl");
  if constexpr (communicator<Comm>)
    static_assert(std::is_same_v<typename Comm::backend_type, B>,
                  "tessera: the communicator belongs to another backend than the config; use comm::mpi or "
                  "comm::local<backend::host> with backend::host, comm::nccl or comm::mpi_device with backend::cuda");
}

//! A non-owning, type-erased reference to a communicator of backend B: what
//! wrappers and sharded tensors store. The communicator must outlive it.
template <class B>
class handle {
  struct iface {
    virtual ~iface() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual void all_gather(const void*, void*, std::size_t, dtype) = 0;
    virtual void reduce_scatter(const void*, void*, std::size_t, dtype, reduce_op) = 0;
    virtual void all_reduce(const void*, void*, std::size_t, dtype, reduce_op) = 0;
    virtual void broadcast(void*, std::size_t, dtype, int) = 0;
    virtual void barrier() = 0;
    virtual request iall_gather(const void*, void*, std::size_t, dtype) = 0;
    virtual request ireduce_scatter(const void*, void*, std::size_t, dtype, reduce_op) = 0;
    virtual request iall_reduce(const void*, void*, std::size_t, dtype, reduce_op) = 0;
    virtual void* alloc_symmetric(std::size_t) = 0;
    virtual void free_symmetric(void*) noexcept = 0;
  };
  template <class C>
  struct model final : iface {
    explicit model(C& c) : c_(c) {}
    int rank() const override { return c_.rank(); }
    int size() const override { return c_.size(); }
    void all_gather(const void* s, void* r, std::size_t n, dtype t) override { c_.all_gather(s, r, n, t); }
    void reduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op o) override {
      c_.reduce_scatter(s, r, n, t, o);
    }
    void all_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op o) override {
      c_.all_reduce(s, r, n, t, o);
    }
    void broadcast(void* b, std::size_t n, dtype t, int root) override { c_.broadcast(b, n, t, root); }
    void barrier() override { c_.barrier(); }
    request iall_gather(const void* s, void* r, std::size_t n, dtype t) override {
      return c_.iall_gather(s, r, n, t);
    }
    request ireduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op o) override {
      return c_.ireduce_scatter(s, r, n, t, o);
    }
    request iall_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op o) override {
      return c_.iall_reduce(s, r, n, t, o);
    }
    void* alloc_symmetric(std::size_t bytes) override {
      if constexpr (requires { c_.alloc_symmetric(bytes); }) return c_.alloc_symmetric(bytes);
      else return nullptr;
    }
    void free_symmetric(void* p) noexcept override {
      if constexpr (requires { c_.free_symmetric(p); }) c_.free_symmetric(p);
    }
    C& c_;
  };

public:
  using backend_type = B;
  handle() = default;
  template <class C>
    requires(!std::is_same_v<std::remove_cvref_t<C>, handle>)
  explicit handle(C& c) : impl_(std::make_shared<model<C>>(c)) {
    check_communicator<C, B>();
  }

  [[nodiscard]] explicit operator bool() const noexcept { return bool(impl_); }
  [[nodiscard]] int rank() const { return impl_->rank(); }
  [[nodiscard]] int size() const { return impl_->size(); }
  void all_gather(const void* s, void* r, std::size_t n, dtype t) { impl_->all_gather(s, r, n, t); }
  void reduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op o) {
    impl_->reduce_scatter(s, r, n, t, o);
  }
  void all_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op o) { impl_->all_reduce(s, r, n, t, o); }
  void broadcast(void* b, std::size_t n, dtype t, int root) { impl_->broadcast(b, n, t, root); }
  void barrier() { impl_->barrier(); }
  [[nodiscard]] request iall_gather(const void* s, void* r, std::size_t n, dtype t) {
    return impl_->iall_gather(s, r, n, t);
  }
  [[nodiscard]] request ireduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op o) {
    return impl_->ireduce_scatter(s, r, n, t, o);
  }
  [[nodiscard]] request iall_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op o) {
    return impl_->iall_reduce(s, r, n, t, o);
  }
  //! Device memory shared with the other ranks (collective: every rank asks
  //! for the same sizes in the same order), in which collectives may take a
  //! faster path (comm::nccl: a symmetric window, all-gathers on copy
  //! engines); null where the communicator has none or was not asked to.
  [[nodiscard]] void* alloc_symmetric(std::size_t bytes) { return impl_->alloc_symmetric(bytes); }
  //! Returns memory from alloc_symmetric (collective, like the allocation).
  void free_symmetric(void* p) noexcept { impl_->free_symmetric(p); }

private:
  std::shared_ptr<iface> impl_;
};

// ---- typed helpers: sizes checked, dtype deduced ------------------------------

//! recv (size * send.size() elements) receives every rank's send.
template <class C, element_type T>
void all_gather(C& c, std::span<const T> send, std::span<T> recv) {
  TESSERA_CHECK(recv.size() == send.size() * std::size_t(c.size()), "all_gather: receive buffer holds ",
                recv.size(), " elements, expected ", send.size(), " x ", c.size(), " ranks");
  c.all_gather(send.data(), recv.data(), send.size(), dtype_of_v<T>);
}
//! recv (send.size() / size elements) receives this rank's reduced block.
template <class C, element_type T>
void reduce_scatter(C& c, std::span<const T> send, std::span<T> recv, reduce_op op = reduce_op::sum) {
  TESSERA_CHECK(send.size() == recv.size() * std::size_t(c.size()), "reduce_scatter: send buffer holds ",
                send.size(), " elements, expected ", recv.size(), " x ", c.size(), " ranks");
  c.reduce_scatter(send.data(), recv.data(), recv.size(), dtype_of_v<T>, op);
}
//! In-place all-reduce of x.
template <class C, element_type T>
void all_reduce(C& c, std::span<T> x, reduce_op op = reduce_op::sum) {
  c.all_reduce(x.data(), x.data(), x.size(), dtype_of_v<T>, op);
}
template <class C, element_type T>
void broadcast(C& c, std::span<T> x, int root) {
  c.broadcast(x.data(), x.size(), dtype_of_v<T>, root);
}

}  // namespace tessera::comm
