// A program that diverges: rank 1 reduces its two units in the other order
// (the bug the README's collective rules forbid). Run by check_faults.py:
//   divergent on   every rank fails at the first wrong collective with a
//                  tessera: error naming both sides; exit 0 when each rank's
//                  message names both units, else 1.
//   divergent off  without the order check MPI gets mismatched collectives:
//                  the job ends (an MPI error or the watchdog) with trace files
//                  in which tessera-doctor finds the first divergent sequence.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tessera/tessera.hpp"

using namespace tessera;

// divergent leave: without mpi_main, the usual user pattern: rank 1 throws
// at step 2, catches and returns from main; the others train on. Rank 1's
// communicator ends as it returns (comm::mpi's end check), so the others fail
// at their next collective, rank 1 named as leaving, within seconds, not at
// the watchdog's deadline. Exit 0 on the ranks that name it.
int leave(int argc, char** argv) {
  comm::mpi_session session(&argc, &argv);  // outside the try: finalized after the communicator ends
  int rank = -1;
  try {
    comm::mpi c;
    rank = c.rank();
    data_parallel_t<config<optim_grads_params, fsdp>> m(c);
    auto a = m.add_unit("alpha");
    auto w = m.add_param(a, "w", {64});
    m.finalize();
    ShardedOptimizer opt(m, sgd{.lr = 0.1});
    for (int step = 0; step < 1000000; ++step) {
      if (rank == 1 && step == 2) throw tessera::error("an error on rank 1 only, caught in main");
      m.begin_micro_batch(0, 1);
      {
        auto s = m.gather(a);
        for (auto& g : s.grad(w)) g = 1.0f;
      }
      (void)opt.step();
    }
  } catch (const std::exception& e) {
    const bool named = std::string(e.what()).find("rank 1 issued end") != std::string::npos;
    std::printf("rank %d: %s\n", rank, e.what());
    std::fflush(stdout);
    return rank == 1 || named ? 0 : 1;
  }
  return 1;
}

// divergent startup: rank 1 stops itself (SIGSTOP) before MPI starts; the
// others wait in MPI_Init until mpi_session's start-up deadline ends them
// with a tessera: line (TESSERA_TIMEOUT_S, set short by check_faults.py).
int startup(int argc, char** argv) {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  if (r && std::strcmp(r, "1") == 0) ::raise(SIGSTOP);
  comm::mpi_session session(&argc, &argv);
  comm::mpi c;
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "leave") == 0) return leave(argc, argv);
  if (argc > 1 && std::strcmp(argv[1], "startup") == 0) return startup(argc, argv);
  const bool check = argc > 1 && std::strcmp(argv[1], "on") == 0;
  return comm::mpi_main(argc, argv, [&] {
    comm::mpi c(comm::mpi_options{.order_check = check});
    data_parallel_t<config<optim_grads, fsdp>> m(c);
    auto a = m.add_unit("alpha"), b = m.add_unit("beta");
    auto wa = m.add_param(a, "w", {6}), wb = m.add_param(b, "w", {9, 3});
    m.finalize();
    for (int step = 0; step < 3; ++step) {
      m.begin_micro_batch(0, 1);
      for (auto [u, w] : {std::pair{a, wa}, std::pair{b, wb}}) {
        auto s = m.gather(u);
        for (auto& g : s.grad(w)) g = 1.0f;
      }
      const bool odd = c.rank() == 1 && step == 2;  // two good steps first: the recorder has history
      try {
        m.reduce_grads(odd ? a : b);
        m.reduce_grads(odd ? b : a);
      } catch (const tessera::error& e) {
        if (!check) throw;
        const std::string msg = e.what();
        const bool names_both = msg.find("reduce_grads alpha") != std::string::npos &&
                                msg.find("reduce_grads beta") != std::string::npos;
        std::printf("rank %d: %s\n", c.rank(), msg.c_str());
        return names_both ? 0 : 1;
      }
      m.finish_grad_sync();
      m.zero_grad();
    }
    std::printf("rank %d: no error\n", c.rank());
    return check ? 1 : 0;
  });
}
