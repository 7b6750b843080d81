// tessera-llama --deterministic --backend cuda: the CUDA backend's
// exact_reduction instantiations, in a translation unit of their own
// (compiled in parallel with main.cu's float ones).
#include "cuda_main.cuh"

int llama::run_exact_cuda(const options& o, tessera::comm::mpi& world, const datasets& sets) {
  return run_cuda<tessera::exact_reduction>(o, world, sets);
}
