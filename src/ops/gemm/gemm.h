// GEMM ops: D = A · B^T (or D += A · B^T into FP32) for FP8 quantized operands and for BF16.
//
// Both operands are K-major: A is (M, K) and B is (N, K), row-major, and D is (M, N) row-major.
// That is the only layout Hopper's FP8 tensor cores take ("TN", reference/fp8-facts.md section 3),
// so every training GEMM is phrased as one, and the quantized copy that is already K-major is the
// one consumed (core/quant_tensor.h: `data` is the source, `columnwise_data` its transpose):
//
//   Linear y = x W^T, x (T, In) tokens, W (Out, In), dy (T, Out):
//
//   pass   math          A                        B                        M    N    K
//   Fprop  Y  = X W^T    rowwise(X)     (T, In)   rowwise(W)    (Out, In)  T    Out  In
//   Dgrad  dX = dY W     rowwise(dY)    (T, Out)  columnwise(W) (In, Out)  T    In   Out
//   Wgrad  dW = dY^T X   columnwise(dY) (Out, T)  columnwise(X) (In, T)    Out  In   T
//
// DeepSeek-V3 recipe: activations and gradients 1x128 (so Wgrad's operands are 1x128 along tokens:
// the column-wise copies quantized along T), weights 128x128 (W's column-wise copy is its transpose
// with 128x128 blocks). Weight gradients accumulate (+=) into FP32.
//
// Supported FP8 pairings (A x B; what cuBLASLt 13.0 implements on Hopper):
//   tensor x tensor   E4M3 or E5M2 on either side, except E5M2 x E5M2   (SCALAR_32F)
//   row x row         same formats                                    (OUTER_VEC_32F)
//   1x128 x 128x128, 128x128 x 1x128, 1x128 x 1x128                   (VEC128_32F / BLK128x128_32F)
// 128x128 x 128x128 is not implemented by cuBLASLt (quantize one side 1x128), nor is any mix of the
// three families. 128x1 scales run across K rows: use the other copy, whose groups lie along K.
//
// Numerics: every FP8 x FP8 product is exact in FP32. With Accumulation::kPromoted (the default and
// the DeepSeek-V3 recipe) the tensor-core partial sums are promoted into FP32 every 128 elements of
// K, where the per-group scales (1x128, 128x128) are applied; per-tensor and row scales are applied
// once to the FP32 result. kFast (cuBLASLt FAST_ACCUM) keeps the whole sum in the tensor core's
// limited-precision accumulator; block-scaled operands cannot use it. See docs/numerics.md.
//
// The CPU backend is the reference: the same products, scales and promotion points, with exact FP32
// adds by default, or an emulation of the tensor core's limited-precision adds
// (AccumulatorEmulation).
//
// CUDA (cuBLASLt 13.0 on Hopper) rules, checked before any work with a message naming the operand
// and the rule: FP8 operands need K % 16 == 0 (rows of A and B are read in 16-byte vectors); with
// block scales the rows of D must be whole 16-byte vectors (N % 8 for BF16 output, N % 4 for FP32).
// Block scales also need M % 4 == 0 in cuBLASLt: other M run on a zero-padded copy of A (a copy of
// A and D, see gemm_cuda.cu). Descriptors and the heuristic's algorithm are cached per shape in
// Context::gemm.
//
// Measured accuracy on an H100 (tests/ops/gemm_gpu_test.cpp): relative Frobenius error of the FP32
// output against FP64 on the same FP8 inputs about 1.3e-4 at every K (the tensor core's own adds
// inside each 128-element chunk), for every recipe and pass; see docs/numerics.md.
#pragma once

#include "core/context.h"
#include "core/quant_tensor.h"

