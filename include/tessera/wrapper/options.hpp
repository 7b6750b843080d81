#pragma once
//! \file Run-time options of the data-parallel wrappers and the handles they hand out.
#include <cstddef>
#include <span>

namespace tessera {

struct wrapper_options {
  //! Each tensor starts on a multiple of this many elements; shards are multiples of it.
  std::size_t alignment = 16;
  //! Gathered-weight buffers for optim_grads_params (2 = double buffering: one
  //! in use, one being prefetched).
  int gather_buffers = 2;
  //! Full-size gradient / wire buffers that reductions in flight may hold.
  int grad_buffers = 2;
  //! Start the next unit's all-gather when a unit is gathered (optim_grads_params).
  bool prefetch = true;
  //! Reduced gradient shards (optim, optim_grads, optim_grads_params) live in
  //! memory the caller lends per unit (lend_grad_shard) instead of the
  //! wrapper's own. For trainers whose activations of a unit are dead from that
  //! unit's gradient reduction until the next forward: the shards then cost no
  //! memory of their own (PyTorch FSDP2 gets this from its caching allocator,
  //! which frees gradients between steps). The lent memory holds one
  //! micro-batch's reduction, so optim_grads and optim_grads_params then take
  //! one micro-batch per step.
  bool lend_grad_shards = false;
  //! Fraction (0-1) of the optimizer's elements whose main weights and
  //! optimizer state live in host memory (pinned on CUDA; memory_of<host_resident>()
  //! counts them) instead of the device: whole units, the last ones first,
  //! until at least this fraction is offloaded (detail::offloaded_units). The
  //! last units first because their gradients are final first in backward
  //! and their weights are needed last in the next forward, which gives their
  //! updates the most time. ShardedOptimizer updates them on the CPU or
  //! across PCIe (optimizer_options::offload_update). Where the main weights
  //! are the compute weights (full_precision) only the optimizer state moves.
  double offload_optimizer = 0.0;
  //! Debugging aid, for tests and debug builds (also TESSERA_POISON=1 in the
  //! environment): memory the wrapper takes back is filled with NaN and
  //! checked when it is reused, so misuse shows at once instead of as
  //! plausible numbers: a gathered unit's weights after its scope is released
  //! (optim_grads_params; the cached copy is dropped), and a gradient span
  //! written after its unit's reduce_grads (optim_grads, optim_grads_params;
  //! a tessera::error when the reduction completes or the buffer is reused).
  //! Costs a copy to the host and a checksum per reduction, and re-gathers.
  bool poison_released = false;
};

//! A registered unit.
struct unit_id {
  int index = -1;
  friend bool operator==(unit_id, unit_id) = default;
};
//! A registered parameter: its unit and its index in the unit.
struct param_id {
  int unit = -1;
  int index = -1;
  friend bool operator==(param_id, param_id) = default;
};

//! A unit's gradients for a writer (unit_scope::grads_for_write).
template <class G>
struct grad_target {
  std::span<G> grads;  //!< the whole padded unit
  bool fresh;          //!< true: holds no gradient yet this step; assign every element, do not accumulate
};

//! Bytes of model state a wrapper (plus optimizer) holds per rank.
//! (total(): the backend's memory; host_main_weights: offloaded main weights
//! in host memory, wrapper_options::offload_optimizer.)
struct memory_plan {
  std::size_t compute_weights = 0, main_weights = 0, grads = 0, gathered_buffers = 0, reduction_buffers = 0,
              optimizer_state = 0, host_main_weights = 0;
  [[nodiscard]] std::size_t total() const noexcept {
    return compute_weights + main_weights + grads + gathered_buffers + reduction_buffers + optimizer_state;
  }
};

}  // namespace tessera
