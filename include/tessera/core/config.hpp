#pragma once
//! \file Compiler glue shared by every layer: the host/device annotation and
//! whether this translation unit is compiled by nvcc.

#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__
#define TESSERA_CUDA_COMPILER 1
#else
#define TESSERA_HOST_DEVICE
#define TESSERA_CUDA_COMPILER 0
#endif

//! Asks nvcc to unroll the next loop in device code; nothing for a host compiler.
#if defined(__CUDA_ARCH__)
#define TESSERA_UNROLL _Pragma("unroll")
#else
#define TESSERA_UNROLL
#endif
