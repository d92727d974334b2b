// Context: the explicit carrier of everything an op needs to run (no globals below tools/).
//
// It owns the backend (allocator, stream, copies) for one device. Ops take `Context&` first and run
// on its stream; host work runs inline. Library handles (cuBLASLt, NCCL) live here as opaque
// pointers so that this header stays free of CUDA includes.
#pragma once

#include <memory>

#include "core/tensor.h"

namespace octet {

class Backend;
struct GemmState;       // ops/gemm: cuBLASLt handle, workspace and plan cache, made on first use
struct AttentionState;  // ops/attention: cuDNN handle and graph cache, made on first use
class Comm;             // dist/comm.h: this rank's communicator (NCCL or in-process); null alone
struct CastCounter;     // core/cast_counter.h: BF16/FP32 <-> FP8 conversions, when counting

struct Context {
  Device device = Device::kCpu;
  int device_index = 0;
  std::shared_ptr<Backend> backend;
  void* stream = nullptr;  // cudaStream_t for Device::kCuda, null on the CPU
  std::shared_ptr<GemmState> gemm;
  std::shared_ptr<AttentionState> attention;
  std::shared_ptr<Comm> comm;
  std::shared_ptr<CastCounter> casts;  // null: not counting (core/cast_counter.h)

  Backend& be() const {
    OCTET_CHECK(backend, "context has no backend");
    return *backend;
  }
  void synchronize() const;
};

// backend/backend.h make_context creates one for a device.

}  // namespace octet
