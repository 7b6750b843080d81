// tessera-gpt: GPT-2 trained with any Tessera strategy and wrapper chosen at
// run time among the compiled instantiations. Run under mpirun for several
// ranks. Compiled by a plain C++ compiler it has the host backend; compiled by
// nvcc (main.cu) the CUDA backend too.
#include <cstdio>
#include <optional>

#include "gpt/hf.hpp"
#include "options.hpp"
#include "trainer.hpp"
#if TESSERA_CUDA_COMPILER
#include "cuda_main.cuh"
#endif

int main(int argc, char** argv) {
  trainer_kit::program_name = "tessera-gpt";
  gpt::options o;
  if (const int rc = gpt::parse(argc, argv, o); rc >= 0) return rc;
  // The shape of a Hugging Face directory and the data first, on every rank
  // alike: a bad configuration or file (magic, version, length, a token past
  // the vocabulary) is one line and exit 2 before MPI starts.
  std::optional<gpt::datasets> sets;
  try {
    if (trainer_kit::is_hf_directory(o.init_from))  // its config.json is the shape
      o.shape = gpt::shape_from_hf(trainer_kit::hf::read_config(o.init_from), "--init-from '" + o.init_from + "'",
                                   o.shape.seq);
    sets.emplace(o, o, o.shape.vocab, o.shape.seq);
  } catch (const tessera::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  // An error on any rank ends every rank with its message (comm::mpi_main).
  return tessera::comm::mpi_main(argc, argv, [&] {
    tessera::comm::mpi world(tessera::comm::mpi_options{.timeout_s = o.timeout, .order_check = o.order_check != "off"});
    trainer_kit::agree_on_text(world, gpt::describe(o));
    trainer_kit::agree_on_data(world, sets->digests());
    if (o.backend == "cuda") {
#if TESSERA_CUDA_COMPILER
      return o.deterministic ? gpt::run_exact_cuda(o, world, *sets) : gpt::run_cuda(o, world, *sets);
#else
      throw tessera::error("this build of tessera-gpt has no CUDA backend (configure with CUDA and NCCL)");
#endif
    }
    if (o.deterministic) return gpt::run_exact_host(o, world, *sets);  // exact.cpp
    return gpt::run_host(o, world, *sets);
  }, o.timeout);  // MPI start-up under the same deadline as the collectives
}
