// CUDA graphs and pinned uploads (cuda_graph.h).
#include <cstring>
#include <exception>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "backend/cuda_graph.h"

namespace octet {

bool cuda_graphs_supported(const Context& ctx) {
  return ctx.device == Device::kCuda && ctx.stream != nullptr;
}

struct CudaGraph::Impl {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Impl() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

CudaGraph::CudaGraph() = default;
CudaGraph::~CudaGraph() = default;
CudaGraph::CudaGraph(CudaGraph&&) noexcept = default;
CudaGraph& CudaGraph::operator=(CudaGraph&&) noexcept = default;

void CudaGraph::capture(Context& ctx, const char* what, const std::function<void()>& body) {
  reset();
  OCTET_CHECK(cuda_graphs_supported(ctx), "CUDA graph capture of ", what, ": needs a CUDA context");
  auto s = static_cast<cudaStream_t>(ctx.stream);
  OCTET_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  set_backend_capturing(ctx.be(), true);
  cudaGraph_t g = nullptr;
  try {
    body();
  } catch (const std::exception& e) {
    cudaStreamEndCapture(s, &g);
    set_backend_capturing(ctx.be(), false);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();  // the capture's own error is reported below, not by the next launch
    OCTET_THROW("CUDA graph capture of ", what, ": ", e.what());
  }
  const cudaError_t end = cudaStreamEndCapture(s, &g);
  set_backend_capturing(ctx.be(), false);
  if (end != cudaSuccess || g == nullptr) {
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    OCTET_THROW("CUDA graph capture of ", what, ": ", cudaGetErrorName(end), " (",
                cudaGetErrorString(end),
                "): something in it waited for the device or called an API a capture forbids");
  }
  auto impl = std::make_unique<Impl>();
  impl->graph = g;
  // Auto-free: outputs the body left allocated are freed and re-made (same address) per replay.
  OCTET_CUDA_CHECK(
      cudaGraphInstantiateWithFlags(&impl->exec, g, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  size_t n = 0;
  OCTET_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  nodes_ = static_cast<int64_t>(n);
  impl_ = std::move(impl);
}

void CudaGraph::replay(Context& ctx) {
  OCTET_CHECK(impl_, "CUDA graph replay: nothing captured");
  OCTET_CUDA_CHECK(cudaGraphLaunch(impl_->exec, static_cast<cudaStream_t>(ctx.stream)));
  ++replays_;
}

bool CudaGraph::captured() const {
  return impl_ != nullptr;
}

void CudaGraph::reset() {
  impl_.reset();
  nodes_ = 0;
}

struct PinnedUploader::Impl {
  struct Slot {
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t done = nullptr;
    bool used = false;
  };
  std::vector<Slot> slots;
  size_t next = 0;
};

PinnedUploader::PinnedUploader(Context& ctx, int slots) : impl_(std::make_unique<Impl>()) {
  OCTET_CHECK(slots >= 1, "pinned uploader: slots must be >= 1, got ", slots);
  impl_->slots.resize(static_cast<size_t>(slots));
  if (ctx.device != Device::kCuda) return;
  for (Impl::Slot& s : impl_->slots)
    OCTET_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
}

PinnedUploader::~PinnedUploader() {
  for (Impl::Slot& s : impl_->slots) {
    if (s.done) {
      cudaEventSynchronize(s.done);
      cudaEventDestroy(s.done);
    }
    if (s.host) cudaFreeHost(s.host);
  }
}

void PinnedUploader::upload(Context& ctx, const Tensor& dst, const Tensor& src) {
  OCTET_CHECK(
      src.device() == Device::kCpu && dst.device() == ctx.device && dst.nbytes() == src.nbytes(),
      "pinned upload: expected a host source and a device destination of ", src.nbytes(),
      " bytes, got ", dst.nbytes());
  const auto bytes = static_cast<size_t>(src.nbytes());
  if (bytes == 0) return;
  if (ctx.device != Device::kCuda) {
    std::memcpy(dst.data(), src.data(), bytes);
    return;
  }
  Impl::Slot& s = impl_->slots[impl_->next];
  impl_->next = (impl_->next + 1) % impl_->slots.size();
  if (s.used && cudaEventQuery(s.done) == cudaErrorNotReady) {
    ++waits_;
    OCTET_CUDA_CHECK(cudaEventSynchronize(s.done));
  }
  cudaGetLastError();  // cudaEventQuery's cudaErrorNotReady is not an error of the next launch
  if (s.capacity < bytes) {
    if (s.host) OCTET_CUDA_CHECK(cudaFreeHost(s.host));
    s.host = nullptr;
    OCTET_CUDA_CHECK(cudaMallocHost(&s.host, bytes));
    s.capacity = bytes;
  }
  std::memcpy(s.host, src.data(), bytes);
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  OCTET_CUDA_CHECK(cudaMemcpyAsync(dst.data(), s.host, bytes, cudaMemcpyHostToDevice, stream));
  OCTET_CUDA_CHECK(cudaEventRecord(s.done, stream));
  s.used = true;
}

struct PinnedReadback::Impl {
  struct Slot {
    std::vector<uint8_t> plain;  // the CPU's
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t done = nullptr;
    bool pending = false;
  };
  std::vector<Slot> slots;
  bool cuda = false;
};

PinnedReadback::PinnedReadback(Context& ctx, int slots) : impl_(std::make_unique<Impl>()) {
  OCTET_CHECK(slots >= 1, "pinned readback: slots must be >= 1, got ", slots);
  impl_->slots.resize(static_cast<size_t>(slots));
  impl_->cuda = ctx.device == Device::kCuda;
  if (!impl_->cuda) return;
  for (Impl::Slot& s : impl_->slots)
    OCTET_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
}

PinnedReadback::~PinnedReadback() {
  for (Impl::Slot& s : impl_->slots) {
    if (s.done) {
      cudaEventSynchronize(s.done);
      cudaEventDestroy(s.done);
    }
    if (s.host) cudaFreeHost(s.host);
  }
}

void PinnedReadback::read(Context& ctx, int slot, const std::vector<Tensor>& srcs) {
  OCTET_CHECK(slot >= 0 && static_cast<size_t>(slot) < impl_->slots.size(),
              "pinned readback: no slot ", slot);
  Impl::Slot& s = impl_->slots[static_cast<size_t>(slot)];
  size_t bytes = 0;
  for (const Tensor& t : srcs) {
    OCTET_CHECK(t.device() == ctx.device,
                "pinned readback: a tensor is not on the context's device");
    bytes += static_cast<size_t>(t.nbytes());
  }
  if (!impl_->cuda) {
    s.plain.resize(bytes);
    size_t at = 0;
    for (const Tensor& t : srcs) {
      if (t.nbytes()) std::memcpy(s.plain.data() + at, t.data(), static_cast<size_t>(t.nbytes()));
      at += static_cast<size_t>(t.nbytes());
    }
    return;
  }
  if (s.pending) wait(slot);  // the slot's earlier read is still in use
  if (s.capacity < bytes) {
    if (s.host) OCTET_CUDA_CHECK(cudaFreeHost(s.host));
    s.host = nullptr;
    OCTET_CUDA_CHECK(cudaMallocHost(&s.host, bytes));
    s.capacity = bytes;
  }
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  size_t at = 0;
  for (const Tensor& t : srcs) {
    if (t.nbytes())
      OCTET_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(s.host) + at, t.data(),
                                       static_cast<size_t>(t.nbytes()), cudaMemcpyDeviceToHost,
                                       stream));
    at += static_cast<size_t>(t.nbytes());
  }
  OCTET_CUDA_CHECK(cudaEventRecord(s.done, stream));
  s.pending = true;
}

const uint8_t* PinnedReadback::wait(int slot) {
  OCTET_CHECK(slot >= 0 && static_cast<size_t>(slot) < impl_->slots.size(),
              "pinned readback: no slot ", slot);
  Impl::Slot& s = impl_->slots[static_cast<size_t>(slot)];
  if (!impl_->cuda) return s.plain.data();
  if (s.pending) {
    if (cudaEventQuery(s.done) == cudaErrorNotReady) {
      ++blocked_;
      OCTET_CUDA_CHECK(cudaEventSynchronize(s.done));
    }
    cudaGetLastError();  // cudaEventQuery's cudaErrorNotReady is not an error of the next launch
    s.pending = false;
  }
  return static_cast<const uint8_t*>(s.host);
}

void clear_cuda_last_error() {
  cudaGetLastError();
}

int64_t device_reserved_bytes(const Context& ctx) {
  if (ctx.device != Device::kCuda) return 0;
  cudaMemPool_t pool;
  OCTET_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ctx.device_index));
  uint64_t pooled = 0, graphs = 0;
  OCTET_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &pooled));
  OCTET_CUDA_CHECK(cudaDeviceGetGraphMemAttribute(ctx.device_index,
                                                  cudaGraphMemAttrReservedMemCurrent, &graphs));
  return static_cast<int64_t>(pooled + graphs);
}

}  // namespace octet
