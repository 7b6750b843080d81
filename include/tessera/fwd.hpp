#pragma once
//! \file Declarations of the public class templates with their concepts, for
//! headers that name them without needing their definitions (a trainer's own
//! header that takes a FullyShardedDataParallel<Cfg>&, say). Pulls in only the
//! policy tags and the element types: no backend, communicator or CUDA header.
#include "tessera/backend/ops.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/optim/algorithms.hpp"
#include "tessera/policy/config.hpp"

namespace tessera {
struct unit_id;
struct param_id;
struct wrapper_options;
struct memory_plan;
struct optimizer_options;
struct step_result;
class unit_layout;

template <element_type T, backend_available Backend> class ShardedTensor;
template <config_type Cfg> class DistributedDataParallel;
template <config_type Cfg> class FullyShardedDataParallel;
template <config_type Cfg> class shard_view;
template <class Algorithm, class Wrapper> class ShardedOptimizer;

namespace comm {
class request;
template <class B> class handle;
}  // namespace comm
}  // namespace tessera
