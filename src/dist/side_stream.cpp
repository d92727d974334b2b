#include "dist/side_stream.h"

#include "core/check.h"

#if OCTET_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace octet {

namespace {
// Events in the pool: a mark is waited on within a few bucket issues (two staging slots, two
// events per issue), long before the pool comes round to it again.
constexpr size_t kEvents = 64;
}  // namespace

#if OCTET_WITH_CUDA

namespace {
void cuda_ok(cudaError_t e, const char* what) {
  OCTET_CHECK(e == cudaSuccess, "side stream: ", what, ": ", cudaGetErrorString(e));
}
}  // namespace

SideStream::SideStream(const Context& ctx) : side_(ctx) {
  if (ctx.device != Device::kCuda) return;
  cuda_ok(cudaSetDevice(ctx.device_index), "cudaSetDevice");
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  stream_ = s;
  compute_ = ctx.stream;
  side_.stream = s;
  for (size_t i = 0; i < kEvents; ++i) {
    cudaEvent_t e = nullptr;
    cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    events_.push_back(e);
  }
}

SideStream::~SideStream() {
  if (!stream_) return;
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void* SideStream::record(void* stream) {
  void* e = events_[next_];
  next_ = (next_ + 1) % events_.size();
  cuda_ok(cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(stream)),
          "cudaEventRecord");
  return e;
}

void SideStream::side_waits_for_compute() {
  if (!stream_) return;
  cuda_ok(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_),
                              static_cast<cudaEvent_t>(record(compute_)), 0),
          "cudaStreamWaitEvent");
}

void SideStream::compute_waits_for_side() {
  if (!stream_) return;
  cuda_ok(cudaStreamWaitEvent(static_cast<cudaStream_t>(compute_),
                              static_cast<cudaEvent_t>(record(stream_)), 0),
          "cudaStreamWaitEvent");
}

int SideStream::mark_side() {
  if (!stream_) return -1;
  const int at = static_cast<int>(next_);
  record(stream_);
  return at;
}

void SideStream::compute_waits_for(int mark) {
  if (!stream_ || mark < 0) return;
  cuda_ok(cudaStreamWaitEvent(static_cast<cudaStream_t>(compute_),
                              static_cast<cudaEvent_t>(events_[static_cast<size_t>(mark)]), 0),
          "cudaStreamWaitEvent");
}

#else  // the CPU build: everything runs inline

SideStream::SideStream(const Context& ctx) : side_(ctx) {
  static_cast<void>(kEvents);
}
SideStream::~SideStream() = default;
void* SideStream::record(void*) {
  return nullptr;
}
void SideStream::side_waits_for_compute() {}
void SideStream::compute_waits_for_side() {}
int SideStream::mark_side() {
  return -1;
}
void SideStream::compute_waits_for(int) {}

#endif

}  // namespace octet
