#pragma once
//! \file The watchdog: one thread per process that holds every outstanding
//! collective of every tessera communicator to its deadline, so the thread
//! that issues collectives never waits on the host for one (comm::nccl's
//! overlap depends on the host running ahead).
//!
//! Every tick (20 ms) it notes a heartbeat (a gap of a second or more: the
//! process was stopped, recorded for tessera-doctor), completes the collectives whose completion it polls
//! (CUDA events), asks each communicator for an asynchronous failure (NCCL),
//! and on the first deadline passed or failure: prints one `tessera:` line,
//! writes the trace file (comm/trace.hpp) and calls the communicator's fault
//! handler (comm::nccl aborts itself, so the next call on every rank throws;
//! comm::mpi ends the job with MPI_Abort: a rank blocked in MPI cannot be
//! woken). It also writes the trace file on SIGUSR1 (where the program has
//! no handler of its own), on std::terminate (an uncaught error), and at
//! exit with TESSERA_TRACE_AT_EXIT=1.
//!
//! SIGTERM (where the program has no handler of its own) writes the trace
//! file before the process ends as SIGTERM would end it: launchers end every
//! rank with it when one rank dies, and the survivors' files, with none from
//! the rank that died, let tessera-doctor name that rank.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "tessera/comm/trace.hpp"

namespace tessera::comm {

namespace detail {
inline std::atomic<bool> dump_requested{false};
inline std::atomic<bool> term_requested{false};
inline void on_sigusr1(int) { dump_requested.store(true, std::memory_order_relaxed); }
// The watchdog's thread writes the trace and ends the process; a second
// SIGTERM (that thread is gone or stuck) ends it at once.
inline void on_sigterm(int) {
  if (term_requested.exchange(true)) {
    std::signal(SIGTERM, SIG_DFL);
    std::raise(SIGTERM);
  }
}
// Installs h for sig unless the program handles or ignores sig itself.
inline void handle_if_default(int sig, void (*h)(int)) {
  struct sigaction old{};
  if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_DFL && !(old.sa_flags & SA_SIGINFO)) std::signal(sig, h);
}
inline std::terminate_handler previous_terminate = nullptr;
inline void on_terminate() {
  std::string why = "std::terminate";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      why = x.what();
    } catch (...) {
    }
  }
  trace::global().dump("terminate", why);
  if (previous_terminate) previous_terminate();
  std::abort();
}
}  // namespace detail

class watchdog {
public:
  //! The process's watchdog, started on first use.
  static watchdog& start() {
    static watchdog w;
    return w;
  }
  watchdog(const watchdog&) = delete;
  watchdog& operator=(const watchdog&) = delete;
  ~watchdog() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    // No thread acts on SIGTERM any more: its default comes back (and one
    // that arrived meanwhile takes effect).
    struct sigaction now{};
    if (sigaction(SIGTERM, nullptr, &now) == 0 && now.sa_handler == &detail::on_sigterm) std::signal(SIGTERM, SIG_DFL);
    if (detail::term_requested.load()) std::raise(SIGTERM);
    // TESSERA_TRACE_AT_EXIT=1: a trace file from every rank that ends
    // normally too, for a job that finished but diverged silently.
    if (const char* e = std::getenv("TESSERA_TRACE_AT_EXIT"); e && std::string_view(e) == "1")
      trace::global().dump("exit");
  }

  //! Faults the watchdog reported (tests read it).
  [[nodiscard]] int faults() const noexcept { return faults_.load(); }

private:
  watchdog() {
    trace::recorder& rec = trace::global();  // constructed first, so destroyed after this thread is joined
    if (rec.enabled()) {
      detail::handle_if_default(SIGUSR1, &detail::on_sigusr1);
      detail::handle_if_default(SIGTERM, &detail::on_sigterm);
      detail::previous_terminate = std::set_terminate(&detail::on_terminate);
    }
    thread_ = std::thread([this, &rec] { run(rec); });
  }
  void run(trace::recorder& rec) {
    std::int64_t tick = trace::now_us();
    while (!stop_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      // First, before a SIGTERM that came with a SIGCONT is handled: the
      // gap of a stop must be in the file that SIGTERM writes.
      const std::int64_t now = trace::now_us();
      rec.heartbeat(tick, now);
      tick = now;
      if (detail::dump_requested.exchange(false)) {
        const auto path = rec.dump("signal", "SIGUSR1");
        if (!path.empty()) std::fprintf(stderr, "tessera: trace written to %s (SIGUSR1)\n", path.c_str());
      }
      if (detail::term_requested.load()) {
        const auto path = rec.dump("signal", "SIGTERM");
        std::fprintf(stderr, "tessera: rank %d (pid %d) ended by SIGTERM (a launcher ends every rank so when one rank "
                     "failed or died or the job was cancelled)%s%s\n", rec.process_rank(), int(::getpid()),
                     path.empty() ? "" : "; trace written to ", path.c_str());
        std::fflush(stderr);
        std::signal(SIGTERM, SIG_DFL);
        std::raise(SIGTERM);  // ends the process as SIGTERM would have
      }
      trace::recorder::fault f = rec.poll();
      if (f.comm < 0) continue;
      faults_++;
      rec.set_faulted(f.message);
      const auto path = rec.dump("timeout", f.message);
      std::fprintf(stderr, "tessera: watchdog: %s%s%s\n", f.message.c_str(), path.empty() ? "" : "; trace written to ",
                   path.c_str());
      std::fflush(stderr);
      if (f.on_fault) f.on_fault(f.message);
    }
  }

  std::atomic<bool> stop_{false};
  std::atomic<int> faults_{0};
  std::thread thread_;
};

//! The timeout a communicator uses when its options leave it unset (< 0):
//! TESSERA_TIMEOUT_S from the environment, else 600 s (PyTorch's default).
//! 0 turns the deadline off.
[[nodiscard]] inline double default_timeout_s(double asked) {
  if (asked >= 0) return asked;
  if (const char* e = std::getenv("TESSERA_TIMEOUT_S"); e && *e) {
    char* end = nullptr;
    const double v = std::strtod(e, &end);
    if (end && *end == 0 && v >= 0 && v < 1e9) return v;
    std::fprintf(stderr, "tessera: ignoring TESSERA_TIMEOUT_S='%s' (not a number of seconds)\n", e);
  }
  return 600;
}

}  // namespace tessera::comm
