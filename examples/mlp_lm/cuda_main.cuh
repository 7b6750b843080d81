#pragma once
// The CUDA side of tessera-mlp-lm's main: one GPU per rank (local rank modulo
// the GPUs present), a non-blocking compute stream, and the communicator:
// NCCL when every rank has its own GPU, else MPI staged through host memory
// (NCCL refuses two ranks on one GPU).
#include <mpi.h>

#include <cstdio>

#include "mlp_lm/cuda_compute.cuh"
#include "mlp_lm/gpu_placement.hpp"
#include "trainer.hpp"

namespace mlp_lm {

struct cuda_usage final : device_usage {
  std::size_t baseline = 0;
  static std::size_t in_use() {
    std::size_t free_b = 0, total_b = 0;
    TESSERA_CUDA(cudaMemGetInfo(&free_b, &total_b));
    return total_b - free_b;
  }
  [[nodiscard]] std::size_t used() const override { return in_use() - baseline; }
};

//! R: the reduction policy (exact_reduction under --deterministic).
template <class R>
int run_cuda(const options& o_in, tessera::comm::mpi& world) {
  using namespace tessera;
  const gpu_placement where = place_on_gpu(world.rank());
  const std::string which = where.communicator(o_in.comm);
  options o = o_in;
  // --deterministic: every GEMM shaped for the whole GPU unless asked (a
  // shape for fewer SMs beside NCCL is another kernel, other bits).
  if (o.deterministic && o.gemm_sms < 0) o.gemm_sms = 0;
  o.gemm_sms = where.gemm_sms(o.gemm_sms, which == "nccl" ? o.nccl_ctas : 0, world.size());
  tessera::cuda::stream compute;
  const tessera::cuda::scoped_stream on_compute(compute.get());  // restored before compute goes
  if (world.rank() == 0 && !o.json)
    std::printf("tessera-mlp-lm: %d rank%s on %d GPU%s, communicator %s\n", world.size(), world.size() == 1 ? "" : "s",
                std::min(where.gpus, where.local_size), where.gpus == 1 ? "" : "s",
                which == "nccl" ? "NCCL" : "MPI staged through pinned host memory");
  cuda_usage usage;
  if (which == "nccl") {
    comm::nccl c(world, comm::nccl_options{.timeout_s = o.timeout,
                                           .order_check = o.order_check == "on",
                                           .max_ctas = o.nccl_ctas,
                                           .copy_engine_gathers = o.copy_engine_gathers});
    usage.baseline = cuda_usage::in_use();
    return dispatch<backend::cuda, cuda_mlp, R>(o, world, c, usage, tessera::cuda::matmul_workspace_bytes());
  }
  comm::mpi_device c(comm::mpi_options{.timeout_s = o.timeout, .order_check = o.order_check != "off"});
  usage.baseline = cuda_usage::in_use();
  return dispatch<backend::cuda, cuda_mlp, R>(o, world, c, usage, tessera::cuda::matmul_workspace_bytes());
}

}  // namespace mlp_lm
