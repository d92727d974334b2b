#include <cstdio>

#include "backend/backend.h"
#include "cli.h"

namespace octet::cli {

static int run_info(const std::vector<std::string>& argv) {
  Args args(argv, {}, {});
  args.expect_positional(0, 0, "octet info");
  std::printf("octet %s\n", OCTET_VERSION);
  std::printf("build: C++20, %s", OCTET_WITH_CUDA ? "CUDA backend" : "CPU only");
#ifdef OCTET_CUDA_ARCH
  std::printf(" (%s)", OCTET_CUDA_ARCH);
#endif
  std::printf("\nbackends: cpu%s\n", cuda_built() ? ", cuda" : "");
  const int n = cuda_device_count();
  if (!cuda_built()) return 0;
  if (n == 0) {
    std::printf("gpus: none visible\n");
    return 0;
  }
  for (int i = 0; i < n; ++i) {
    const CudaDeviceInfo d = cuda_device_info(i);
    std::printf("gpu %d: %s, compute capability %d.%d, %d SMs, %.1f GiB, L2 %.0f MiB\n", i,
                d.name.c_str(), d.major, d.minor, d.sm_count,
                static_cast<double>(d.total_memory) / (1 << 30),
                static_cast<double>(d.l2_bytes) / (1 << 20));
    if (i == 0)
      std::printf("cuda: driver %d.%d, runtime %d.%d\n", d.driver_version / 1000,
                  d.driver_version % 1000 / 10, d.runtime_version / 1000,
                  d.runtime_version % 1000 / 10);
  }
  return 0;
}

Command info_command() {
  return {"info", "version, build options, backends and GPUs",
          "usage: octet info\n\nPrints the version, the build options, the backends compiled in "
          "and, when a GPU "
          "is visible, its name, SM count, memory and compute capability.",
          run_info};
}

}  // namespace octet::cli
