#pragma once
//! \file page_guard: wrapper_options::poison_released on the host backend
//! refuses a weight span used past its scope at the read, not just with NaN.
//!
//! When a gathered unit is released, its buffer's whole pages are made
//! inaccessible (mprotect PROT_NONE) until the pool gathers into it again. A
//! read or write through a span kept past gather(unit)'s scope then faults,
//! and a SIGSEGV handler that knows the guarded ranges prints one `tessera:`
//! line naming the unit and ends the process (exit code 86); a fault anywhere
//! else goes on to the handler installed before (Open MPI's, or the default).
//! Elements on a page the buffer shares with other memory (at most a page at
//! each end) stay readable: they read NaN, as on the device. Linux only (on
//! other systems protect() does nothing).
#include <cstddef>
#include <cstdint>
#include <utility>

#if defined(__linux__)
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace tessera::detail {

namespace page_guards {
struct range {
  std::uintptr_t begin = 0, end = 0;  // 0, 0: a free entry
  const char* name = nullptr;         // the unit's name (outlives the guard)
};
inline constexpr int capacity = 256;
inline range ranges[capacity];  // read by the handler; written by the one thread that drives the wrapper
inline struct sigaction previous {};
inline bool installed = false;

#if defined(__linux__)
inline void put(char*& at, const char* end, const char* s) {
  while (*s && at < end) *at++ = *s++;
}
// Async-signal-safe: only reads the table, write(2) and _exit.
inline void on_fault(int sig, siginfo_t* info, void* ctx) {
  const auto a = reinterpret_cast<std::uintptr_t>(info->si_addr);
  for (const range& r : ranges)
    if (r.begin <= a && a < r.end) {
      char line[512];
      char* at = line;
      const char* end = line + sizeof line - 1;
      put(at, end, "tessera: the gathered weights of unit '");
      put(at, end, r.name ? r.name : "?");
      put(at, end, "' were read or written after their gather(unit) scope ended: a weight span was kept past "
                   "its scope (found by wrapper_options::poison_released, TESSERA_POISON=1); take weights "
                   "inside the scope, or gather the unit again\n");
      (void)!::write(2, line, std::size_t(at - line));
      ::_exit(86);
    }
  // Not ours: the handler before ours, as if we had never been there.
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction) return previous.sa_sigaction(sig, info, ctx);
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN && previous.sa_handler) {
    return previous.sa_handler(sig);
  }
  ::signal(sig, SIG_DFL);  // returning re-runs the access: the default action ends the process
}
inline void install() {
  if (installed) return;
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(SIGSEGV, &sa, &previous) == 0) installed = true;
}
#endif
}  // namespace page_guards

//! One buffer's guarded pages; lifted when destroyed or moved from.
class page_guard {
public:
  page_guard() = default;
  page_guard(page_guard&& o) noexcept : entry_(std::exchange(o.entry_, -1)) {}
  page_guard& operator=(page_guard&& o) noexcept {
    if (this != &o) lift(), entry_ = std::exchange(o.entry_, -1);
    return *this;
  }
  page_guard(const page_guard&) = delete;
  page_guard& operator=(const page_guard&) = delete;
  ~page_guard() { lift(); }

  //! Makes the whole pages of [p, p + bytes) inaccessible, named `name` (which
  //! must outlive the guard) in the fault's message. Lifts an earlier guard first.
  void protect(const void* p, std::size_t bytes, const char* name) noexcept {
    lift();
#if defined(__linux__)
    const auto page = std::uintptr_t(::sysconf(_SC_PAGESIZE));
    const auto start = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t b = (start + page - 1) / page * page, e = (start + bytes) / page * page;
    if (e <= b) return;  // no whole page inside
    int free_entry = -1;
    for (int i = 0; i < page_guards::capacity && free_entry < 0; ++i)
      if (page_guards::ranges[i].end == 0) free_entry = i;
    if (free_entry < 0) return;  // more guarded buffers than entries: the rest read NaN only
    page_guards::install();
    if (::mprotect(reinterpret_cast<void*>(b), e - b, PROT_NONE) != 0) return;
    page_guards::ranges[free_entry] = {b, e, name};
    entry_ = free_entry;
#else
    (void)p, (void)bytes, (void)name;
#endif
  }
  //! Makes the pages accessible again (before the buffer is written or freed).
  void lift() noexcept {
#if defined(__linux__)
    if (entry_ < 0) return;
    auto& r = page_guards::ranges[entry_];
    ::mprotect(reinterpret_cast<void*>(r.begin), r.end - r.begin, PROT_READ | PROT_WRITE);
    r = {};
#endif
    entry_ = -1;
  }

private:
  int entry_ = -1;
};

}  // namespace tessera::detail
