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
