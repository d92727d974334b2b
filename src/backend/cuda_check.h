// CUDA error checks; included only by .cu files and CUDA-aware .cpp files.
#pragma once

#include <cuda_runtime.h>

#include "core/check.h"

#define OCTET_CUDA_CHECK(expr)                                                       \
  do {                                                                               \
    const cudaError_t octet_err_ = (expr);                                           \
    if (octet_err_ != cudaSuccess) {                                                 \
      OCTET_THROW("CUDA error in ", #expr, ": ", cudaGetErrorName(octet_err_), " (", \
                  cudaGetErrorString(octet_err_), ")");                              \
    }                                                                                \
  } while (0)

// After every kernel launch: catches bad launch configurations at the launch site.
#define OCTET_CUDA_CHECK_LAUNCH() OCTET_CUDA_CHECK(cudaGetLastError())
