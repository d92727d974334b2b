#include <algorithm>
#include <cstdint>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "backend/cuda_graph.h"

namespace octet {
namespace {

// memset as a kernel (Backend::memset, memset_ranges). Memory is set in 16-byte slots: range i
// covers slots first_slot[i] .. first_slot[i + 1] - 1, slot k of it the 16 bytes from its start
// rounded down to 16 plus 16 k; a slot wholly inside the range takes one 16-byte store, one at
// either end its bytes inside the range. Grid-stride over all slots, the range of a thread's slot
// found by advancing from the previous one (slots only grow). The ranges travel in the kernel's
// parameters, sized for 1, 8 or 64 of them (a launch's parameters are copied with it: a lone
// memset does not carry room for 64).
constexpr int kFillMaxRanges = 64, kFillThreads = 256;

template <int kRanges>
struct FillBatch {
  uintptr_t begin[kRanges];
  uintptr_t end[kRanges];
  int64_t first_slot[kRanges + 1];
  int count;
};

template <int kRanges>
__global__ void __launch_bounds__(kFillThreads)
    fill_kernel(const __grid_constant__ FillBatch<kRanges> b, uint32_t word) {
  const int64_t total = b.first_slot[b.count];
  const uint4 v = make_uint4(word, word, word, word);
  int i = 0;
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * kFillThreads + threadIdx.x; s < total;
       s += static_cast<int64_t>(gridDim.x) * kFillThreads) {
    while (s >= b.first_slot[i + 1]) ++i;
    const uintptr_t a =
        (b.begin[i] & ~uintptr_t{15}) + 16 * static_cast<uintptr_t>(s - b.first_slot[i]);
    if (a >= b.begin[i] && a + 16 <= b.end[i]) {
      *reinterpret_cast<uint4*>(a) = v;
    } else {
      for (uintptr_t p = a < b.begin[i] ? b.begin[i] : a; p < a + 16 && p < b.end[i]; ++p)
        *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(word);
    }
  }
}

// fill_kernel over `count` ranges, at most kRanges, none empty.
template <int kRanges>
void launch_fill(const MemsetRange* ranges, int count, int byte, int sm_count,
                 cudaStream_t stream) {
  FillBatch<kRanges> b{};
  b.count = count;
  for (int i = 0; i < count; ++i) {
    b.begin[i] = reinterpret_cast<uintptr_t>(ranges[i].dst);
    b.end[i] = b.begin[i] + static_cast<uintptr_t>(ranges[i].bytes);
    const uintptr_t first = b.begin[i] & ~uintptr_t{15}, last = (b.end[i] + 15) & ~uintptr_t{15};
    b.first_slot[i + 1] = b.first_slot[i] + static_cast<int64_t>((last - first) / 16);
  }
  const int64_t blocks = std::min<int64_t>((b.first_slot[count] + kFillThreads - 1) / kFillThreads,
                                           int64_t{8} * sm_count);
  const uint32_t word = 0x01010101u * static_cast<uint8_t>(byte);
  fill_kernel<kRanges><<<static_cast<unsigned>(blocks), kFillThreads, 0, stream>>>(b, word);
  OCTET_CUDA_CHECK(cudaGetLastError());
}

void launch_fill(const MemsetRange* ranges, int count, int byte, int sm_count,
                 cudaStream_t stream) {
  if (count == 1) return launch_fill<1>(ranges, count, byte, sm_count, stream);
  if (count <= 8) return launch_fill<8>(ranges, count, byte, sm_count, stream);
  launch_fill<kFillMaxRanges>(ranges, count, byte, sm_count, stream);
}

class EventTimer final : public Timer {
 public:
  explicit EventTimer(cudaStream_t stream) : stream_(stream) {
    OCTET_CUDA_CHECK(cudaEventCreate(&start_));
    OCTET_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() override {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  void start() override { OCTET_CUDA_CHECK(cudaEventRecord(start_, stream_)); }
  double stop_ms() override {
    OCTET_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    OCTET_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    OCTET_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device_index) : device_index_(device_index) {
    OCTET_CUDA_CHECK(cudaSetDevice(device_index));
    OCTET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    OCTET_CUDA_CHECK(
        cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_index));
    // Keep freed blocks in the stream-ordered pool instead of returning them to the driver: the
    // pool then acts as a caching allocator and steady-state steps allocate without driver calls.
    cudaMemPool_t pool;
    OCTET_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_index));
    uint64_t threshold = UINT64_MAX;
    OCTET_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  Device device() const override { return Device::kCuda; }
  // The peak since reset_peak(): the sum of the pool's and the graphs' high-water marks (an upper
  // bound: the two may peak at different times), or higher, one reached before a release (below).
  int64_t peak_bytes() const override { return std::max(phase_peak_, highs()); }
  void reset_peak() override {
    phase_peak_ = 0;
    reset_highs();
  }
  // release_cached_device_memory (cuda_graph.h). Once the stream is idle no graph is running or
  // queued, so the trim takes every graph's working set; what is allocated stays.
  void release_cached() {
    OCTET_CHECK(!capturing_, "release_cached_device_memory: called inside a CUDA graph capture");
    ++host_waits_;
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
    phase_peak_ = std::max(phase_peak_, highs());
    if (cudaDeviceGraphMemTrim(device_index_) != cudaSuccess)
      cudaGetLastError();  // no graph memory
    cudaMemPool_t pool;
    OCTET_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_index_));
    OCTET_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
    // The high-water marks restart from what is held now; the earlier peak is in phase_peak_.
    reset_highs();
    ++releases_;
  }
  int64_t releases() const { return releases_; }
  void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row_bytes,
               int64_t rows) override {
    OCTET_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src,
                                       static_cast<size_t>(src_pitch),
                                       static_cast<size_t>(row_bytes), static_cast<size_t>(rows),
                                       cudaMemcpyDeviceToDevice, stream_));
  }
  void* alloc(int64_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaMallocAsync(&p, static_cast<size_t>(bytes), stream_);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      OCTET_THROW("out of GPU memory allocating ", bytes, " bytes (", free_b, " of ", total_b,
                  " bytes free)");
    }
    OCTET_CUDA_CHECK(err);
    if (capturing_) captured_.insert(p);
    return p;
  }
  void free(void* ptr) override {
    if (capturing_ && captured_.count(ptr) == 0) {
      deferred_.push_back(ptr);
      return;
    }
    cudaFreeAsync(ptr, stream_);
  }
  void set_capturing(bool on) {
    capturing_ = on;
    captured_.clear();
    if (on) return;
    for (void* p : deferred_) cudaFreeAsync(p, stream_);
    deferred_.clear();
  }
  int64_t available_bytes() const override {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return static_cast<int64_t>(free_b);
  }
  void copy(void* dst, const void* src, int64_t bytes, CopyKind kind) override {
    const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                             : kind == CopyKind::kHostToHost   ? cudaMemcpyHostToHost
                                                               : cudaMemcpyDeviceToDevice;
    OCTET_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), k, stream_));
    // Host sources may be freed right after the call and host destinations are read right after it.
    if (kind != CopyKind::kDeviceToDevice) {
      ++host_waits_;
      OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
  }
  void memset(void* dst, int byte, int64_t bytes) override {
    if (bytes <= 0) return;
    const MemsetRange r{dst, bytes};
    launch_fill(&r, 1, byte, sm_count_, stream_);
  }
  void memset_ranges(const std::vector<MemsetRange>& ranges, int byte) override {
    MemsetRange batch[kFillMaxRanges];
    int n = 0;
    for (const MemsetRange& r : ranges) {
      if (r.bytes <= 0) continue;
      batch[n++] = r;
      if (n == kFillMaxRanges) launch_fill(batch, n, byte, sm_count_, stream_), n = 0;
    }
    if (n > 0) launch_fill(batch, n, byte, sm_count_, stream_);
  }
  void synchronize() override {
    ++host_waits_;
    OCTET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void* stream() const override { return stream_; }
  std::unique_ptr<Timer> make_timer() override { return std::make_unique<EventTimer>(stream_); }

 private:
  int64_t highs() const {
    cudaMemPool_t pool;
    OCTET_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_index_));
    uint64_t high = 0, graphs = 0;
    OCTET_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
    // CUDA graphs (backend/cuda_graph.h) allocate from their own memory: counted too. (Best
    // effort: a device without graph memory reports nothing, which is not an error here.)
    if (cudaDeviceGetGraphMemAttribute(device_index_, cudaGraphMemAttrUsedMemHigh, &graphs) !=
        cudaSuccess) {
      cudaGetLastError();
      graphs = 0;
    }
    return static_cast<int64_t>(high + graphs);
  }
  void reset_highs() {
    cudaMemPool_t pool;
    OCTET_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_index_));
    uint64_t zero = 0;
    OCTET_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
    uint64_t zero_graphs = 0;
    if (cudaDeviceSetGraphMemAttribute(device_index_, cudaGraphMemAttrUsedMemHigh, &zero_graphs) !=
        cudaSuccess)
      cudaGetLastError();
  }

  int device_index_;
  int sm_count_ = 1;  // sizes memset's grid
  cudaStream_t stream_ = nullptr;
  int64_t phase_peak_ = 0;  // the peak before the last release since reset_peak()
  int64_t releases_ = 0;
  bool capturing_ = false;
  std::unordered_set<void*> captured_;  // allocated by the capture running now
  std::vector<void*> deferred_;         // freed during it, allocated before it
};

}  // namespace

