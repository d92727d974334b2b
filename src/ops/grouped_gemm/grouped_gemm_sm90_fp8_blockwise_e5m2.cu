// Hopper grouped FP8 Fprop / Dgrad with E5M2 A: the Dgrad of the per-tensor recipes (E5M2
// gradients x E4M3 weights), whose per-expert scales are given as constant 1x128 / 128x128 blocks.
// The E5M2 instantiation of grouped_gemm_sm90_fp8_fprop.cuh, alone in its translation unit.
#include "ops/grouped_gemm/grouped_gemm_sm90_fp8_fprop.cuh"

namespace octet::cuda {

void grouped_gemm_fp8_sm90_e5m2(Context& ctx, const GroupedGemmFp8Args& args) {
  sm90::run_grouped_fp8<cutlass::float_e5m2_t>(ctx, args);
}

}  // namespace octet::cuda
