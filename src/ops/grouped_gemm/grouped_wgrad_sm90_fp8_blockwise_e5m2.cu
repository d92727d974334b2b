// Hopper grouped FP8 Wgrad with E5M2 dY: the per-tensor recipes' weight gradient (E5M2 gradients x
// E4M3 X, per-expert scales given as constant 1x128 / 128x128 blocks). The E5M2 instantiation of
// grouped_wgrad_sm90_fp8.cuh, alone in its translation unit.
#include "ops/grouped_gemm/grouped_wgrad_sm90_fp8.cuh"

namespace octet::cuda {

void grouped_wgrad_fp8_sm90_e5m2(Context& ctx, const GroupedWgradFp8Args& args) {
  sm90::run_grouped_wgrad_fp8<cutlass::float_e5m2_t>(ctx, args);
}

}  // namespace octet::cuda
