#pragma once
//! \file Backend tags: where buffers live and kernels run. The implementations
//! live in backend/host and backend/cuda; these tags are all a policy needs.
#include <string_view>

namespace tessera::backend {

//! CPU buffers, loops on the calling thread, MPI for communication.
struct host {
  using tessera_backend = void;
  static constexpr std::string_view name = "host";
};
//! Device buffers, CUDA kernels and cuBLAS, NCCL (or MPI staged) for communication.
struct cuda {
  using tessera_backend = void;
  static constexpr std::string_view name = "cuda";
};

}  // namespace tessera::backend

namespace tessera {
//! A tessera backend tag.
template <class B>
concept backend_policy = requires { typename B::tessera_backend; };
}  // namespace tessera
