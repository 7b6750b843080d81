#pragma once
//! \file comm::mpi_device: MPI over device memory, staged through pinned host
//! buffers. This is how several ranks share one GPU (NCCL refuses two ranks on
//! one device) and how the CUDA paths are tested at world sizes above 1 on a
//! one-GPU machine. Every operation completes before it returns (the i-forms
//! return a finished request): correct, not overlapped.
#include <cuda_runtime_api.h>

#include "tessera/backend/cuda/buffer.hpp"
#include "tessera/backend/cuda/stream.hpp"
#include "tessera/comm/mpi.hpp"

namespace tessera::comm {

class mpi_device {
public:
  using backend_type = backend::cuda;

  explicit mpi_device(MPI_Comm parent = MPI_COMM_WORLD, mpi_options o = {}) : host_(parent, o) {}
  explicit mpi_device(mpi_options o) : host_(o) {}
  explicit mpi_device(mpi&& host) : host_(std::move(host)) {}

  [[nodiscard]] int rank() const noexcept { return host_.rank(); }
  [[nodiscard]] int size() const noexcept { return host_.size(); }
  [[nodiscard]] mpi_device split(int color, int key) const { return mpi_device(host_.split(color, key)); }

  void all_gather(const void* s, void* r, std::size_t n, dtype t) {
    const std::size_t b = n * size_of(t), N = std::size_t(size());
    in_.reserve(b * N);
    unsigned char* mine = in_.data() + std::size_t(rank()) * b;
    down(mine, s, b);
    host_.all_gather(mine, in_.data(), n, t);
    up(r, in_.data(), b * N);
  }
  void reduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    const std::size_t b = n * size_of(t), N = std::size_t(size());
    in_.reserve(b * N);
    out_.reserve(b);
    down(in_.data(), s, b * N);
    host_.reduce_scatter(in_.data(), out_.data(), n, t, op);
    up(r, out_.data(), b);
  }
  void all_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    const std::size_t b = n * size_of(t);
    in_.reserve(b);
    down(in_.data(), s, b);
    host_.all_reduce(in_.data(), in_.data(), n, t, op);
    up(r, in_.data(), b);
  }
  void broadcast(void* buf, std::size_t n, dtype t, int root) {
    const std::size_t b = n * size_of(t);
    in_.reserve(b);
    down(in_.data(), buf, b);
    host_.broadcast(in_.data(), n, t, root);
    up(buf, in_.data(), b);
  }
  void barrier() {
    TESSERA_CUDA(cudaStreamSynchronize(cuda::current_stream()));
    host_.barrier();
  }
  request iall_gather(const void* s, void* r, std::size_t n, dtype t) { return all_gather(s, r, n, t), request{}; }
  request ireduce_scatter(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    return reduce_scatter(s, r, n, t, op), request{};
  }
  request iall_reduce(const void* s, void* r, std::size_t n, dtype t, reduce_op op) {
    return all_reduce(s, r, n, t, op), request{};
  }

private:
  // Device to pinned host, after the compute stream's work so far.
  void down(void* h, const void* d, std::size_t bytes) {
    if (!bytes) return;
    TESSERA_CUDA(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, cuda::current_stream()));
    TESSERA_CUDA(cudaStreamSynchronize(cuda::current_stream()));
  }
  // Pinned host to device, ordered before later work on the compute stream.
  // The staging buffer is next written only after a later down(), whose
  // synchronisation comes after this copy on the same stream.
  void up(void* d, const void* h, std::size_t bytes) {
    if (!bytes) return;
    TESSERA_CUDA(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, cuda::current_stream()));
  }

  mpi host_;
  cuda::pinned_buffer<unsigned char> in_, out_;
};

}  // namespace tessera::comm
