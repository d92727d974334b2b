#include <cstdlib>
#include <cstring>

#include "backend/backend.h"

namespace octet {
namespace {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::kCpu; }
  void* alloc(int64_t bytes) override {
    void* p = std::aligned_alloc(64, static_cast<size_t>(((bytes + 63) / 64) * 64));
    OCTET_CHECK(p, "out of host memory allocating ", bytes, " bytes");
    return p;
  }
  void free(void* ptr) override { std::free(ptr); }
  void copy(void* dst, const void* src, int64_t bytes, CopyKind kind) override {
    OCTET_CHECK(kind == CopyKind::kHostToHost, "the cpu backend copies host memory only");
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void memset(void* dst, int byte, int64_t bytes) override {
    std::memset(dst, byte, static_cast<size_t>(bytes));
  }
  void synchronize() override {}
};

}  // namespace

std::shared_ptr<Backend> make_cpu_backend() { return std::make_shared<CpuBackend>(); }

}  // namespace octet
