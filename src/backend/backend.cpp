// make_context (backend.h): a context with the device's backend.
#include "backend/backend.h"

namespace octet {

Context make_context(Device device, int device_index) {
  Context ctx;
  ctx.device = device;
  ctx.device_index = device_index;
  if (device == Device::kCpu) {
    ctx.backend = make_cpu_backend();
  } else {
    OCTET_CHECK(cuda_built(), "this octet was built without CUDA; use --device cpu");
    const int n = cuda_device_count();
    OCTET_CHECK(n > 0, "no CUDA GPU is visible; use --device cpu");
    OCTET_CHECK(device_index >= 0 && device_index < n, "GPU index ", device_index,
                " out of range (", n, " visible)");
    ctx.backend = make_cuda_backend(device_index);
    ctx.stream = ctx.backend->stream();
  }
  return ctx;
}

}  // namespace octet
