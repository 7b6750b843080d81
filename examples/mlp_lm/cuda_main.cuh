#pragma once
// The CUDA side of tessera-mlp-lm's main: this rank's GPU and communicator
// (trainer_kit/cuda_run.cuh: --comm, NCCL's CTA cap, copy-engine gathers),
// the SMs each GEMM is shaped for, then the loop with the MLP's CUDA net.
#include "mlp_lm/cuda_compute.cuh"
#include "trainer.hpp"
#include "trainer_kit/cuda_run.cuh"

namespace mlp_lm {

//! R: the reduction policy (exact_reduction under --deterministic).
template <class R>
int run_cuda(const options& o_in, tessera::comm::mpi& world) {
  const trainer_kit::gpu_placement where = trainer_kit::place_on_gpu(world.rank());
  const std::string which = where.communicator(o_in.comm);
  options o = o_in;
  // --deterministic: every GEMM shaped for the whole GPU unless asked (a
  // shape for fewer SMs beside NCCL is another kernel, other bits).
  if (o.deterministic && o.gemm_sms < 0) o.gemm_sms = 0;
  o.gemm_sms = where.gemm_sms(o.gemm_sms, which == "nccl" ? o.nccl_ctas : 0, world.size());
  const trainer_kit::gpu_comm_options g{.comm = which, .nccl_ctas = o.nccl_ctas, .copy_engine_gathers = o.copy_engine_gathers};
  return trainer_kit::on_gpus(o, world, lm<cuda_mlp>::program, where, g, [&](auto& comm, const auto& usage) {
    lm<cuda_mlp> model(o);
    return trainer_kit::run_configured<tessera::backend::cuda, R>(o, world, comm, model, usage);
  });
}

}  // namespace mlp_lm
