// tessera-llama --deterministic: the exact_reduction instantiations of the
// trainer (host backend), in a translation unit of their own, compiled in
// parallel with main's and by the C++ compiler in CUDA builds too.
#include "trainer.hpp"

int llama::run_exact_host(const options& o, tessera::comm::mpi& world, const datasets& sets) {
  return run_host<tessera::exact_reduction>(o, world, sets);
}
