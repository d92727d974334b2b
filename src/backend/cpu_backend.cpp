#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "backend/backend.h"

namespace octet {
namespace {

class HostTimer final : public Timer {
 public:
  void start() override { t0_ = std::chrono::steady_clock::now(); }
  double stop_ms() override {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point t0_;
};

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::kCpu; }
  void* alloc(int64_t bytes) override {
    void* p = std::aligned_alloc(64, static_cast<size_t>(((bytes + 63) / 64) * 64));
    OCTET_CHECK(p, "out of host memory allocating ", bytes, " bytes");
    return p;
  }
  void free(void* ptr) override { std::free(ptr); }
  void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t row_bytes,
               int64_t rows) override {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch,
                  static_cast<const char*>(src) + r * src_pitch, static_cast<size_t>(row_bytes));
  }
  int64_t peak_bytes() const override {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<int64_t>(u.ru_maxrss) * 1024;  // kilobytes on Linux
  }
  int64_t available_bytes() const override {
    std::ifstream in("/proc/meminfo");
    std::string key;
    int64_t kb = 0;
    std::string unit;
    while (in >> key >> kb >> unit)
      if (key == "MemAvailable:") return kb * 1024;
    return -1;
  }
  void copy(void* dst, const void* src, int64_t bytes, CopyKind kind) override {
    OCTET_CHECK(kind == CopyKind::kHostToHost, "the cpu backend copies host memory only");
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void memset(void* dst, int byte, int64_t bytes) override {
    std::memset(dst, byte, static_cast<size_t>(bytes));
  }
  void synchronize() override {}
  std::unique_ptr<Timer> make_timer() override { return std::make_unique<HostTimer>(); }
};

}  // namespace

std::shared_ptr<Backend> make_cpu_backend() {
  return std::make_shared<CpuBackend>();
}

}  // namespace octet
