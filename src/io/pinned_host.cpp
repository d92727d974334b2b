// pinned_host.h: CUDA runtime calls when the build has CUDA and the context is a GPU's; plain host
// memory and immediate copies on the CPU.
#include "io/pinned_host.h"

#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "core/check.h"
#if OCTET_WITH_CUDA
#include "backend/cuda_check.h"
#endif

namespace octet::io {
namespace {

class DoneFence final : public StreamFence {
 public:
  void wait() override {}
};

#if OCTET_WITH_CUDA
class EventFence final : public StreamFence {
 public:
  explicit EventFence(cudaStream_t s) {
    OCTET_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    OCTET_CUDA_CHECK(cudaEventRecord(event_, s));
  }
  ~EventFence() override { cudaEventDestroy(event_); }
  void wait() override { OCTET_CUDA_CHECK(cudaEventSynchronize(event_)); }

 private:
  cudaEvent_t event_ = nullptr;
};
#endif

}  // namespace

PinnedBuffer::~PinnedBuffer() {
  release();
}

void PinnedBuffer::release() {
  if (data_ == nullptr) return;
#if OCTET_WITH_CUDA
  if (pinned_) {
    cudaFreeHost(data_);
    data_ = nullptr;
    return;
  }
#endif
  std::free(data_);
  data_ = nullptr;
}

void PinnedBuffer::reserve(Device device, int64_t bytes) {
  const bool want_pinned = device == Device::kCuda;
  if (data_ != nullptr && capacity_ >= bytes && pinned_ == want_pinned) return;
  release();
  capacity_ = 0;
  const int64_t n = std::max<int64_t>(bytes, 64);
#if OCTET_WITH_CUDA
  if (want_pinned) {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, static_cast<size_t>(n), cudaHostAllocDefault);
    if (err != cudaSuccess) {
      cudaGetLastError();
      OCTET_THROW("cannot allocate ", n, " bytes of page-locked host memory for a checkpoint ",
                  "snapshot: ", cudaGetErrorString(err));
    }
    data_ = static_cast<uint8_t*>(p);
    capacity_ = n;
    pinned_ = true;
    return;
  }
#endif
  OCTET_CHECK(!want_pinned, "pinned host memory: this octet was built without CUDA");
  data_ = static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>((n + 63) / 64 * 64)));
  OCTET_CHECK(data_ != nullptr, "cannot allocate ", n, " bytes of host memory for a checkpoint ",
              "snapshot");
  capacity_ = n;
  pinned_ = false;
}

void copy_to_host_async(Context& ctx, void* dst, const void* src, int64_t bytes) {
  if (bytes == 0) return;
  if (ctx.device == Device::kCpu) {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return;
  }
#if OCTET_WITH_CUDA
  OCTET_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                                   static_cast<cudaStream_t>(ctx.be().stream())));
#else
  OCTET_THROW("copy_to_host_async: this octet was built without CUDA");
#endif
}

std::shared_ptr<StreamFence> StreamFence::record(Context& ctx) {
#if OCTET_WITH_CUDA
  if (ctx.device == Device::kCuda)
    return std::make_shared<EventFence>(static_cast<cudaStream_t>(ctx.be().stream()));
#endif
  (void)ctx;
  return std::make_shared<DoneFence>();
}

}  // namespace octet::io
