// A program that diverges: rank 1 reduces its two units in the other order
// (the bug the README's collective rules forbid). Run by check_faults.py:
//   divergent on   every rank fails at the first wrong collective with a
//                  tessera: error naming both sides; exit 0 when each rank's
//                  message names both units, else 1.
//   divergent off  without the order check MPI gets mismatched collectives:
//                  the job ends (an MPI error or the watchdog) with trace files
//                  in which tessera-doctor finds the first divergent sequence.
#include <cstdio>
#include <cstring>
#include <string>

#include "tessera/tessera.hpp"

using namespace tessera;

int main(int argc, char** argv) {
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
