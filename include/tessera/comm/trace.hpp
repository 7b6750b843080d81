#pragma once
//! \file The flight recorder: every collective a tessera communicator issues,
//! in a ring of the last K per process, with what the library was doing
//! (comm::label), and the deadline the watchdog (comm/watchdog.hpp) holds it
//! to. Written as one JSON file per rank, which tessera-doctor reads.
//!
//! Each communicator registers itself (comm::trace::channel) and numbers its
//! collectives 0, 1, 2, ...: ranks that run the same program issue the same
//! sequence on each communicator, so sequence k can be compared across ranks.
//! Communicators are numbered in creation order, which is the same on every
//! rank (creation is collective).
//!
//! Environment: TESSERA_TRACE=0 turns the trace files (and the SIGUSR1
//! dump) off, not the recording the watchdog needs; TESSERA_TRACE_ENTRIES=K sets the ring's length (default 4096);
//! TESSERA_TRACE_DIR is where the files go (default: trace::default_dir(),
//! a folder of the job's under $TMPDIR or /tmp).
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <csignal>

#include <signal.h>
#include <unistd.h>

#include "tessera/comm/label.hpp"
#include "tessera/comm/trace_files.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"

namespace tessera::comm {

namespace trace {

using clock = std::chrono::system_clock;  // comparable across the ranks of one machine
[[nodiscard]] inline std::int64_t now_us() noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(clock::now().time_since_epoch()).count();
}

enum class state : std::uint8_t { issued, completed, failed };

//! One collective as this rank saw it.
struct entry {
  std::uint64_t seq = 0;        // per communicator
  int comm = -1;                // channel id
  const char* op = "";          // "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier"
  std::array<char, 72> label{};  // what the library was doing ("gather layer.3")
  std::uint64_t count = 0;      // elements
  dtype type = dtype::u8;
  std::int64_t issued_us = 0;     // the call was made
  std::int64_t waiting_us = 0;    // the host began to wait for it (0: never waited on the host)
  std::int64_t completed_us = 0;  // completion was seen (0: not yet)
  state st = state::issued;
};

//! How a collective is named in every message and by the doctor:
//! "all_reduce #17 (1024 x F32, gather layer.3)".
[[nodiscard]] inline std::string call_text(const char* op, std::uint64_t seq, std::uint64_t count, dtype t,
                                           const char* label) {
  std::string s = std::string(op) + " #" + std::to_string(seq) + " (" + std::to_string(count) + " x " +
                  std::string(name_of(t));
  if (label && *label) s += std::string(", ") + label;
  return s + ")";
}

//! What the watchdog needs of a communicator: how to tell whether an entry
//! finished (set per collective), whether the communicator failed on its
//! own, and what to do on a deadline.
struct channel_info {
  std::string kind;          // "mpi", "nccl"
  int rank = 0, size = 1;
  double timeout_s = 0;      // 0: no deadline
  //! Called by the watchdog thread once, with the message, when a deadline
  //! passes or health() reports a failure. Must make the waiting ranks stop
  //! waiting (abort the communicator, or end the process).
  std::function<void(const std::string&)> on_fault;
  //! Polled by the watchdog: a non-empty string is an asynchronous failure.
  std::function<std::string()> health;
};

//! A collective the watchdog holds to a deadline.
struct watch {
  std::uint64_t slot = 0;  // absolute index into the ring (slot % K)
  int comm = -1;
  std::uint64_t seq = 0;
  std::int64_t deadline_us = 0;  // 0: none yet (an MPI request nobody waits for)
  std::function<bool()> done;    // null: the host marks it (MPI); else polled (a CUDA event)
};

//! The process's flight recorder and the set of live channels.
class recorder {
public:
  recorder() {
    const char* on = std::getenv("TESSERA_TRACE");
    enabled_ = !(on && std::string_view(on) == "0");
    std::size_t k = 4096;
    if (const char* e = std::getenv("TESSERA_TRACE_ENTRIES")) k = std::max<std::size_t>(16, std::strtoull(e, nullptr, 10));
    ring_.resize(k);
  }

  [[nodiscard]] bool enabled() const noexcept { return enabled_; }

