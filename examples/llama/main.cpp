// tessera-llama: Llama 3 trained with any Tessera strategy and wrapper chosen
// at run time among the compiled instantiations, from random weights or a
// Hugging Face directory. Run under mpirun for several ranks. Compiled by a
// plain C++ compiler it has the host backend; compiled by nvcc (main.cu) the
// CUDA backend too.
#include <cstdio>
#include <optional>

#include "llama/hf.hpp"
#include "options.hpp"
#include "trainer.hpp"
#if TESSERA_CUDA_COMPILER
#include "cuda_main.cuh"
#endif

int main(int argc, char** argv) {
  trainer_kit::program_name = "tessera-llama";
  llama::options o;
  if (const int rc = llama::parse(argc, argv, o); rc >= 0) return rc;
  // The shape of a Hugging Face directory and the data first, on every rank
  // alike: a bad configuration or file is one line and exit 2 before MPI starts.
  std::optional<llama::datasets> sets;
  try {
    if (trainer_kit::is_hf_directory(o.init_from))
      o.shape = llama::shape_from_hf(trainer_kit::hf::read_config(o.init_from), "--init-from '" + o.init_from + "'",
                                     o.shape.seq);
    sets.emplace(o, o, o.shape.vocab, o.shape.seq);
  } catch (const tessera::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  // An error on any rank ends every rank with its message (comm::mpi_main).
  return tessera::comm::mpi_main(argc, argv, [&] {
    tessera::comm::mpi world(tessera::comm::mpi_options{.timeout_s = o.timeout, .order_check = o.order_check != "off"});
    trainer_kit::agree_on_text(world, llama::describe(o));
    trainer_kit::agree_on_data(world, sets->digests());
    if (o.backend == "cuda") {
#if TESSERA_CUDA_COMPILER
      return o.deterministic ? llama::run_exact_cuda(o, world, *sets) : llama::run_cuda(o, world, *sets);
#else
      throw tessera::error("this build of tessera-llama has no CUDA backend (configure with CUDA and NCCL)");
#endif
    }
    if (o.deterministic) return llama::run_exact_host(o, world, *sets);  // exact.cpp
    return llama::run_host(o, world, *sets);
  }, o.timeout);  // MPI start-up under the same deadline as the collectives
}
