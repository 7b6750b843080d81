// tessera-mlp-lm --deterministic: the exact_reduction instantiations of the
// trainer, in a translation unit of their own (see run.hpp).
#include "run.hpp"

int mlp_lm::run_exact(const options& o, tessera::comm::mpi& world) {
  return run_backend<tessera::exact_reduction>(o, world);
}
