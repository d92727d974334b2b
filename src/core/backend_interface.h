// The Backend interface: what a device provides to tensors and ops (memory, copies, ordering).
// Context (core/context.h) carries one, Tensor allocates from it; the implementations and
// make_context live in backend/ (backend/backend.h), above core. Nothing here includes CUDA
// headers.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace octet {

// Elapsed time of work submitted between start() and stop_ms(): CUDA events on the backend's stream
// for the GPU (stop_ms waits for the work), the host's steady clock for the CPU.
class Timer {
 public:
  virtual ~Timer() = default;
  virtual void start() = 0;
  virtual double stop_ms() = 0;
};

enum class CopyKind : uint8_t { kHostToHost, kHostToDevice, kDeviceToHost, kDeviceToDevice };

// `bytes` bytes from `dst`, memory of the backend's device: one of memset_ranges' spans.
struct MemsetRange {
  void* dst = nullptr;
  int64_t bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual void* alloc(int64_t bytes) = 0;
  virtual void free(void* ptr) = 0;
  // Asynchronous on the backend's stream, except device-to-host which completes before returning.
  virtual void copy(void* dst, const void* src, int64_t bytes, CopyKind kind) = 0;
  // Asynchronous on the stream like a device-to-device copy. CUDA sets memory with a kernel of its
  // own, not cudaMemsetAsync: in a captured graph a memset node delays the kernel after it by a
  // few microseconds, a kernel node does not.
  virtual void memset(void* dst, int byte, int64_t bytes) = 0;
  // Every range set to `byte`, as memset() on each would: on CUDA one launch for up to 64 ranges
  // (the trainer zeroes its gradients, a hundred tensors, with it); here memset() on each.
  virtual void memset_ranges(const std::vector<MemsetRange>& ranges, int byte) {
    for (const MemsetRange& r : ranges)
      if (r.bytes > 0) memset(r.dst, byte, r.bytes);
  }
  // `rows` rows of `row_bytes` each, from src (rows `src_pitch` bytes apart) to dst (`dst_pitch`
  // apart), on the same device; asynchronous on the stream like a device-to-device copy.
  virtual void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                       int64_t row_bytes, int64_t rows) = 0;
  virtual void synchronize() = 0;
  virtual void* stream() const { return nullptr; }
  virtual std::unique_ptr<Timer> make_timer() = 0;
  // High-water mark of memory in use since the last reset_peak(): the stream-ordered pool's
  // (CUDA), or the process's peak resident set (CPU, which cannot be reset).
  virtual int64_t peak_bytes() const { return 0; }
  virtual void reset_peak() {}
  // Memory a new allocation could still get: the GPU's free memory (CUDA), or the kernel's estimate
  // of what the host can give without swapping, MemAvailable (CPU). -1 when unknown. Checked
  // against a run's estimate before its first large allocation.
  virtual int64_t available_bytes() const { return -1; }
  // Times the host has waited for the device: synchronize(), and copies that complete before
  // returning (to or from host memory). Counted on CUDA, 0 on the CPU; tests use it to prove that a
  // piece of the step never waits.
  int64_t host_waits() const { return host_waits_; }

 protected:
  int64_t host_waits_ = 0;
};

}  // namespace octet
