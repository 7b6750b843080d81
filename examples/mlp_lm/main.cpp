// tessera-mlp-lm: the reference trainer. A byte-level MLP language model
// trained with any Tessera strategy and wrapper chosen at run time among the
// compiled instantiations. Run under mpirun for several ranks. Compiled by a
// plain C++ compiler it has the host backend; compiled by nvcc (main.cu) the
// CUDA backend too.
#include <cstdio>

#include "tessera/core/config.hpp"
#include "mlp_lm/host_compute.hpp"
#include "options.hpp"
#include "trainer.hpp"
#if TESSERA_CUDA_COMPILER
#include "cuda_main.cuh"
#endif

namespace mlp_lm {
struct host_usage final : device_usage {
  [[nodiscard]] std::size_t used() const override { return tessera::memory_of<tessera::backend::host>().peak(); }
};
}  // namespace mlp_lm

int main(int argc, char** argv) {
  mlp_lm::options o;
  if (const int rc = mlp_lm::parse(argc, argv, o); rc >= 0) return rc;
  // An error on any rank ends every rank with its message (comm::mpi_main),
  // instead of finalising MPI while the others wait in a collective.
  return tessera::comm::mpi_main(argc, argv, [&] {
    const bool check_order = o.order_check != "off";  // MPI: auto = on
    tessera::comm::mpi world(tessera::comm::mpi_options{.timeout_s = o.timeout, .order_check = check_order});
    mlp_lm::agree_on_options(world, o);
    if (o.backend == "cuda") {
#if TESSERA_CUDA_COMPILER
      return mlp_lm::run_cuda(o, world);
#else
      throw tessera::error("this build of tessera-mlp-lm has no CUDA backend (configure with CUDA)");
#endif
    }
    mlp_lm::host_usage usage;
    return mlp_lm::dispatch<tessera::backend::host, mlp_lm::host_mlp>(o, world, world, usage);
  });
}
