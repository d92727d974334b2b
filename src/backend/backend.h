// Backends: the implementations of the Backend interface (core/backend_interface.h) and the
// contexts that carry them.
//
// Implementations: CpuBackend (aligned host memory, inline copies) and CudaBackend (stream-ordered
// cudaMallocAsync pool on the context's stream). Nothing here includes CUDA headers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/backend_interface.h"
#include "core/context.h"

namespace octet {

std::shared_ptr<Backend> make_cpu_backend();

// GPU facts for `octet info` and for kernels that size grids from them.
struct CudaDeviceInfo {
  std::string name;
  int sm_count = 0;
  int major = 0;
  int minor = 0;
  int64_t total_memory = 0;
  int64_t l2_bytes = 0;
  int driver_version = 0;
  int runtime_version = 0;
};

// True when this build has CUDA and at least one GPU is visible.
bool cuda_built();
int cuda_device_count();
CudaDeviceInfo cuda_device_info(int device_index);
std::shared_ptr<Backend> make_cuda_backend(int device_index);

// Creates a context for the device; throws if CUDA was not built in or no GPU is present.
Context make_context(Device device, int device_index = 0);

}  // namespace octet
