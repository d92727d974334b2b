// A second stream for collectives that overlap the context's (compute) stream, ordered with events:
// ZeroAdamW's gradient reduce-scatter runs on it while the backward goes on.
//
// On CUDA: a non-blocking stream of the context's GPU and a pool of events. side_ctx() is a copy
// of the context whose `stream` is the side stream (a Comm enqueues on ctx.stream; the backend's
// copies and kernels stay on the compute stream, so only collectives may be called with it).
// On the CPU everything is inline and ordered already: the waits do nothing and side_ctx() is the
// context itself.
#pragma once

#include <memory>
#include <vector>

#include "core/context.h"

namespace octet {

class SideStream {
 public:
  explicit SideStream(const Context& ctx);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  bool overlaps() const { return stream_ != nullptr; }
  Context& side_ctx() { return side_; }

  // The side stream waits for the work enqueued on the compute stream so far.
  void side_waits_for_compute();
  // The compute stream waits for the work enqueued on the side stream so far.
  void compute_waits_for_side();
  // A mark on the side stream (its work so far), and the compute stream waiting for a mark: a
  // slot of staging memory the side stream reads is reused by the compute stream only after it.
  int mark_side();
  void compute_waits_for(int mark);

 private:
  void* record(void* stream);  // an event recorded on `stream`
  Context side_;
  void* stream_ = nullptr;     // cudaStream_t, null on the CPU
  void* compute_ = nullptr;    // the context's stream
  std::vector<void*> events_;  // cudaEvent_t, reused round robin
  size_t next_ = 0;
};

}  // namespace octet
