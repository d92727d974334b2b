// Internal (CUDA builds with CUTLASS only): the Hopper grouped GEMMs of grouped_gemm_sm90_*.cu,
// which read the row counts on the device (no host read, no synchronisation).
#pragma once

#include "ops/grouped_gemm/grouped_gemm.h"

namespace octet::cuda {

// True when the call is a configuration the kernels are built for: A 1x128 E4M3 or E5M2 and B
// 128x128 E4M3, D BF16 overwritten, K a multiple of 16 and N of 8 (16-byte TMA rows). E5M2 A is the
// per-tensor recipes' Dgrad, its per-expert scales given as constant blocks.
bool grouped_gemm_fp8_sm90_supports(const GroupedGemmFp8Args& args);

// Fprop / Dgrad of grouped_gemm.h in one launch; D's rows past the experts' sum are zeroed. Experts
// whose rows would run past A's rows are clipped to them (a caller's bad counts cannot write out of
// bounds; the host-checked path reports them instead).
void grouped_gemm_fp8_sm90(Context& ctx, const GroupedGemmFp8Args& args);
// The E5M2 A instantiation (its own translation unit), called by grouped_gemm_fp8_sm90.
void grouped_gemm_fp8_sm90_e5m2(Context& ctx, const GroupedGemmFp8Args& args);

// True for DeepSeek-V3's Wgrad pairing: A (dY's column-wise copy) 1x128 along tokens, B (X's,
// from the scaling-aware transpose) 128x128, both E4M3 (or A E5M2: the per-tensor recipes), dW F32
// accumulated (+=) or, with E4M3 A, overwritten (=), the token count a multiple of 16 and K of 4
// (16-byte rows).
bool grouped_wgrad_fp8_sm90_supports(const GroupedWgradFp8Args& args);

// Wgrad of grouped_gemm.h in one launch, the counts read on the device. Every non-empty expert must
// start at a multiple of 128 tokens (grouped_gemm.h's rule; the caller's padded permute guarantees
// it, and grouped_gemm.cpp checks it on the host when the counts are there).
void grouped_wgrad_fp8_sm90(Context& ctx, const GroupedWgradFp8Args& args);
// The E5M2 A instantiation (its own translation unit), called by grouped_wgrad_fp8_sm90.
void grouped_wgrad_fp8_sm90_e5m2(Context& ctx, const GroupedWgradFp8Args& args);

// BF16 Fprop / Dgrad (grouped_gemm_sm90_bf16.cu): A and B bf16 with K % 8 == 0, D bf16
// overwritten with N % 8 == 0; D's rows past the experts' sum are zeroed.
bool grouped_gemm_bf16_sm90_supports(const GroupedGemmBf16Args& args);
void grouped_gemm_bf16_sm90(Context& ctx, const GroupedGemmBf16Args& args);

// BF16 Wgrad from the forward's dY (R, N) and X (R, K) (OperandLayout::kMNMajor), dW (E, N, K) f32
// accumulated, N and K multiples of 8. Experts may start at any row.
bool grouped_wgrad_bf16_sm90_supports(const GroupedWgradBf16Args& args);
void grouped_wgrad_bf16_sm90(Context& ctx, const GroupedWgradBf16Args& args);

}  // namespace octet::cuda
