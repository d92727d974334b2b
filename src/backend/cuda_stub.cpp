// Linked instead of cuda_backend.cu when the build has no CUDA: reports no GPUs.
#include "backend/backend.h"

namespace octet {

bool cuda_built() {
  return false;
}
int cuda_device_count() {
  return 0;
}
CudaDeviceInfo cuda_device_info(int) {
  OCTET_THROW("this octet was built without CUDA");
}
std::shared_ptr<Backend> make_cuda_backend(int) {
  OCTET_THROW("this octet was built without CUDA");
}

}  // namespace octet

// cuda_graph.h without CUDA: no graphs; uploads are plain host copies.
#include <cstring>
#include <vector>

#include "backend/cuda_graph.h"

namespace octet {

bool cuda_graphs_supported(const Context&) {
  return false;
}

struct CudaGraph::Impl {};
CudaGraph::CudaGraph() = default;
CudaGraph::~CudaGraph() = default;
CudaGraph::CudaGraph(CudaGraph&&) noexcept = default;
CudaGraph& CudaGraph::operator=(CudaGraph&&) noexcept = default;
void CudaGraph::capture(Context&, const char* what, const std::function<void()>&) {
  OCTET_THROW("CUDA graph capture of ", what, ": this octet was built without CUDA");
}
void CudaGraph::replay(Context&) {
  OCTET_THROW("CUDA graph replay: this octet was built without CUDA");
}
bool CudaGraph::captured() const {
  return false;
}
void CudaGraph::reset() {}

struct PinnedUploader::Impl {};
PinnedUploader::PinnedUploader(Context&, int slots) : impl_(std::make_unique<Impl>()) {
  OCTET_CHECK(slots >= 1, "pinned uploader: slots must be >= 1, got ", slots);
}
PinnedUploader::~PinnedUploader() = default;
void PinnedUploader::upload(Context&, const Tensor& dst, const Tensor& src) {
  OCTET_CHECK(
      src.device() == Device::kCpu && dst.device() == Device::kCpu && dst.nbytes() == src.nbytes(),
      "pinned upload: expected two host tensors of ", src.nbytes(), " bytes, got ", dst.nbytes());
  if (src.nbytes()) std::memcpy(dst.data(), src.data(), static_cast<size_t>(src.nbytes()));
}

struct PinnedReadback::Impl {
  std::vector<std::vector<uint8_t>> slots;
};
PinnedReadback::PinnedReadback(Context&, int slots) : impl_(std::make_unique<Impl>()) {
  OCTET_CHECK(slots >= 1, "pinned readback: slots must be >= 1, got ", slots);
  impl_->slots.resize(static_cast<size_t>(slots));
}
PinnedReadback::~PinnedReadback() = default;
void PinnedReadback::read(Context&, int slot, const std::vector<Tensor>& srcs) {
  OCTET_CHECK(slot >= 0 && static_cast<size_t>(slot) < impl_->slots.size(),
              "pinned readback: no slot ", slot);
  std::vector<uint8_t>& s = impl_->slots[static_cast<size_t>(slot)];
  s.clear();
  for (const Tensor& t : srcs) {
    const auto* p = static_cast<const uint8_t*>(t.data());
    s.insert(s.end(), p, p + t.nbytes());
  }
}
const uint8_t* PinnedReadback::wait(int slot) {
  OCTET_CHECK(slot >= 0 && static_cast<size_t>(slot) < impl_->slots.size(),
              "pinned readback: no slot ", slot);
  return impl_->slots[static_cast<size_t>(slot)].data();
}

int64_t device_reserved_bytes(const Context&) {
  return 0;
}

}  // namespace octet

namespace octet {
void set_backend_capturing(Backend&, bool) {}
void clear_cuda_last_error() {}
void release_cached_device_memory(Context&) {}
int64_t device_memory_releases(const Context&) {
  return 0;
}
}  // namespace octet
