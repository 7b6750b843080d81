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
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "tessera/comm/watchdog.hpp"
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

namespace detail {
// Start-up under a deadline: no communicator (so no watchdog) exists yet,
// and a rank that is stopped or lost while MPI starts would leave the others
// inside MPI_Init forever, printing nothing. When the deadline passes this
// process says so and exits; the launcher then ends the job.
// The same holds for the collectives that make communicators
// (MPI_Comm_dup, MPI_Comm_split): comm::mpi's watchdog exists only once they
// return. `what` names the call in the message.
class startup_deadline {
public:
  explicit startup_deadline(double seconds, const char* what = "MPI start-up (MPI_Init)") : what_(what) {
    if (seconds > 0) thread_ = std::thread([this, seconds] { watch(seconds); });
  }
  startup_deadline(const startup_deadline&) = delete;
  startup_deadline& operator=(const startup_deadline&) = delete;
  ~startup_deadline() {
    {
      std::lock_guard g(m_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

private:
  void watch(double seconds) {
    std::unique_lock g(m_);
    if (cv_.wait_for(g, std::chrono::duration<double>(seconds), [&] { return done_; })) return;
    // The launcher's variables name this process before MPI can.
    const char* rank = nullptr;
    for (const char* k : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
      if ((rank = std::getenv(k)) != nullptr) break;
    char host[64] = {};
    ::gethostname(host, sizeof host - 1);
    std::fprintf(stderr,
                 "tessera: rank %s (pid %d on %s): %s did not finish within %g s: another rank "
                 "was stopped, died or never started, or the launcher cannot reach it; ending this process "
                 "(--timeout or TESSERA_TIMEOUT_S set the deadline, 0 turns it off)\n",
                 rank ? rank : "?", int(::getpid()), host, what_, seconds);
    std::fflush(stderr);
    std::_Exit(2);
  }
  const char* what_;
  std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};
}  // namespace detail

//! Initialises MPI (thread level MPI_THREAD_FUNNELED) unless already done, and
//! finalises it on destruction if it initialised it. Where it initialises
//! MPI it also sets MPI_ERRORS_RETURN on MPI_COMM_WORLD: Open MPI reports a
//! failed non-blocking collective through MPI_COMM_WORLD's handler in
//! MPI_Wait, which would otherwise end the job instead of letting comm::mpi
//! throw a tessera::error.
//!
//! MPI_Init runs under a deadline (`startup_timeout_s`; < 0: the watchdog's
//! default, TESSERA_TIMEOUT_S or 600 s; 0: none): past it the process prints a `tessera:` line naming
//! itself and exits, so a rank lost during start-up ends the job instead of
//! hanging it.
//!
//! Construct it outside the try block that catches errors (or use
//! comm::mpi_main): MPI_Finalize during unwinding leaves the other ranks
//! waiting in a collective forever.
class mpi_session {
public:
  mpi_session(int* argc, char*** argv, double startup_timeout_s = -1) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      {
        const detail::startup_deadline deadline(default_timeout_s(startup_timeout_s));
        TESSERA_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
      }
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
