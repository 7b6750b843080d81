#pragma once
//! \file comm::mpi: a communicator over MPI for host memory, and mpi_session,
//! the RAII owner of MPI_Init / MPI_Finalize.
//!
//! Every communicator it creates is a duplicate with MPI_ERRORS_RETURN, so a
//! failed call becomes a tessera::error instead of MPI's default abort. MPI has
//! no bf16 / fp16 types: they travel as 16-bit words and are reduced by user
//! ops that add in float and round once per step of the reduction.
// The deprecated C++ bindings add nothing here and warn under -Wextra.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <string>

#include "tessera/comm/communicator.hpp"

namespace tessera::detail {
[[noreturn]] inline void throw_mpi_error(int rc, const char* call, ::tessera::source_location where) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  int cls = rc;
  MPI_Error_class(rc, &cls);
  throw error("MPI call failed: " + std::string(text, std::size_t(len)), call, cls, where);
}
}  // namespace tessera::detail

namespace tessera::comm {

//! Initialises MPI (thread level MPI_THREAD_FUNNELED) unless already done, and
//! finalises it on destruction if it initialised it.
class mpi_session {
public:
  mpi_session(int* argc, char*** argv) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      TESSERA_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
      owner_ = true;
    }
  }
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;
  ~mpi_session() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owner_ && !finalized) MPI_Finalize();
  }

private:
  bool owner_ = false;
};

namespace detail {
template <class T, class F>
void mpi_half_op(void* in, void* inout, int* len, F f) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = T(f(float(a[i]), float(b[i])));
}
template <class T> void half_sum(void* a, void* b, int* n, MPI_Datatype*) {
  mpi_half_op<T>(a, b, n, [](float x, float y) { return x + y; });
}
template <class T> void half_max(void* a, void* b, int* n, MPI_Datatype*) {
  mpi_half_op<T>(a, b, n, [](float x, float y) { return x > y ? x : y; });
}
template <class T> void half_min(void* a, void* b, int* n, MPI_Datatype*) {
  mpi_half_op<T>(a, b, n, [](float x, float y) { return x < y ? x : y; });
}
// MPI_Op objects for 16-bit floats, created on first use (after MPI_Init).
template <class T> MPI_Op half_op(reduce_op op) {
  static const MPI_Op ops[3] = {
      [] { MPI_Op o; MPI_Op_create(&half_sum<T>, 1, &o); return o; }(),
      [] { MPI_Op o; MPI_Op_create(&half_max<T>, 1, &o); return o; }(),
      [] { MPI_Op o; MPI_Op_create(&half_min<T>, 1, &o); return o; }(),
  };
  return op == reduce_op::max ? ops[1] : op == reduce_op::min ? ops[2] : ops[0];
}
}  // namespace detail

//! Host-memory communicator over an MPI communicator it duplicates and owns.
//! Requests it returns refer to it: keep it in place (do not move it) while
//! any of them is pending.
class mpi {
public:
  using backend_type = backend::host;

  //! Duplicates parent (MPI_COMM_WORLD by default). Collective over parent.
  explicit mpi(MPI_Comm parent = MPI_COMM_WORLD) {
    TESSERA_MPI(MPI_Comm_dup(parent, &comm_));
    init();
  }
  mpi(mpi&& o) noexcept : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_) {}
  mpi& operator=(mpi&& o) noexcept {
    if (this != &o) {
      free();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      rank_ = o.rank_;
      size_ = o.size_;
    }
    return *this;
  }
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  ~mpi() { free(); }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] MPI_Comm native() const noexcept { return comm_; }

  //! Ranks with the same color form a new communicator, ordered by key. Collective.
  [[nodiscard]] mpi split(int color, int key) const {
    MPI_Comm c = MPI_COMM_NULL;
    TESSERA_MPI(MPI_Comm_split(comm_, color, key, &c));
    return mpi(c, adopt_tag{});
  }

  void all_gather(const void* s, void* r, std::size_t n, dtype t) {
    const int cnt = count(n, "all_gather");
    const void* src = in_place_gather(s, r, n, t) ? MPI_IN_PLACE : s;
    check(MPI_Allgather(src, cnt, type(t), r, cnt, type(t), comm_), "MPI_Allgather", n, t);
  }
  void reduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    check(MPI_Reduce_scatter_block(s, r, count(n, "reduce_scatter"), type(t), mpi_op(t, op), comm_),
          "MPI_Reduce_scatter_block", n, t);
    if (op == reduce_op::avg) scale(r, n, t);
  }
  void all_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    check(MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, count(n, "all_reduce"), type(t), mpi_op(t, op), comm_),
          "MPI_Allreduce", n, t);
    if (op == reduce_op::avg) scale(r, n, t);
  }
  void broadcast(void* b, std::size_t n, dtype t, int root) {
    check(MPI_Bcast(b, count(n, "broadcast"), type(t), root, comm_), "MPI_Bcast", n, t);
  }
  void barrier() { check(MPI_Barrier(comm_), "MPI_Barrier", 0, dtype::u8); }

  request iall_gather(const void* s, void* r, std::size_t n, dtype t) {
    const int cnt = count(n, "iall_gather");
    MPI_Request q;
    const void* src = in_place_gather(s, r, n, t) ? MPI_IN_PLACE : s;
    check(MPI_Iallgather(src, cnt, type(t), r, cnt, type(t), comm_, &q), "MPI_Iallgather", n, t);
    return finish(q, "MPI_Iallgather", nullptr, 0, t);
  }
  request ireduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    MPI_Request q;
    check(MPI_Ireduce_scatter_block(s, r, count(n, "ireduce_scatter"), type(t), mpi_op(t, op), comm_, &q),
          "MPI_Ireduce_scatter_block", n, t);
    return finish(q, "MPI_Ireduce_scatter_block", op == reduce_op::avg ? r : nullptr, n, t);
  }
  request iall_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    MPI_Request q;
    check(MPI_Iallreduce(s == r ? MPI_IN_PLACE : s, r, count(n, "iall_reduce"), type(t), mpi_op(t, op), comm_, &q),
          "MPI_Iallreduce", n, t);
    return finish(q, "MPI_Iallreduce", op == reduce_op::avg ? r : nullptr, n, t);
  }

