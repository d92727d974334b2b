// The Linear layers' and routed experts' gradients written by their first writer (=) instead of
// zeroed and added to, on the CPU (first_writer_check.h).
#include "first_writer_check.h"

namespace octet {
namespace {

TEST(FirstWriter, GradientsMatchZeroGradCpu) {
  test::expect_first_writer_grads_match(Device::kCpu);
}

}  // namespace
}  // namespace octet
