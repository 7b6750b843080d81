#pragma once
//! \file Reductions of 16-bit floats (bf16, fp16) over MPI, which has no such
//! types: they travel as 16-bit words and user ops add (or compare) in float
//! and round once per step of the reduction. Used by comm::mpi.
#include <mpi.h>

#include "tessera/comm/communicator.hpp"

namespace tessera::comm {

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

}  // namespace tessera::comm
