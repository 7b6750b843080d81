// tessera-mlp-lm: the reference trainer. A byte-level MLP language model
// trained with any Tessera strategy and wrapper chosen at run time among the
// compiled instantiations. Run under mpirun for several ranks. Compiled by a
// plain C++ compiler it has the host backend; compiled by nvcc (main.cu) the
// CUDA backend too.
#include <cstdio>

#include "run.hpp"

int main(int argc, char** argv) {
  mlp_lm::options o;
  if (const int rc = mlp_lm::parse(argc, argv, o); rc >= 0) return rc;
  // An error on any rank ends every rank with its message (comm::mpi_main),
  // instead of finalising MPI while the others wait in a collective.
  return tessera::comm::mpi_main(argc, argv, [&] {
    const bool check_order = o.order_check != "off";  // MPI: auto = on
    tessera::comm::mpi world(tessera::comm::mpi_options{.timeout_s = o.timeout, .order_check = check_order});
    mlp_lm::agree_on_options(world, o);
    return o.deterministic ? mlp_lm::run_exact(o, world) : mlp_lm::run_backend<tessera::float_reduction>(o, world);
  });
}
