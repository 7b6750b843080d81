#pragma once
// Which GPU a rank uses and which communicator fits: one GPU per rank (local
// rank modulo the GPUs present); NCCL when every rank on the node has its own
// GPU, else MPI staged through host memory (NCCL refuses two ranks on one GPU).
// Shared by tessera-mlp-lm, tessera-gpt and tessera-bench-train.
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <string>

#include "tessera/backend/cuda/error.hpp"
#include "tessera/comm/mpi.hpp"

namespace trainer_kit {

struct gpu_placement {
  int local = 0, local_size = 1, gpus = 0, device = 0, sms = 0;
  [[nodiscard]] bool own_gpu() const noexcept { return local_size <= gpus; }
  //! "nccl" or "mpi" for a --comm of auto, nccl or mpi; nccl without a GPU per rank is an error.
  [[nodiscard]] std::string communicator(const std::string& requested) const {
    const std::string which = requested == "auto" ? (own_gpu() ? "nccl" : "mpi") : requested;
    TESSERA_CHECK(which != "nccl" || own_gpu(), "--comm nccl with ", local_size, " ranks on ", gpus,
                  " GPUs: NCCL needs a GPU per rank; use --comm mpi (staged through host memory)");
    return which;
  }
  //! SMs to shape GEMMs for: `requested` if positive; for -1, all but the
  //! CTAs NCCL may hold when collectives overlap compute (several ranks, a cap
  //! on NCCL's CTAs); otherwise 0 (all).
  [[nodiscard]] int gemm_sms(int requested, int nccl_ctas, int world) const {
    if (requested >= 0) return requested;
    return world > 1 && nccl_ctas > 0 && nccl_ctas < sms ? sms - nccl_ctas : 0;
  }
};

//! Selects this rank's GPU (collective over MPI_COMM_WORLD: it counts the ranks on this node).
inline gpu_placement place_on_gpu(int world_rank) {
  gpu_placement p;
  MPI_Comm node;
  TESSERA_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node));
  MPI_Comm_rank(node, &p.local);
  MPI_Comm_size(node, &p.local_size);
  MPI_Comm_free(&node);
  TESSERA_CHECK(cudaGetDeviceCount(&p.gpus) == cudaSuccess && p.gpus > 0,
                "no CUDA device is visible to this process (the CUDA backend needs one)");
  p.device = p.local % p.gpus;
  TESSERA_CUDA(cudaSetDevice(p.device));
  TESSERA_CUDA(cudaDeviceGetAttribute(&p.sms, cudaDevAttrMultiProcessorCount, p.device));
  return p;
}

}  // namespace trainer_kit
