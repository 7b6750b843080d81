#pragma once
// The CUDA side of tessera-gpt's main: one GPU per rank, a non-blocking
// compute stream, and the communicator: NCCL when every rank has its own GPU,
// else MPI staged through host memory (NCCL refuses two ranks on one GPU).
#include <cstdio>

#include "gpt/cuda_compute.cuh"
#include "trainer.hpp"
#include "trainer_kit/gpu_placement.hpp"

namespace gpt {

//! R: the gradients' reduction (exact_reduction under --deterministic: exact_cuda.cu).
template <class R = tessera::float_reduction>
int run_cuda(const options& o, tessera::comm::mpi& world, const datasets& sets) {
  using namespace tessera;
  const trainer_kit::gpu_placement where = trainer_kit::place_on_gpu(world.rank());
  const std::string which = where.communicator("auto");
  tessera::cuda::stream compute;
  const tessera::cuda::scoped_stream on_compute(compute.get());  // restored before compute goes
  if (world.rank() == 0 && !o.json)
    std::printf("tessera-gpt: %d rank%s on %d GPU%s, communicator %s\n", world.size(), world.size() == 1 ? "" : "s",
                std::min(where.gpus, where.local_size), where.gpus == 1 ? "" : "s",
                which == "nccl" ? "NCCL" : "MPI staged through pinned host memory");
  if (which == "nccl") {
    comm::nccl c(world, comm::nccl_options{.timeout_s = o.timeout, .order_check = o.order_check == "on"});
    return dispatch<backend::cuda, cuda_gpt, R>(o, world, c, sets);
  }
  comm::mpi_device c(comm::mpi_options{.timeout_s = o.timeout, .order_check = o.order_check != "off"});
  return dispatch<backend::cuda, cuda_gpt, R>(o, world, c, sets);
}

}  // namespace gpt
