// Hopper grouped FP8 Fprop / Dgrad with E4M3 A (DeepSeek-V3's activations and gradients, and the
// per-tensor recipes' forward): the E4M3 instantiation of grouped_gemm_sm90_fp8_fprop.cuh (which
// has the operand layouts), and the dispatch on A's format. The E5M2 one lives in
// grouped_gemm_sm90_fp8_blockwise_e5m2.cu: one CUTLASS kernel per translation unit.
#include "ops/grouped_gemm/grouped_gemm_sm90_fp8_fprop.cuh"

namespace octet::cuda {

bool grouped_gemm_fp8_sm90_supports(const GroupedGemmFp8Args& args) {
  const int64_t k = args.a.cols(), n = args.d.cols();
  return args.a.granularity == Granularity::k1x128 && args.b.granularity == Granularity::k128x128 &&
         (args.a.format == Fp8Format::kE4M3 || args.a.format == Fp8Format::kE5M2) &&
         args.b.format == Fp8Format::kE4M3 && args.d.dtype() == DType::kBF16 &&
         args.accumulate == Accumulate::kOverwrite && k % 16 == 0 && n % 8 == 0 &&
         args.group_sizes.numel() <= 1024;
}

void grouped_gemm_fp8_sm90(Context& ctx, const GroupedGemmFp8Args& args) {
  if (args.a.format == Fp8Format::kE5M2) {
    grouped_gemm_fp8_sm90_e5m2(ctx, args);
    return;
  }
  sm90::run_grouped_fp8<cutlass::float_e4m3_t>(ctx, args);
}

}  // namespace octet::cuda
