#pragma once
//! \file The handler behind TESSERA_CUDA: a failed CUDA runtime call becomes a
//! tessera::error with the call, the cudaError_t and its text; the sticky
//! error state is read (and so cleared where it can be) when reported.
#include <cuda_runtime_api.h>

#include <string>

#include "tessera/core/error.hpp"

namespace tessera::detail {
[[noreturn]] inline void throw_cuda_error(cudaError_t rc, const char* call, ::tessera::source_location where) {
  (void)cudaGetLastError();
  throw error(std::string("CUDA call failed: ") + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc), call,
              static_cast<long long>(rc), where);
}
}  // namespace tessera::detail
