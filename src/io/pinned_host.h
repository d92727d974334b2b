// Host snapshots of device memory that do not stall the stream: page-locked host memory
// (cudaHostAlloc on CUDA; ordinary aligned memory on the CPU backend), copies into it enqueued on
// the context's stream (cudaMemcpyAsync; an immediate memcpy on the CPU), and a fence that a
// background thread waits on before it reads the copies. The copies are stream-ordered: they see
// every kernel enqueued before them and none after, so the step can go on enqueueing work while
// the snapshot is written out.
#pragma once

#include <cstdint>
#include <memory>

#include "core/context.h"

namespace octet::io {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  // At least `bytes` for `device`'s copies; keeps the current allocation when it is large enough
  // (allocated once for a run whose snapshots keep their size).
  void reserve(Device device, int64_t bytes);
  uint8_t* data() const { return data_; }
  int64_t capacity() const { return capacity_; }
  bool pinned() const { return pinned_; }  // page-locked (CUDA)

 private:
  void release();
  uint8_t* data_ = nullptr;
  int64_t capacity_ = 0;
  bool pinned_ = false;
};

// Enqueues a copy of `bytes` from ctx's device memory `src` into host memory `dst` (a
// PinnedBuffer's) on ctx's stream without waiting for it.
void copy_to_host_async(Context& ctx, void* dst, const void* src, int64_t bytes);

// A point on ctx's stream. wait() blocks the calling thread (any thread) until the work enqueued
// before it has completed. Made on the stream's thread; waited on anywhere.
class StreamFence {
 public:
  static std::shared_ptr<StreamFence> record(Context& ctx);
  virtual ~StreamFence() = default;
  virtual void wait() = 0;
};

}  // namespace octet::io
