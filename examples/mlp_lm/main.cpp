// tessera-mlp-lm: the reference trainer. A byte-level MLP language model
// trained with any Tessera strategy and wrapper chosen at run time among the
// compiled instantiations. Run under mpirun for several ranks. Compiled by a
// plain C++ compiler it has the host backend; compiled by nvcc (main.cu) the
// CUDA backend too.
#include <cstdio>

#include "run.hpp"

namespace {
// --plan auto's limit without --gpu-memory: the GPU's memory less 2 GiB for
// the CUDA context and NCCL's buffers, which the library does not count.
double default_gpu_bytes(const mlp_lm::options& o) {
#if TESSERA_CUDA_COMPILER
  if (o.backend == "cuda") {
    cudaDeviceProp p{};
    TESSERA_CUDA(cudaGetDeviceProperties(&p, 0));
    return double(p.totalGlobalMem) - double(2ull << 30);
  }
#endif
  (void)o;
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  trainer_kit::program_name = "tessera-mlp-lm";
  mlp_lm::options o;
  if (const int rc = mlp_lm::parse(argc, argv, o); rc >= 0) return rc;
  // An error on any rank ends every rank with its message (comm::mpi_main),
  // instead of finalising MPI while the others wait in a collective.
  return tessera::comm::mpi_main(argc, argv, [&] {
    const bool check_order = o.order_check != "off";  // MPI: auto = on
    if (o.plan == "auto") {  // every rank computes the same choice; agree_on_options checks it
      int n = 1, r = 0;
      MPI_Comm_size(MPI_COMM_WORLD, &n);
      MPI_Comm_rank(MPI_COMM_WORLD, &r);
      const std::string why = mlp_lm::apply_plan_auto(o, n, default_gpu_bytes(o));
      if (r == 0) std::printf("tessera-mlp-lm %s\n", why.c_str());
    }
    tessera::comm::mpi world(tessera::comm::mpi_options{.timeout_s = o.timeout, .order_check = check_order});
    trainer_kit::agree_on_text(world, mlp_lm::describe(o));
    return o.deterministic ? mlp_lm::run_exact(o, world) : mlp_lm::run_backend<tessera::float_reduction>(o, world);
  }, o.timeout);  // MPI start-up under the same deadline as the collectives
}
