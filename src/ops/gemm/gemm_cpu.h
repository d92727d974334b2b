// Internal: the CPU reference's building blocks, shared by the dense and the grouped GEMM.
//
// An operand is decoded once into FP32 values (FP8 and BF16 values are exact in FP32) and read
// through a RefMatrix view, so that sub-matrices (one expert's rows, one expert's token columns)
// need no copy.
#pragma once

#include <vector>

#include "core/scale_layout.h"
#include "ops/gemm/gemm_backends.h"

namespace octet::cpu {

// (rows, k) view of decoded values with the operand's scales. Element (r, c) is v[r * ld + c]; its
// scale group along K is c / 128 (the view must start on a group boundary of the scale tensor).
struct RefMatrix {
  const float* v = nullptr;
  int64_t ld = 0;
  int64_t rows = 0;
  int64_t k = 0;
  Granularity g = Granularity::kTensor;
  const float* s = nullptr;  // scale_inv, laid out as scale_shape(g, ...) of the underlying operand
  int64_t s_ld = 1;          // row stride of s in elements (1x128, 128x128: the number of K-groups;
                             // 1x128 MN-major: the stride between K-groups, mn_major_ld(rows))
  ScaleLayout layout = ScaleLayout::kKMajor;  // 1x128: core/scale_layout.h (whole operands only)

  float scale(int64_t r, int64_t kg) const;
};

// Decoded FP8 codes (no scale applied) or BF16 values, row-major.
std::vector<float> decode_values(const Tensor& t);

RefMatrix ref_matrix(const std::vector<float>& values, const Fp8Operand& op);

// Writes D[i, j] for i < a.rows, j < b.rows into `d` (row-major, row stride ldd, F32 or BF16):
// overwrite, or add into an F32 destination.
struct RefOutput {
  void* p = nullptr;
  DType dtype = DType::kF32;
  int64_t ld = 0;
};
void reference_gemm(const RefMatrix& a, const RefMatrix& b, const AccumulatorEmulation& emu,
                    Accumulate acc, const RefOutput& d);

}  // namespace octet::cpu
