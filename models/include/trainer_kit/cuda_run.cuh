#pragma once
// The CUDA side of a reference trainer's main: a non-blocking compute stream
// and the communicator, NCCL when every rank has its own GPU, else MPI staged
// through host memory (NCCL refuses two ranks on one GPU), and the device's
// own count of the bytes the run adds (what the summary calls
// device_used_bytes: the library's buffers plus what it does not count, such
// as NCCL's and cuBLAS's own).
#include <algorithm>
#include <cstdio>
#include <string>

#include "tessera/backend/cuda/error.hpp"
#include "tessera/backend/cuda/stream.hpp"
#include "tessera/comm/mpi_device.hpp"
#include "tessera/comm/nccl.hpp"
#include "trainer_kit/gpu_placement.hpp"
#include "trainer_kit/run.hpp"
#include "trainer_kit/run_options.hpp"

namespace trainer_kit {

//! Bytes in use on the device beyond `baseline` (cudaMemGetInfo).
struct cuda_usage final : device_usage {
  std::size_t baseline = 0;
  static std::size_t in_use() {
    std::size_t free_b = 0, total_b = 0;
    TESSERA_CUDA(cudaMemGetInfo(&free_b, &total_b));
    return total_b - free_b;
  }
  [[nodiscard]] std::size_t used() const override { return in_use() - baseline; }
};

//! How a trainer's ranks talk on the GPU: --comm auto|nccl|mpi, and NCCL's
//! CTA cap and copy-engine gathers where a trainer offers them.
struct gpu_comm_options {
  std::string comm = "auto";
  int nccl_ctas = 0;
  bool copy_engine_gathers = false;
};

//! f(comm, usage) on this rank's GPU (`where`, trainer_kit::place_on_gpu)
//! over the communicator `g` chooses, on a compute stream of its own; says on
//! rank 0 what it chose. Returns f's result.
template <class F>
int on_gpus(const run_options& o, tessera::comm::mpi& world, const char* program, const gpu_placement& where,
            const gpu_comm_options& g, F&& f) {
  using namespace tessera;
  const std::string which = where.communicator(g.comm);
  tessera::cuda::stream compute;
  const tessera::cuda::scoped_stream on_compute(compute.get());  // restored before compute goes
  if (world.rank() == 0 && !o.json)
    std::printf("%s: %d rank%s on %d GPU%s, communicator %s\n", program, world.size(), world.size() == 1 ? "" : "s",
                std::min(where.gpus, where.local_size), where.gpus == 1 ? "" : "s",
                which == "nccl" ? "NCCL" : "MPI staged through pinned host memory");
  cuda_usage usage;
  if (which == "nccl") {
    comm::nccl c(world, comm::nccl_options{.timeout_s = o.timeout,
                                           .order_check = o.order_check == "on",
                                           .max_ctas = g.nccl_ctas,
                                           .copy_engine_gathers = g.copy_engine_gathers});
    usage.baseline = cuda_usage::in_use();
    return f(c, static_cast<const device_usage&>(usage));
  }
  comm::mpi_device c(comm::mpi_options{.timeout_s = o.timeout, .order_check = o.order_check != "off"});
  usage.baseline = cuda_usage::in_use();
  return f(c, static_cast<const device_usage&>(usage));
}

}  // namespace trainer_kit
