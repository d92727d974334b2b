// Internal: the per-backend implementations behind gemm.h. Arguments are validated by gemm.cpp;
// these functions only compute.
#pragma once

#include "ops/gemm/gemm.h"

namespace octet {

// True when the operand's scales change along K (1x128, 128x128), so they are applied per 128-group
// at promotion; false when one scale covers a whole row of K (tensor, row): applied to the FP32
// result.
inline bool scales_vary_along_k(Granularity g) {
  return g == Granularity::k1x128 || g == Granularity::k128x128;
}

// Validation shared with grouped_gemm (messages name the operand and the rule).
// kStacked: the caller checks the scales' shape itself (grouped_gemm's stacked per-expert weights).
enum class ScaleShapeCheck : uint8_t { kOneMatrix, kStacked };
void check_gemm_operand(const Fp8Operand& op, const char* name, Device device,
                        ScaleShapeCheck scales = ScaleShapeCheck::kOneMatrix);
void check_gemm_output(const Tensor& d, int64_t m, int64_t n, Accumulate acc, Device device);
// A BF16 operand on `device`; F32 on the CPU too, the FP32 checking mode the model's
// finite-difference tests run in (the CPU reference decodes both to FP32 anyway).
void check_high_precision_operand(const Tensor& t, const char* name, Device device);
// cuBLASLt's FP8 kernels read rows of A and B in 16-byte vectors along K.
void check_cuda_fp8_k(int64_t k);
// cuBLASLt's block-scaled kernels write rows of D (N elements) in whole 16-byte vectors.
void check_cuda_block_output(int64_t n, DType d);

namespace cpu {
void gemm_fp8(Context& ctx, const GemmFp8Args& args);
void gemm_bf16(Context& ctx, const GemmBf16Args& args);
}  // namespace cpu

namespace cuda {
void gemm_fp8(Context& ctx, const GemmFp8Args& args);
void gemm_bf16(Context& ctx, const GemmBf16Args& args);
}  // namespace cuda

}  // namespace octet
