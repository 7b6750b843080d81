#pragma once
//! \file step_graph<Optimizer>: the steady-state training step as one CUDA
//! graph, launched once per step instead of a hundred-odd kernels, copies and
//! collectives issued one by one.
//!
//! What is captured, and why there: step k's graph holds the updates of step
//! k - 1 (ShardedOptimizer::apply), step k's forward and backward (the
//! caller's callable) and step k's decision (ShardedOptimizer::decide). The
//! updates are issued on side streams and waited for by each unit's next use
//! in the forward, so they stay in the forward's shadow inside one graph;
//! cutting the graph after the updates would leave them unjoined at its end.
//! Nothing in it changes from step to step: the learning rate, the step
//! number and the algorithm's scalars are chosen on the device from the
//! host's ring (optim/global_norm.hpp), the clip coefficient and the skip are
//! decided there, and the caller stages its inputs in fixed device memory
//! before step().
//!
//! The first steps run eagerly (two by default: first-use set-up such as
//! cuBLASLt's choices and the trainer's fusion timing, some of which waits
//! for a first fresh gradient write in the second step), the last of them
//! leaving its updates for the next, which is captured and launched; later
//! steps launch the same graph. The graph's
//! results equal the eager step's bit for bit (the same kernels on the same
//! buffers in the same order), which the GPU checks compare (the trainer's
//! dumped weights, and test-strategies-cuda's step_graph cases). finish() applies
//! the last decided step: call it before the weights are read or saved (a
//! checkpoint refuses a step half done) and at the end; the next step() then
//! runs eagerly and replays resume after it.
//!
//! Limits (each a clear error at construction):
//! - one rank: with several, a step's gather and reduction pools keep
//!   completion events across steps that a capture cannot wait on, and a
//!   collective inside a replayed graph is not held to the watchdog's
//!   deadline (nccl.hpp notes captured collectives as complete);
//! - an algorithm with step_scalars (adamw and sgd have them);
//! - a current stream other than the legacy default one.
#include <cstddef>
#include <string>
#include <utility>

#include "tessera/backend/cuda/graph.hpp"
#include "tessera/backend/cuda/stream.hpp"
#include "tessera/optim/sharded_optimizer.hpp"

namespace tessera {

template <class Opt>
class step_graph {
  using B = typename Opt::wrapper_type::backend_type;
  static_assert(std::is_same_v<B, backend::cuda>, "tessera: step_graph captures CUDA work; it needs the CUDA backend");

public:
  //! `enabled` false: step() is fb() then the optimizer's step(), eagerly.
  //! The first `eager_steps` steps (at least 1) run eagerly: set-up that a
  //! caller does on a first use (a timing that picks a kernel, a first
  //! write) must be over before the capture, which cannot synchronise.
  explicit step_graph(Opt& opt, bool enabled = true, int eager_steps = 2)
      : opt_(opt), on_(enabled), eager_(eager_steps) {
    TESSERA_CHECK(eager_steps >= 1, "step_graph: eager_steps ", eager_steps, " (at least the first step runs eagerly)");
    if (!on_) return;
    if constexpr (!Opt::capturable)
      ::tessera::detail::fail("step graphs need an optimizer algorithm with step_scalars (optim/algorithms.hpp); " +
                              std::string(Opt::algorithm_type::name) + " has none");
    const auto e = opt.shards();
    TESSERA_CHECK(e.world() == 1 && e.replicas() == 1, "step graphs run on one rank for now (this world has ",
                  e.world() * e.replicas(), "): turn them off for several ranks");
    TESSERA_CHECK(cuda::current_stream() != nullptr,
                  "step graphs cannot capture the legacy default stream; make another stream current first");
  }
  step_graph(const step_graph&) = delete;
  step_graph& operator=(const step_graph&) = delete;

  //! One training step whose forward and backward fb() issues (every
  //! micro-batch, from inputs already in fixed device memory; no host
  //! synchronisation). Returns the step's handle, as the optimizer's step().
  template <class FB>
  step_handle<B> step(FB&& fb) {
    if (!on_) {
      fb();
      return opt_.step();
    }
    if (!opt_.decided()) {  // the first step, or the first after finish(): eagerly, its updates left for the next
      fb();
      ++eager_run_;
      return opt_.decide();
    }
    if (!graph_ && eager_run_ < eager_) {  // warm-up: the same step as the graph's, issued eagerly
      opt_.apply();
      fb();
      ++eager_run_;
      return opt_.decide();
    }
    if (!graph_) {
      // What came before has finished, so no event recorded outside the
      // capture is still pending when the captured work waits on it.
      TESSERA_CUDA(cudaDeviceSynchronize());
      (void)opt_.steps();  // every decision read, so the captured decide() queries no event
      step_handle<B> h;
      try {
        graph_.capture([&] {
          opt_.apply();
          fb();
          h = opt_.decide();
        });
      } catch (const error& x) {
        ::tessera::detail::fail(std::string("step graph: capturing the step failed (") + x.what() +
                                "); the step's host state is lost: run without step graphs");
      }
      graph_.launch();
      opt_.mark();
      ++launches_;
      return h;
    }
    auto h = opt_.replay_decide();
    graph_.launch();
    opt_.mark();
    ++launches_;
    return h;
  }
  //! Applies the last decided step (its updates, the publication, zeroed
  //! gradients), so the weights are this step's. Idempotent.
  void finish() {
    if (on_ && opt_.decided()) opt_.apply();
  }
  [[nodiscard]] bool enabled() const noexcept { return on_; }
  //! Whether the step has been captured, and its graph's size.
  [[nodiscard]] bool captured() const noexcept { return bool(graph_); }
  [[nodiscard]] std::size_t nodes() const noexcept { return graph_.nodes(); }
  //! Graph launches so far.
  [[nodiscard]] long launches() const noexcept { return launches_; }

private:
  Opt& opt_;
  bool on_;
  int eager_, eager_run_ = 0;
  cuda::graph graph_;
  long launches_ = 0;
};

}  // namespace tessera