namespace octet {

// `=` or `+=` into the destination.
enum class Accumulate : uint8_t {
  kOverwrite,  // D = A B^T
  kAdd,        // D += A B^T; D must be FP32 (weight gradients)
};

// FP8 accumulation precision on the GPU.
enum class Accumulation : uint8_t {
  kPromoted,  // FP32 promotion every 128 elements of K (cuBLASLt FAST_ACCUM = 0; DeepSeek-V3)
  kFast,      // tensor-core accumulator only (FAST_ACCUM = 1); per-tensor and row scales only
};

// The CPU reference's model of the tensor-core accumulator. Products are exact; they are summed in
// an accumulator that keeps `mantissa_bits` fraction bits and truncates (rounds toward zero) after
// every add, as DeepSeek-V3 section 3.3.2 describes Hopper's FP8 MMA (about 14 bits). Every
// `promote_interval` elements of K the partial sum is added into an FP32 accumulator (round to
// nearest) and the partial restarts from zero. Block-scaled operands (1x128, 128x128) also promote
// at every 128-group boundary of K, since their scales are applied there.
struct AccumulatorEmulation {
  int mantissa_bits = 0;  // 0: plain FP32 (round to nearest); 1..23: truncating, that many bits
  int64_t promote_interval =
      128;  // elements of K per promotion into FP32; 0: never (kFast on the GPU)

  static AccumulatorEmulation fp32() { return {}; }
  static AccumulatorEmulation hopper(int64_t promote = 128) { return {14, promote}; }
};

// One K-major FP8 operand: a (rows, K) copy of a QuantTensor with its scales.
struct Fp8Operand {
  Tensor data;       // (rows, K) fp8, row-major (leading dimensions flattened into rows)
  Tensor scale_inv;  // fp32, scale_shape(granularity, rows, K)
  Granularity granularity = Granularity::kTensor;
  Fp8Format format = Fp8Format::kE4M3;

  int64_t rows() const { return data.rows(); }
  int64_t cols() const { return data.cols(); }
};

// The row-wise copy (q.data, the source's (rows, cols)) or the column-wise one (q.columnwise_data,
// its transpose (cols, rows)) as a GEMM operand.
Fp8Operand rowwise_operand(const QuantTensor& q);
Fp8Operand columnwise_operand(const QuantTensor& q);

struct GemmFp8Args {
  Fp8Operand a;  // (M, K) fp8
  Fp8Operand b;  // (N, K) fp8
  Tensor d;      // (M, N) bf16 or f32, written (and read with kAdd: f32 only)
  Accumulate accumulate = Accumulate::kOverwrite;
  Accumulation accumulation = Accumulation::kPromoted;
  // CPU only: the accumulator model. Default: plain FP32, promoted every 128 (the kPromoted
  // result).
  AccumulatorEmulation emulation = AccumulatorEmulation::fp32();
};

// D (=|+=) dequant(A) · dequant(B)^T, as described above. Writes every element of D.
void gemm_fp8(Context& ctx, const GemmFp8Args& args);

// How a BF16 operand lies in memory. FP8 tensor cores take only K-major operands (the TN form), so
// FP8 GEMMs need a quantized transposed copy; BF16 tensor cores take either, so a BF16 operand is
// read as it is stored and no transposed copy is ever made (Dgrad reads W (Out, In) as it is, Wgrad
// reads dy and x (T, *) as they are).
enum class OperandLayout : uint8_t {
  kKMajor,   // A stored (M, K), B stored (N, K), row-major: rows run along K
  kMNMajor,  // A stored (K, M), B stored (K, N), row-major: the transpose of the above
};

struct GemmBf16Args {
  Tensor a;  // (M, K) bf16, or (K, M) with a_layout kMNMajor; f32 on the CPU (FP32 checking mode)
  Tensor b;  // (N, K) bf16, or (K, N) with b_layout kMNMajor; f32 on the CPU, with A
  Tensor d;  // (M, N) bf16 or f32 (kAdd: f32)
  Accumulate accumulate = Accumulate::kOverwrite;
  OperandLayout a_layout = OperandLayout::kKMajor;
  OperandLayout b_layout = OperandLayout::kKMajor;
};

// D (=|+=) A · B^T with FP32 accumulation: the BF16 baseline recipe and the BF16 sites. With the
// layouts: Dgrad dX = dY W is {dy, w, dx, =, kKMajor, kMNMajor}; Wgrad dW += dY^T X is
// {dy, x, dw, +=, kMNMajor, kMNMajor}.
void gemm_bf16(Context& ctx, const GemmBf16Args& args);

// Checks an FP8 pairing without running it; throws the message gemm_fp8 would.
void check_fp8_pairing(const Fp8Operand& a, const Fp8Operand& b, Accumulation accumulation);

// Number of cuBLASLt plans (descriptors + chosen algorithm) cached in the context; 0 on the CPU.
int64_t gemm_cached_plans(const Context& ctx);

}  // namespace octet
