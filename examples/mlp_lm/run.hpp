#pragma once
// One backend's training run with reduction policy R: what main() calls
// once MPI is up. Float and exact (--deterministic) instantiations live in
// two translation units (main.cpp, exact.cpp), which compile in parallel.
#include "tessera/core/config.hpp"
#include "mlp_lm/host_compute.hpp"
#include "options.hpp"
#include "trainer.hpp"
#if TESSERA_CUDA_COMPILER
#include "cuda_main.cuh"
#endif

namespace mlp_lm {

template <class R>
int run_backend(const options& o, tessera::comm::mpi& world) {
  if (o.backend == "cuda") {
#if TESSERA_CUDA_COMPILER
    return run_cuda<R>(o, world);
#else
    throw tessera::error("this build of tessera-mlp-lm has no CUDA backend (configure with CUDA)");
#endif
  }
  lm<host_mlp> model(o);
  return trainer_kit::run_configured<tessera::backend::host, R>(o, world, world, model, trainer_kit::host_usage{});
}

}  // namespace mlp_lm
