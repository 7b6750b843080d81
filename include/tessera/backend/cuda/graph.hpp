#pragma once
//! \file cuda::graph: the work a callable issues on the current stream,
//! captured once into a CUDA graph and launched again as one operation.
//!
//! Capture is thread-local (cudaStreamCaptureModeThreadLocal), so other
//! threads (the watchdog polling collectives, the driver's callback thread)
//! go on calling CUDA while this one captures. Work reached from the stream
//! through events (side streams, a communicator's stream) joins the capture
//! and must join back before it ends; a host synchronisation, a query of a
//! captured event or a wait on an event recorded outside the capture fails
//! the capture with CUDA's error, which capture() throws.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "tessera/backend/cuda/error.hpp"
#include "tessera/backend/cuda/stream.hpp"
#include "tessera/core/error.hpp"

namespace tessera::cuda {

class graph {
public:
  graph() = default;
  graph(graph&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)), nodes_(o.nodes_) {}
  graph& operator=(graph&& o) noexcept {
    std::swap(exec_, o.exec_);
    std::swap(nodes_, o.nodes_);
    return *this;
  }
  graph(const graph&) = delete;
  graph& operator=(const graph&) = delete;
  ~graph() { reset(); }

  //! Captures what f() issues on the current stream and instantiates it.
  //! Nothing f() issues runs now: launch() runs it.
  template <class F>
  void capture(F&& f) {
    reset();
    const cudaStream_t s = current_stream();
    TESSERA_CHECK(s != nullptr, "a CUDA graph cannot capture the legacy default stream; make another stream current "
                  "(tessera::cuda::set_current_stream)");
    TESSERA_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    try {
      f();
    } catch (...) {
      cudaGraph_t dropped = nullptr;
      (void)cudaStreamEndCapture(s, &dropped);  // the capture is void; its error, if any, is f()'s
      if (dropped) cudaGraphDestroy(dropped);
      (void)cudaGetLastError();
      throw;
    }
    cudaGraph_t g = nullptr;
    TESSERA_CUDA(cudaStreamEndCapture(s, &g));
    std::size_t n = 0;
    const cudaError_t counted = cudaGraphGetNodes(g, nullptr, &n);
    const cudaError_t made = cudaGraphInstantiate(&exec_, g, 0);
    cudaGraphDestroy(g);
    TESSERA_CUDA(counted);
    TESSERA_CUDA(made);
    nodes_ = n;
  }
  //! Runs the captured work on the current stream, after the work issued before.
  void launch() const {
    TESSERA_CHECK(exec_ != nullptr, "cuda::graph::launch() before capture()");
    TESSERA_CUDA(cudaGraphLaunch(exec_, current_stream()));
  }
  [[nodiscard]] explicit operator bool() const noexcept { return exec_ != nullptr; }
  //! Nodes (kernels, copies, event records and waits, collectives) in the graph.
  [[nodiscard]] std::size_t nodes() const noexcept { return nodes_; }
  void reset() noexcept {
    if (exec_) cudaGraphExecDestroy(exec_);
    exec_ = nullptr;
    nodes_ = 0;
  }

private:
  cudaGraphExec_t exec_ = nullptr;
  std::size_t nodes_ = 0;
};

}  // namespace tessera::cuda
