#pragma once
//! \file host::pool: a fixed set of worker threads for element-wise host work
//! that must use every core (the optimizer's update of offloaded state). One
//! caller at a time (a second waits); the caller's thread takes a share too.
#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessera::host {

class pool {
public:
  //! `threads` in all, the caller's included (0: TESSERA_HOST_THREADS from
  //! the environment, else the hardware's concurrency).
  explicit pool(unsigned threads = 0) {
    if (threads == 0) {
      if (const char* e = std::getenv("TESSERA_HOST_THREADS")) threads = unsigned(std::max(1, std::atoi(e)));
      else threads = std::max(1u, std::thread::hardware_concurrency());
    }
    for (unsigned t = 1; t < threads; ++t) workers_.emplace_back([this, t] { work(t); });
  }
  pool(const pool&) = delete;
  pool& operator=(const pool&) = delete;
  ~pool() {
    {
      std::lock_guard g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  [[nodiscard]] unsigned size() const noexcept { return unsigned(workers_.size()) + 1; }

  //! Calls f(begin, end) over [0, n) cut into one range per thread, each a
  //! multiple of `grain` elements (the last takes the rest); returns when all
  //! are done. f must not throw.
  void parallel_for(std::size_t n, std::size_t grain, const std::function<void(std::size_t, std::size_t)>& f) {
    if (n == 0) return;
    std::lock_guard one(caller_);
    const std::size_t parts = std::min<std::size_t>(size(), (n + grain - 1) / grain);
    if (parts <= 1) return f(0, n);
    const std::size_t per = (n / parts + grain - 1) / grain * grain;
    {
      std::lock_guard g(m_);
      job_ = &f;
      n_ = n;
      per_ = per;
      parts_ = parts;
      pending_ = parts - 1;
      ++generation_;
    }
    cv_.notify_all();
    f(0, std::min(n, per));
    std::unique_lock g(m_);
    done_.wait(g, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

  //! One pool per process for the library's host work.
  static pool& shared() {
    static pool p;
    return p;
  }

private:
  void work(unsigned t) {
    unsigned long seen = 0;
    for (;;) {
      std::unique_lock g(m_);
      cv_.wait(g, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (t >= parts_) continue;
      const auto* f = job_;
      const std::size_t b = std::min(n_, t * per_), e = t + 1 == parts_ ? n_ : std::min(n_, (t + 1) * per_);
      g.unlock();
      if (b < e) (*f)(b, e);
      g.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex caller_, m_;
  std::condition_variable cv_, done_;
  const std::function<void(std::size_t, std::size_t)>* job_ = nullptr;
  std::size_t n_ = 0, per_ = 0, parts_ = 0, pending_ = 0;
  unsigned long generation_ = 0;
  bool stop_ = false;
};

}  // namespace tessera::host
