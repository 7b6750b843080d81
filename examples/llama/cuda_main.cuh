#pragma once
// The CUDA side of tessera-llama's main: this rank's GPU and communicator
// (trainer_kit/cuda_run.cuh), then the loop with Llama's CUDA net.
#include "llama/cuda_compute.cuh"
#include "trainer.hpp"
#include "trainer_kit/cuda_run.cuh"

namespace llama {

//! R: the gradients' reduction (exact_reduction under --deterministic: exact_cuda.cu).
template <class R = tessera::float_reduction>
int run_cuda(const options& o, tessera::comm::mpi& world, const datasets& sets) {
  const trainer_kit::gpu_placement where = trainer_kit::place_on_gpu(world.rank());
  return trainer_kit::on_gpus(o, world, lm<cuda_llama>::program, where, {}, [&](auto& comm, const auto& usage) {
    lm<cuda_llama> model(o, sets);
    return trainer_kit::run_configured<tessera::backend::cuda, R>(o, world, comm, model, usage);
  });
}

}  // namespace llama
