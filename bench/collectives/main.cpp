// tessera-collectives: see collectives.hpp. Compiled as C++ for the host
// backend alone, or through main_cuda.cu by nvcc for both backends.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "report.hpp"

namespace {
// "8", "64K", "64M", "4G" -> bytes.
std::size_t parse_size(const std::string& s) {
  std::size_t pos = 0;
  const double v = std::stod(s, &pos);
  std::size_t mult = 1;
  if (pos < s.size()) {
    switch (s[pos]) {
      case 'K': case 'k': mult = 1ull << 10; break;
      case 'M': case 'm': mult = 1ull << 20; break;
      case 'G': case 'g': mult = 1ull << 30; break;
      default: throw std::invalid_argument("size suffix");
    }
  }
  return std::size_t(v * double(mult));
}

template <class B, class Comm>
int by_dtype(Comm& c, const collectives::options& o, const std::string& be, const std::string& cn) {
  using namespace tessera;
  if (o.dtype == "float") return collectives::run<B, float>(c, o, be, cn);
  if (o.dtype == "bf16") return collectives::run<B, bf16>(c, o, be, cn);
  if (o.dtype == "double") return collectives::run<B, double>(c, o, be, cn);
  return collectives::run<B, fp16>(c, o, be, cn);
}
}  // namespace

int main(int argc, char** argv) {
  collectives::options o;
  std::string b = "8", e = "64M", backend = "host", comm_kind = "nccl";
  CLI::App app{"tessera-collectives: Tessera's collectives beside raw NCCL / MPI, nccl-tests style"};
  app.add_option("-b,--minbytes", b, "smallest size (suffixes K, M, G)");
  app.add_option("-e,--maxbytes", e, "largest size");
  app.add_option("-f,--stepfactor", o.factor, "multiplication factor between sizes")->check(CLI::Range(1.01, 1024.0));
  app.add_option("-d,--datatype", o.dtype, "float, bf16, half or double")
      ->check(CLI::IsMember({"float", "bf16", "half", "double"}));
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations")->check(CLI::Range(0, 1 << 20));
  app.add_option("-n,--iters", o.iters, "timed iterations")->check(CLI::Range(1, 1 << 20));
  app.add_option("-o,--ops", o.ops, "operations")
      ->delimiter(',')
      ->check(CLI::IsMember({"all_gather", "reduce_scatter", "all_reduce", "broadcast"}));
  app.add_option("-i,--impls", o.impls, "implementations")->delimiter(',')->check(CLI::IsMember({"raw", "sharded", "unit", "unit2", "units", "mixed", "fp8"}));
  app.add_option("--json", o.json, "write every row as JSON to this file");
  app.add_option("--min-busbw", o.min_busbw, "exit 1 when a row's bus bandwidth (GB/s) falls under this");
  app.add_option("--backend", backend, "host or cuda")->check(CLI::IsMember({"host", "cuda"}));
  app.add_option("--comm", comm_kind, "cuda backend: nccl (one GPU per rank) or mpi (staged; ranks may share a GPU)")
      ->check(CLI::IsMember({"nccl", "mpi"}));
  try {
    app.parse(argc, argv);
    o.min_bytes = parse_size(b);
    o.max_bytes = parse_size(e);
    if (o.min_bytes == 0 || o.min_bytes > o.max_bytes) throw CLI::ValidationError("-b/-e", "need 0 < minbytes <= maxbytes");
  } catch (const CLI::CallForHelp& x) {
    return app.exit(x);
  } catch (const std::exception& x) {
    std::fprintf(stderr, "tessera: %s (see --help)\n", x.what());
    return 2;
  }
  try {
    tessera::comm::mpi_session session(&argc, &argv);
    tessera::comm::mpi world;
    if (backend == "host") return by_dtype<tessera::backend::host>(world, o, "host", "mpi");
#if TESSERA_CUDA_COMPILER
    int devices = 0;
    TESSERA_CUDA(cudaGetDeviceCount(&devices));
    TESSERA_CHECK(devices > 0, "--backend cuda on a machine without a GPU");
    TESSERA_CUDA(cudaSetDevice(world.rank() % devices));
    if (comm_kind == "nccl") {
      tessera::comm::nccl c(world);
      return by_dtype<tessera::backend::cuda>(c, o, "cuda", "nccl");
    }
    tessera::comm::mpi_device c;
    return by_dtype<tessera::backend::cuda>(c, o, "cuda", "mpi (staged)");
#else
    std::fprintf(stderr, "tessera: this build of tessera-collectives has no CUDA backend\n");
    return 2;
#endif
  } catch (const std::exception& x) {
    std::fprintf(stderr, "%s\n", x.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
