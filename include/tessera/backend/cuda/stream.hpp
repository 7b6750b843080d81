#pragma once
//! \file Streams and events (RAII), and the compute stream tessera's CUDA
//! operations are ordered on. It defaults to the legacy default stream, so
//! kernels a trainer launches without a stream are ordered with the library's.
#include <cuda_runtime_api.h>

#include <memory>
#include <utility>
#include <vector>

#include "tessera/backend/cuda/error.hpp"

namespace tessera::cuda {

namespace detail {
inline cudaStream_t& current_stream_slot() noexcept {
  thread_local cudaStream_t s = nullptr;  // legacy default stream
  return s;
}
}  // namespace detail

//! The stream library operations on this thread run on.
[[nodiscard]] inline cudaStream_t current_stream() noexcept { return detail::current_stream_slot(); }
//! Sets it (the caller keeps the stream alive). Returns the previous one.
inline cudaStream_t set_current_stream(cudaStream_t s) noexcept { return std::exchange(detail::current_stream_slot(), s); }

//! Makes `s` the current stream until the end of the scope, then restores the
//! one before, on an exception too: work after a failed step or test case
//! must not be issued on a stream that may be gone.
class scoped_stream {
public:
  explicit scoped_stream(cudaStream_t s) noexcept : was_(set_current_stream(s)) {}
  ~scoped_stream() { set_current_stream(was_); }
  scoped_stream(const scoped_stream&) = delete;
  scoped_stream& operator=(const scoped_stream&) = delete;

private:
  cudaStream_t was_;
};

//! An owned non-blocking stream.
class stream {
public:
  stream() { TESSERA_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stream& operator=(stream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }
  void synchronize() const { TESSERA_CUDA(cudaStreamSynchronize(s_)); }

private:
  cudaStream_t s_ = nullptr;
};

//! An owned event without timing (cheap to record and wait on).
class event {
public:
  explicit event(bool timing = false) {
    TESSERA_CUDA(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  event& operator=(event&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() {
    if (e_) cudaEventDestroy(e_);
  }
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }
  void record(cudaStream_t s) { TESSERA_CUDA(cudaEventRecord(e_, s)); }
  //! Makes s wait (on the device) for the work this event recorded.
  void wait_on(cudaStream_t s) const { TESSERA_CUDA(cudaStreamWaitEvent(s, e_, 0)); }
  [[nodiscard]] bool done() const {
    const cudaError_t rc = cudaEventQuery(e_);
    if (rc == cudaErrorNotReady) return false;
    TESSERA_CUDA(rc);
    return true;
  }
  void synchronize() const { TESSERA_CUDA(cudaEventSynchronize(e_)); }

private:
  cudaEvent_t e_ = nullptr;
};

//! Completion events handed out for reuse: next() returns one that nobody
//! else holds (creating an event per use costs microseconds, as much as a
//! small collective). A holder keeps its event until it has waited on it;
//! cudaStreamWaitEvent takes the event's state when called, so re-recording
//! it afterwards is safe.
class event_pool {
public:
  [[nodiscard]] std::shared_ptr<event> next() {
    for (auto& e : pool_)
      if (e.use_count() == 1) return e;
    return pool_.emplace_back(std::make_shared<event>());
  }

private:
  std::vector<std::shared_ptr<event>> pool_;
};

}  // namespace tessera::cuda
