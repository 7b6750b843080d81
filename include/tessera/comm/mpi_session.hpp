#pragma once
//! \file MPI itself, for comm::mpi and for programs that start it: <mpi.h>
//! without the C++ bindings, a failed MPI call as a tessera::error
//! (TESSERA_MPI, core/error.hpp), and mpi_session, the RAII owner of
//! MPI_Init / MPI_Finalize.
// The deprecated C++ bindings add nothing here and warn under -Wextra.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <string>

#include "tessera/core/error.hpp"

namespace tessera::detail {
[[noreturn]] inline void throw_mpi_error(int rc, const char* call, ::tessera::source_location where) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  int cls = rc;
  MPI_Error_class(rc, &cls);
  throw error("MPI call failed: " + std::string(text, std::size_t(len)), call, cls, where);
}
}  // namespace tessera::detail

namespace tessera::comm {

//! Initialises MPI (thread level MPI_THREAD_FUNNELED) unless already done, and
//! finalises it on destruction if it initialised it. Where it initialises
//! MPI it also sets MPI_ERRORS_RETURN on MPI_COMM_WORLD: Open MPI reports a
//! failed non-blocking collective through MPI_COMM_WORLD's handler in
//! MPI_Wait, which would otherwise end the job instead of letting comm::mpi
//! throw a tessera::error.
//!
//! Construct it outside the try block that catches errors (or use
//! comm::mpi_main): MPI_Finalize during unwinding leaves the other ranks
//! waiting in a collective forever.
class mpi_session {
public:
  mpi_session(int* argc, char*** argv) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      TESSERA_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
      owner_ = true;
    }
  }
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;
  ~mpi_session() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owner_ && !finalized) MPI_Finalize();
  }

private:
  bool owner_ = false;
};

}  // namespace tessera::comm
