// Hopper grouped FP8 Wgrad with E4M3 dY (DeepSeek-V3): the E4M3 instantiations of
// grouped_wgrad_sm90_fp8.cuh (which has the operand layouts), dW += and dW = (the step's first
// writer of the gradient), and the dispatch on A's format. The
// E5M2 one (the per-tensor recipes' gradients) lives in grouped_wgrad_sm90_fp8_blockwise_e5m2.cu:
// one CUTLASS kernel per translation unit.
#include "ops/grouped_gemm/grouped_wgrad_sm90_fp8.cuh"

namespace octet::cuda {

bool grouped_wgrad_fp8_sm90_supports(const GroupedWgradFp8Args& args) {
  const int64_t n = args.a.rows(), k = args.b.rows(), tokens = args.a.cols();
  return args.a.granularity == Granularity::k1x128 && args.b.granularity == Granularity::k128x128 &&
         (args.a.format == Fp8Format::kE4M3 || args.a.format == Fp8Format::kE5M2) &&
         args.b.format == Fp8Format::kE4M3 && args.d.dtype() == DType::kF32 &&
         (args.accumulate == Accumulate::kAdd ||
          (args.accumulate == Accumulate::kOverwrite && args.a.format == Fp8Format::kE4M3)) &&
         tokens % 16 == 0 && k % 4 == 0 && n > 0 && k > 0 &&
         args.group_sizes.numel() <= sm90::kWgradMaxExperts;
}

void grouped_wgrad_fp8_sm90(Context& ctx, const GroupedWgradFp8Args& args) {
  if (args.a.format == Fp8Format::kE5M2) {
    grouped_wgrad_fp8_sm90_e5m2(ctx, args);
    return;
  }
  if (args.accumulate == Accumulate::kOverwrite)
    sm90::run_grouped_wgrad_fp8<cutlass::float_e4m3_t, true>(ctx, args);
  else
    sm90::run_grouped_wgrad_fp8<cutlass::float_e4m3_t>(ctx, args);
}

}  // namespace octet::cuda
