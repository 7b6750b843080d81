#pragma once
//! \file Overlap for checkpoint I/O: a writer thread that puts queued buffers
//! into a file while the caller fills the next one (device copies,
//! checksums), and a small set of threads that run read tasks side by side
//! (several sequential streams keep a disk's queue full where one pread at a
//! time leaves it idle between requests). Errors of the threads reach the
//! caller as the tessera::error they raised.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "tessera/checkpoint/io.hpp"

namespace tessera::checkpoint {

//! Writes queued buffers to one out_file, in order, on its own thread.
//! write() returns a ticket at once; the buffer must stay unchanged until
//! wait(ticket) returned (or finish()). After a failed write the rest of the
//! queue is dropped and the error is rethrown by the next wait() or finish().
class background_writer {
public:
  explicit background_writer(out_file& f) : f_(f), thread_([this] { run(); }) {}
  background_writer(const background_writer&) = delete;
  background_writer& operator=(const background_writer&) = delete;
  //! Drops what is still queued (an error left it behind; finish() empties
  //! the queue on success) and returns once the write in progress ended.
  ~background_writer() {
    {
      std::lock_guard g(m_);
      stop_ = true;
      queue_.clear();
    }
    wake_.notify_all();
    thread_.join();
  }
  //! Queues n bytes at p; the ticket to wait for before p changes.
  std::uint64_t write(const void* p, std::size_t n) {
    std::lock_guard g(m_);
    queue_.push_back({p, n});
    wake_.notify_all();
    return ++issued_;
  }
  //! Returns once the write with this ticket (and every one before) is in the file.
  void wait(std::uint64_t ticket) {
    std::unique_lock g(m_);
    done_cv_.wait(g, [&] { return done_ >= ticket || error_; });
    if (error_) std::rethrow_exception(error_);
  }
  //! Every queued write is in the file.
  void finish() {
    std::uint64_t t;
    {
      std::lock_guard g(m_);
      t = issued_;
    }
    wait(t);
  }

private:
  struct job {
    const void* p;
    std::size_t n;
  };
  void run() {
    for (;;) {
      job j{};
      {
        std::unique_lock g(m_);
        wake_.wait(g, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        j = queue_.front();
      }
      std::exception_ptr err;
      try {
        f_.write(j.p, j.n);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard g(m_);
      if (!queue_.empty()) queue_.pop_front();  // emptied meanwhile only by the destructor
      if (err && !error_) error_ = err;
      if (error_) queue_.clear();
      ++done_;
      done_cv_.notify_all();
    }
  }
  out_file& f_;
  std::mutex m_;
  std::condition_variable wake_, done_cv_;
  std::deque<job> queue_;
  std::uint64_t issued_ = 0, done_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

//! How many read streams a load runs side by side: TESSERA_CHECKPOINT_READERS,
//! else 8 per host, shared among the ranks on it (the launcher's local size:
//! OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS or SLURM_NTASKS_PER_NODE), at
//! least 2 each. Disks, network file systems and page-cache copies all gain
//! from a deeper queue, to a point: more streams than that seek between them.
[[nodiscard]] inline unsigned reader_threads() {
  if (const char* e = std::getenv("TESSERA_CHECKPOINT_READERS")) return unsigned(std::clamp(std::atoi(e), 1, 64));
  int local = 1;
  for (const char* k : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* v = std::getenv(k); v && std::atoi(v) > 0) {
      local = std::atoi(v);
      break;
    }
  return unsigned(std::max(2, 8 / local));
}

//! Runs task(i) for i in [0, n) on up to `threads` threads (the caller's
//! included), each taking the next index as it finishes one. Once a task
//! throws no new one starts; the first error is rethrown after all stopped.
inline void run_tasks(std::size_t n, unsigned threads, const std::function<void(std::size_t)>& task) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first;
  std::mutex m;
  auto work = [&] {
    for (std::size_t i; !failed.load() && (i = next.fetch_add(1)) < n;) {
      try {
        task(i);
      } catch (...) {
        std::lock_guard g(m);
        if (!first) first = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  const std::size_t extra = std::min<std::size_t>(n, std::max(1u, threads)) - (n > 0 ? 1 : 0);
  for (std::size_t t = 0; t < extra; ++t) {
    try {
      pool.emplace_back(work);
    } catch (...) {
      break;  // no more threads to be had: the ones started do the work
    }
  }
  work();
  for (auto& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace tessera::checkpoint
