#pragma once
//! \file The umbrella header: the wrappers, the optimizer, the communicators,
//! the shards and the memory planner for the backends this translation unit
//! can see. Checkpoints (tessera/checkpoint/checkpoint.hpp, which needs
//! nlohmann_json), step graphs (tessera/optim/step_graph.cuh) and the
//! step-time planner (tessera/plan/schedule.hpp, cost.hpp) are included on
//! their own. The CUDA backend and NCCL are included only when compiled by
//! nvcc (or with TESSERA_WITH_CUDA defined), so a host-only program never sees
//! a CUDA header.
#include "tessera/fwd.hpp"
#include "tessera/core/config.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/fp8.hpp"
#include "tessera/core/fp8_scaling.hpp"
#include "tessera/core/hash.hpp"
#include "tessera/core/random.hpp"
#include "tessera/core/shape.hpp"
#include "tessera/policy/policy.hpp"
#include "tessera/backend/convert.hpp"
#include "tessera/backend/memory.hpp"
#include "tessera/backend/ops.hpp"
#include "tessera/backend/host/buffer.hpp"
#include "tessera/backend/host/ops.hpp"
#include "tessera/comm/communicator.hpp"
#include "tessera/comm/local.hpp"
#include "tessera/comm/mesh.hpp"
#include "tessera/comm/staged.hpp"
#if !defined(TESSERA_NO_MPI)
#include "tessera/comm/mpi.hpp"
#endif
#include "tessera/shard/layout.hpp"
#include "tessera/shard/row_copy.hpp"
#include "tessera/shard/sharded_tensor.hpp"
#include "tessera/shard/fp8_gather.hpp"
#include "tessera/shard/tp_split.hpp"
#include "tessera/wrapper/data_parallel.hpp"
#include "tessera/wrapper/shard_view.hpp"
#include "tessera/optim/algorithms.hpp"
#include "tessera/optim/sharded_optimizer.hpp"
#include "tessera/plan/memory.hpp"
#if TESSERA_CUDA_COMPILER || defined(TESSERA_WITH_CUDA)
#include "tessera/backend/cuda/blas.hpp"
#include "tessera/backend/cuda/ops.cuh"
#include "tessera/comm/mpi_device.hpp"
#if __has_include(<nccl.h>)
#include "tessera/comm/nccl.hpp"
#endif
#endif