  //! Registers a communicator; returns its id (creation order in this process).
  int open(channel_info info) {
    std::lock_guard lock(mu_);
    channels_.push_back({std::move(info), 0, true, false});
    if (process_rank_ < 0) process_rank_ = channels_.back().info.rank, process_size_ = channels_.back().info.size;
    return int(channels_.size()) - 1;
  }
  void close(int id) {
    std::lock_guard lock(mu_);
    if (id < 0 || std::size_t(id) >= channels_.size()) return;
    channels_[std::size_t(id)].live = false;
    channels_[std::size_t(id)].info.on_fault = nullptr;
    channels_[std::size_t(id)].info.health = nullptr;
    std::erase_if(watches_, [id](const watch& w) { return w.comm == id; });
  }
  //! The rank that names this process's trace file (MPI_COMM_WORLD's, where known).
  void set_process_rank(int rank, int size) {
    std::lock_guard lock(mu_);
    process_rank_ = rank;
    process_size_ = size;
  }
  [[nodiscard]] int process_rank() const noexcept { return process_rank_; }

  //! The process ids of the other ranks on this host (comm::mpi learns them
  //! when it duplicates MPI_COMM_WORLD): on a fault this rank asks them, by
  //! SIGUSR1, to write their trace files too, before the job ends.
  void set_peers(std::vector<int> pids) {
    std::lock_guard lock(mu_);
    peers_ = std::move(pids);
  }
  //! Sends SIGUSR1 to the peers; returns how many were asked.
  int ask_peers_to_dump() {
    std::vector<int> p;
    {
      std::lock_guard lock(mu_);
      p = peers_;
    }
    int n = 0;
    if (enabled_)
      for (int pid : p) n += ::kill(pid, SIGUSR1) == 0;
    return n;
  }

  //! After the watchdog reported a fault, every collective this process
  //! issues on any communicator throws at once (the job is broken: a rank
  //! that goes on to another communicator would otherwise wait there for a
  //! second timeout).
  void throw_if_faulted(const char* op) const {
    if (!faulted_.load(std::memory_order_relaxed)) [[likely]] return;
    std::string why;
    {
      std::lock_guard lock(mu_);
      why = fault_message_;
    }
    ::tessera::detail::fail(std::string(op) + " not started: an earlier collective failed in this process (" + why + ")");
  }
  [[nodiscard]] bool faulted() const noexcept { return faulted_.load(std::memory_order_relaxed); }
  void set_faulted(const std::string& message) {
    std::lock_guard lock(mu_);
    if (!faulted_.load()) fault_message_ = message;
    faulted_.store(true);
  }

  //! Records a collective being issued on channel `id`; returns its ticket.
  //! `done`, if given, tells the watchdog when it completed (else the host
  //! calls complete()). The deadline starts now when `waits_now` (a blocking
  //! call, or a device collective), else at waiting().
  struct ticket {
    std::uint64_t slot = ~0ull;
    int comm = -1;
    std::uint64_t seq = 0;
  };
  ticket issue(int id, const char* op, std::size_t count, dtype t, bool waits_now,
               std::function<bool()> done = nullptr) {
    const std::int64_t now = now_us();
    std::lock_guard lock(mu_);
    auto& ch = channels_.at(std::size_t(id));
    const std::uint64_t seq = ch.next_seq++;
    const std::uint64_t slot = next_slot_++;
    entry& e = ring_[slot % ring_.size()];
    e = entry{};
    e.seq = seq;
    e.comm = id;
    e.op = op;
    write_label(e.label);
    e.count = count;
    e.type = t;
    e.issued_us = now;
    if (waits_now) e.waiting_us = now;
    if (ch.info.timeout_s > 0)
      watches_.push_back({slot, id, seq, waits_now ? now + std::int64_t(ch.info.timeout_s * 1e6) : 0, std::move(done)});
    return {slot, id, seq};
  }
  //! The host began to wait for the collective (its deadline starts, if not yet).
  void waiting(const ticket& t) {
    const std::int64_t now = now_us();
    std::lock_guard lock(mu_);
    if (entry* e = find(t); e && !e->waiting_us) e->waiting_us = now;
    for (auto& w : watches_)
      if (w.slot == t.slot && !w.deadline_us)
        w.deadline_us = now + std::int64_t(channels_[std::size_t(t.comm)].info.timeout_s * 1e6);
  }
  //! Not waited for yet: the deadline starts at waiting() (after a blocking
  //! preamble such as the order check, which issue() covered).
  void idle(const ticket& t) {
    std::lock_guard lock(mu_);
    if (entry* e = find(t)) e->waiting_us = 0;
    for (auto& w : watches_)
      if (w.slot == t.slot) w.deadline_us = 0;
  }
  //! The collective finished (ok) or failed.
  void complete(const ticket& t, bool ok = true) {
    const std::int64_t now = now_us();
    std::lock_guard lock(mu_);
    if (entry* e = find(t)) {
      e->completed_us = now;
      e->st = ok ? state::completed : state::failed;
    }
    std::erase_if(watches_, [&](const watch& w) { return w.slot == t.slot; });
  }
  //! A copy of the entry behind a ticket (if still in the ring).
  [[nodiscard]] bool get(const ticket& t, entry& out) {
    std::lock_guard lock(mu_);
    if (entry* e = find(t)) return out = *e, true;
    return false;
  }

