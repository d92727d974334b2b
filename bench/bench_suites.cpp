#include "bench.h"

namespace octet::bench {

const std::vector<Suite>& suites() {
  static const std::vector<Suite> table = {
      quantize_suite(),  gemm_suite(),       gemm_accum_suite(),
      attention_suite(), train_step_suite(), moe_dispatch_suite(),
      swiglu_suite(),    comm_suite(),       adamw_suite()};
  return table;
}

}  // namespace octet::bench