private:
  struct adopt_tag {};
  mpi(MPI_Comm c, adopt_tag) : comm_(c) { init(); }

  void init() {
    TESSERA_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    TESSERA_MPI(MPI_Comm_rank(comm_, &rank_));
    TESSERA_MPI(MPI_Comm_size(comm_, &size_));
  }
  void free() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  // Names the operation, rank, world size and payload, so a failure on one of
  // many ranks can be told apart in a merged log.
  void check(int rc, const char* what, std::size_t n, dtype t,
             ::tessera::source_location where = ::tessera::source_location::current()) const {
    if (rc == MPI_SUCCESS) [[likely]] return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    MPI_Error_string(rc, text, &len);
    int cls = rc;
    MPI_Error_class(rc, &cls);
    throw error(tessera::detail::concat(what, " failed on rank ", rank_, " of ", size_, " (", n, " x ",
                                        name_of(t), "): ", std::string(text, std::size_t(len))),
                what, cls, where);
  }
  static int count(std::size_t n, const char* op) {
    TESSERA_CHECK(n <= std::size_t(INT_MAX), "comm::mpi ", op, " of ", n,
                  " elements exceeds MPI's int count; split the buffer");
    return int(n);
  }
  bool in_place_gather(const void* s, const void* r, std::size_t n, dtype t) const noexcept {
    return s == static_cast<const char*>(r) + std::size_t(rank_) * n * size_of(t);
  }
  static MPI_Datatype type(dtype t) {
    switch (t) {
      case dtype::f32: return MPI_FLOAT;
      case dtype::f64: return MPI_DOUBLE;
      case dtype::bf16: case dtype::f16: return MPI_UINT16_T;
      case dtype::i32: return MPI_INT32_T;
      case dtype::i64: return MPI_INT64_T;
      case dtype::u8: return MPI_UINT8_T;
    }
    return MPI_DATATYPE_NULL;
  }
  static MPI_Op mpi_op(dtype t, reduce_op op) {
    if (t == dtype::bf16) return detail::half_op<bf16>(op);
    if (t == dtype::f16) return detail::half_op<fp16>(op);
    switch (op) {
      case reduce_op::max: return MPI_MAX;
      case reduce_op::min: return MPI_MIN;
      default: return MPI_SUM;  // avg = sum, then scale()
    }
  }
  // MPI has no average: divide the sum by the world size.
  void scale(void* r, std::size_t n, dtype t) const {
    const double inv = 1.0 / size_;
    auto each = [&]<class T>(T*) {
      T* p = static_cast<T*>(r);
      for (std::size_t i = 0; i < n; ++i) p[i] = convert<T>(convert<double>(p[i]) * inv);
    };
    switch (t) {
      case dtype::f32: each((float*)nullptr); break;
      case dtype::f64: each((double*)nullptr); break;
      case dtype::bf16: each((bf16*)nullptr); break;
      case dtype::f16: each((fp16*)nullptr); break;
      default: TESSERA_CHECK(false, "average of an integer dtype ", name_of(t));
    }
  }
  request finish(MPI_Request q, const char* what, void* avg_out, std::size_t n, dtype t) {
    return request([this, q, what, avg_out, n, t]() mutable {
      check(MPI_Wait(&q, MPI_STATUS_IGNORE), what, n, t);
      if (avg_out) scale(avg_out, n, t);
    });
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace tessera::comm