  //! The watchdog's pass: completes polled entries, returns the first
  //! collective past its deadline (or a channel's asynchronous failure) as
  //! (channel, message), with the channel's fault handler; empty if none.
  struct fault {
    int comm = -1;
    std::string message;
    std::function<void(const std::string&)> on_fault;
  };
  [[nodiscard]] fault poll() {
    const std::int64_t now = now_us();
    std::lock_guard lock(mu_);
    std::erase_if(watches_, [&](const watch& w) {
      if (!w.done || !w.done()) return false;
      if (w.slot + ring_.size() >= next_slot_) {
        entry& e = ring_[w.slot % ring_.size()];
        e.completed_us = now;
        e.st = state::completed;
      }
      return true;
    });
    for (std::size_t id = 0; id < channels_.size(); ++id) {
      auto& ch = channels_[id];
      if (!ch.live || ch.faulted || !ch.info.health) continue;
      if (std::string why = ch.info.health(); !why.empty()) {
        ch.faulted = true;
        return {int(id), describe_channel(id) + " failed on rank " + std::to_string(ch.info.rank) + " of " +
                             std::to_string(ch.info.size) + ": " + why, ch.info.on_fault};
      }
    }
    for (const auto& w : watches_) {
      if (!w.deadline_us || now < w.deadline_us) continue;
      auto& ch = channels_[std::size_t(w.comm)];
      if (ch.faulted) continue;
      ch.faulted = true;
      std::string what = "collective";
      if (w.slot + ring_.size() >= next_slot_) what = describe(ring_[w.slot % ring_.size()]);
      return {w.comm,
              what + " did not complete within " + format_seconds(ch.info.timeout_s) + " s on rank " +
                  std::to_string(ch.info.rank) + " of " + std::to_string(ch.info.size) + " (" + describe_channel(std::size_t(w.comm)) +
                  "): another rank stopped, diverged or is still working; see the trace files (tessera-doctor)",
              ch.info.on_fault};
    }
    return {};
  }

  //! The watchdog's heartbeat (a tick every 20 ms, comm/watchdog.hpp). A gap
  //! of a second or more means the whole process did not run (SIGSTOP, a
  //! debugger, a suspended machine, a host out of CPU): the last eight go
  //! into the trace file as "stalls", so that tessera-doctor can tell a rank
  //! stopped inside a wait from the ranks that waited for it.
  void heartbeat(std::int64_t previous_us, std::int64_t now) {
    if (now - previous_us < 1'000'000) return;
    std::lock_guard lock(mu_);
    if (stalls_.size() == 8) stalls_.erase(stalls_.begin());
    stalls_.push_back({previous_us, now});
  }

  [[nodiscard]] static std::string describe(const entry& e) {
    return call_text(e.op, e.seq, e.count, e.type, e.label.data());
  }

  //! Where this process's trace file goes: TESSERA_TRACE_DIR, else this
  //! job's folder under the temporary directory (trace::default_dir()).
  [[nodiscard]] std::filesystem::path file() const {
    const char* dir = std::getenv("TESSERA_TRACE_DIR");
    const int r = process_rank_ < 0 ? 0 : process_rank_;
    return (dir && *dir ? std::filesystem::path(dir) : default_dir()) / ("tessera-trace-rank" + std::to_string(r) + ".json");
  }
  //! Writes the trace file (atomically: a temporary renamed into place).
  //! Returns its path, or empty when disabled or the write failed (a dump
  //! happens while something already went wrong: it never throws).
  std::filesystem::path dump(std::string_view reason, std::string_view message = {}) noexcept {
    if (!enabled_) return {};
    try {
      std::string out;
      {
        std::lock_guard lock(mu_);
        // The file written at a timeout shows what the rank waited in; what
        // follows (the error it causes, a launcher waking a stopped peer so
        // that the collective completes after all) must not replace it.
        // Nor may a dump another rank asks for (SIGUSR1) replace this rank's own error.
        if (timeout_written_ || (error_written_ && reason == "signal")) return file();
        timeout_written_ = reason == "timeout";
        error_written_ = error_written_ || reason == "error" || reason == "terminate";
        out = to_json(reason, message);
      }
      const auto path = file();
      std::error_code ec;
      std::filesystem::create_directories(path.parent_path().empty() ? "." : path.parent_path(), ec);
      const auto tmp = path.string() + ".tmp." + std::to_string(::getpid());
      std::FILE* f = std::fopen(tmp.c_str(), "wb");
      if (!f) return {};
      const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
      if (std::fclose(f) != 0 || !ok) return std::filesystem::remove(tmp, ec), std::filesystem::path{};
      std::filesystem::rename(tmp, path, ec);
      return ec ? std::filesystem::path{} : path;
    } catch (...) {
      return {};
    }
  }

private:
  struct channel {
    channel_info info;
    std::uint64_t next_seq = 0;
    bool live = true;
    bool faulted = false;  // reported once; the handler took over
  };

