// Grouped GEMMs for Mixture-of-Experts layers, contiguous layout.
//
// The tokens routed to the E experts sit in one tensor, grouped by expert: rows [o_e, o_e + M_e)
// belong to expert e, with o_e = M_0 + ... + M_{e-1}. The per-expert row counts M_e live in a
// device tensor (`group_sizes`, (E) int32 or int64, zeros allowed), as the permute that builds the
// layout writes them. Each expert is one GEMM of gemm.h (same TN form, same numerics, same = / +=
// contract):
//
//   Fprop  Y_e  = X_e W_e^T   a = rowwise(X)  (sum M_e, In)  1x128
//                             b = W stacked   (E, Out, In)   128x128
//   Dgrad  dX_e = dY_e W_e    a = rowwise(dY) (sum M_e, Out) 1x128
//                             b = W_e^T stacked (E, In, Out) 128x128 (each expert's transpose
//                                                            quantized on its own)
//   Wgrad  dW_e = dY_e^T X_e  a = columnwise(dY) (Out, sum M_e)  1x128 along tokens
//                             b = columnwise(X)  (In, sum M_e)   1x128 along tokens (or 128x128
//                                                                from the scaling-aware transpose)
//                             dW (E, Out, In), += into FP32 for training
//
// Stacked weights: data (E, N, K) (any shape with E * N rows of K), scales per expert:
// scale_inv (E, ceil(N/128), ceil(K/128)) for 128x128, (E * N, ceil(K/128)) for 1x128. A 128x128
// scale tensor of E * N rows quantized as one matrix is the same thing only when N % 128 == 0; for
// other N it must be rank 3 (E, ceil(N/128), ceil(K/128)), which proves the blocks stop at expert
// boundaries.
//
// FP8 Wgrad reads each expert's tokens as a K range of the column-wise copies, whose scale groups
// of 128 tokens are global: every non-empty expert must start at a multiple of 128 tokens (pad each
// expert's rows to 128, as DeepGEMM's contiguous layout does). Fprop and Dgrad have no such rule.
//
// A padded permute (ops/moe_permute kTo128) has a static row count R >= sum M_e: rows past the sum
// are a tail no expert owns. Fprop and Dgrad then write zeros there (kOverwrite) or leave it
// (kAdd); Wgrad reads tokens [0, sum M_e) only.
//
// CUDA: the blockwise pairings (see grouped_fp8_blockwise_counts_on_device) and the BF16 GEMMs
// (grouped_bf16_counts_on_device) run as one CUTLASS grouped launch per call that reads the row
// counts on the device; nothing is read on the host. Every other call (a pairing no CUTLASS kernel
// is built for, or a build without CUTLASS) runs one cuBLASLt GEMM per non-empty expert (plans
// cached per shape) from a host read of group_sizes, which synchronises the stream. In a CUTLASS
// build the model's MoE layer makes no such call, in any recipe (model/grouped_linear.h).
#pragma once

#include "ops/gemm/gemm.h"

namespace octet {

struct GroupedGemmFp8Args {
  Fp8Operand a;        // (sum M_e, K) fp8, 1x128: expert e's tokens are rows [o_e, o_e + M_e)
  Fp8Operand b;        // (E * N, K) fp8 stacked weights, 128x128 (or 1x128) per expert, see above
  Tensor group_sizes;  // (E) int32 | int64 on the context's device: M_e >= 0, sum M_e <= a.rows()
                       // (see above)
  Tensor d;            // (sum M_e, N) bf16 | f32; kAdd: f32
  Accumulate accumulate = Accumulate::kOverwrite;
};

// For each expert e: D[o_e : o_e + M_e] (=|+=) A[o_e : o_e + M_e] · B_e^T. Fprop and Dgrad.
void grouped_gemm_fp8(Context& ctx, const GroupedGemmFp8Args& args);

struct GroupedGemmBf16Args {
  Tensor a;            // (sum M_e, K) bf16
  Tensor b;            // (E, N, K) bf16 (any shape with E * N rows of K)
  Tensor group_sizes;  // (E) int32 | int64
  Tensor d;            // (sum M_e, N) bf16 | f32
  Accumulate accumulate = Accumulate::kOverwrite;
};
void grouped_gemm_bf16(Context& ctx, const GroupedGemmBf16Args& args);

struct GroupedWgradFp8Args {
  Fp8Operand a;        // (N, sum M_e) fp8: dY's column-wise copy, 1x128 along tokens
  Fp8Operand b;        // (K, sum M_e) fp8: X's column-wise copy, 1x128 (or 128x128) along tokens
  Tensor group_sizes;  // (E) int32 | int64; non-empty experts start at multiples of 128 tokens
  Tensor d;            // (E, N, K): f32 for kAdd, bf16 | f32 for kOverwrite
  Accumulate accumulate = Accumulate::kAdd;
};

// For each expert e: dW_e (=|+=) A[:, o_e : o_e + M_e] · B[:, o_e : o_e + M_e]^T. An expert with no
// tokens gets dW_e = 0 (overwrite) or is left unchanged (+=).
void grouped_wgrad_fp8(Context& ctx, const GroupedWgradFp8Args& args);

struct GroupedWgradBf16Args {
  Tensor a;            // (N, sum M_e) bf16: dY^T; kMNMajor: dY itself, (sum M_e, N)
  Tensor b;            // (K, sum M_e) bf16: X^T; kMNMajor: X itself, (sum M_e, K)
  Tensor group_sizes;  // (E) int32 | int64
  Tensor d;            // (E, N, K)
  Accumulate accumulate = Accumulate::kAdd;
  // kMNMajor: a and b are the forward's dY and X (no transposed copies); the CUDA grouped kernel
  // reads them as they are, every other path transposes them first.
  OperandLayout layout = OperandLayout::kKMajor;
};
void grouped_wgrad_bf16(Context& ctx, const GroupedWgradBf16Args& args);

// True when this build runs the blockwise grouped FP8 GEMMs on the context's device with the row
// counts read on the device: Fprop / Dgrad (1x128 x 128x128, BF16 out) and Wgrad (1x128 x the
// 128x128 copy of the scaling-aware transpose, F32 +=), B E4M3 and A E4M3 (DeepSeek-V3) or E5M2
// (the per-tensor recipes' gradients, their scales as constant blocks), through CUTLASS on
// Hopper. Any other call reads the counts on the host, which synchronises the stream.
bool grouped_fp8_blockwise_counts_on_device(const Context& ctx);

// The same for the BF16 grouped GEMMs: Fprop / Dgrad with BF16 D overwritten, and Wgrad from the
// forward's dY and X (OperandLayout::kMNMajor) accumulated into F32 dW, with N and K multiples of
// 8 (16-byte rows).
bool grouped_bf16_counts_on_device(const Context& ctx);

// True when grouped_wgrad_fp8 with these arguments and accumulate = kOverwrite runs without a host
// read: on the CPU, and on CUDA the CUTLASS E4M3 Wgrad (which has a dW = instantiation, for the
// step's first writer of a gradient). The weight layers overwrite only then, and otherwise zero the
// gradient and add.
bool grouped_wgrad_fp8_overwrites(const Context& ctx, const GroupedWgradFp8Args& args);

}  // namespace octet
