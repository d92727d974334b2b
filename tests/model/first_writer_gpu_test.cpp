// The Linear layers' and routed experts' gradients written by their first writer (=) instead of
// zeroed and added to, on CUDA: cuBLASLt's Wgrads with beta 0 and the CUTLASS grouped Wgrad's dW =
// instantiation (first_writer_check.h).
#include "first_writer_check.h"

namespace octet {
namespace {

TEST(FirstWriterGpu, GradientsMatchZeroGrad) {
  OCTET_REQUIRE_GPU();
  test::expect_first_writer_grads_match(Device::kCuda);
}

}  // namespace
}  // namespace octet