  entry* find(const ticket& t) {
    if (t.slot == ~0ull || t.slot + ring_.size() < next_slot_) return nullptr;  // overwritten
    return &ring_[t.slot % ring_.size()];
  }
  std::string describe_channel(std::size_t id) const {
    return "communicator " + std::to_string(id) + ", " + channels_[id].info.kind;
  }
  static std::string format_seconds(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", s);
    return b;
  }
  std::string to_json(std::string_view reason, std::string_view message) const {
    std::string o = "{\"format\":\"tessera-trace\",\"version\":1,\"rank\":" + std::to_string(process_rank_) +
                    ",\"world\":" + std::to_string(process_size_) + ",\"pid\":" + std::to_string(::getpid());
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    o += ",\"host\":";
    json_string(o, host);
    o += ",\"reason\":";
    json_string(o, reason);
    o += ",\"message\":";
    json_string(o, message);
    o += ",\"time_us\":" + std::to_string(now_us()) + ",\"capacity\":" + std::to_string(ring_.size()) +
         ",\"dropped\":" + std::to_string(next_slot_ > ring_.size() ? next_slot_ - ring_.size() : 0) + ",\"comms\":[";
    for (std::size_t i = 0; i < channels_.size(); ++i) {
      const auto& c = channels_[i];
      if (i) o += ',';
      o += "{\"id\":" + std::to_string(i) + ",\"kind\":";
      json_string(o, c.info.kind);
      o += ",\"rank\":" + std::to_string(c.info.rank) + ",\"size\":" + std::to_string(c.info.size) +
           ",\"timeout_s\":" + format_seconds(c.info.timeout_s) + ",\"next_seq\":" + std::to_string(c.next_seq) +
           ",\"live\":" + (c.live ? "true" : "false") + "}";
    }
    o += "],\"stalls\":[";
    for (std::size_t i = 0; i < stalls_.size(); ++i)
      o += std::string(i ? "," : "") + "{\"from_us\":" + std::to_string(stalls_[i].first) +
           ",\"to_us\":" + std::to_string(stalls_[i].second) + "}";
    o += "],\"entries\":[";
    const std::uint64_t first = next_slot_ > ring_.size() ? next_slot_ - ring_.size() : 0;
    for (std::uint64_t s = first; s < next_slot_; ++s) {
      const entry& e = ring_[s % ring_.size()];
      if (s != first) o += ',';
      o += "{\"comm\":" + std::to_string(e.comm) + ",\"seq\":" + std::to_string(e.seq) + ",\"op\":";
      json_string(o, e.op);
      o += ",\"label\":";
      json_string(o, e.label.data());
      o += ",\"count\":" + std::to_string(e.count) + ",\"dtype\":\"" + std::string(name_of(e.type)) +
           "\",\"bytes\":" + std::to_string(e.count * size_of(e.type)) + ",\"issued_us\":" + std::to_string(e.issued_us) +
           ",\"waiting_us\":" + std::to_string(e.waiting_us) + ",\"completed_us\":" + std::to_string(e.completed_us) +
           ",\"state\":\"" + (e.st == state::completed ? "completed" : e.st == state::failed ? "failed" : "issued") + "\"}";
    }
    return o + "]}\n";
  }

  mutable std::mutex mu_;
  bool enabled_ = true;
  std::vector<entry> ring_;
  std::uint64_t next_slot_ = 0;
  std::vector<channel> channels_;
  std::vector<watch> watches_;
  int process_rank_ = -1, process_size_ = 0;
  std::vector<int> peers_;
  std::atomic<bool> faulted_{false};
  std::string fault_message_;
  bool timeout_written_ = false, error_written_ = false;
  std::vector<std::pair<std::int64_t, std::int64_t>> stalls_;  // heartbeat gaps: (last tick, next tick)
};

//! The process's recorder.
[[nodiscard]] inline recorder& global() {
  static recorder r;
  return r;
}

}  // namespace trace
}  // namespace tessera::comm