bool cuda_built() {
  return true;
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: report zero GPUs, not an error
    return 0;
  }
  return n;
}

CudaDeviceInfo cuda_device_info(int device_index) {
  cudaDeviceProp p{};
  OCTET_CUDA_CHECK(cudaGetDeviceProperties(&p, device_index));
  CudaDeviceInfo info;
  info.name = p.name;
  info.sm_count = p.multiProcessorCount;
  info.major = p.major;
  info.minor = p.minor;
  info.total_memory = static_cast<int64_t>(p.totalGlobalMem);
  info.l2_bytes = p.l2CacheSize;
  cudaDriverGetVersion(&info.driver_version);
  cudaRuntimeGetVersion(&info.runtime_version);
  return info;
}

void set_backend_capturing(Backend& be, bool on) {
  if (auto* cuda = dynamic_cast<CudaBackend*>(&be)) cuda->set_capturing(on);
}

void release_cached_device_memory(Context& ctx) {
  if (auto* cuda = dynamic_cast<CudaBackend*>(&ctx.be())) cuda->release_cached();
}

int64_t device_memory_releases(const Context& ctx) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&ctx.be());
  return cuda ? cuda->releases() : 0;
}

std::shared_ptr<Backend> make_cuda_backend(int device_index) {
  return std::make_shared<CudaBackend>(device_index);
}

}  // namespace octet
