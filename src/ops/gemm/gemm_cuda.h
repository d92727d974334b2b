// Internal (CUDA builds only): the row-major GEMM on top of cuBLASLt, shared by the dense and
// grouped ops.
#pragma once

#include "core/scale_layout.h"
#include "ops/gemm/gemm_backends.h"
#include "ops/gemm/gemm_cublaslt.h"

namespace octet::cuda {

// A (rows, k) operand with row stride `ld` elements, FP8 or BF16, and (FP8) its scales laid out as
// scale_shape(g, rows, k) row-major with row stride `s_ld` (so a sub-range of rows or of 128-groups
// of a larger operand is a view, not a copy). 1x128 scales in s_layout kMNMajor
// (core/scale_layout.h) are a whole operand's, s_ld = mn_major_ld(rows): cuBLASLt reads them in
// place.
struct OperandView {
  const void* data = nullptr;
  int64_t rows = 0, k = 0, ld = 0;
  cudaDataType_t type = CUDA_R_16BF;
  Granularity g = Granularity::kTensor;
  const float* scale = nullptr;
  int64_t s_ld = 1;
  ScaleLayout s_layout = ScaleLayout::kKMajor;
};

OperandView view_of(const Fp8Operand& op);
OperandView view_of_bf16(const Tensor& t);

// D (M, N) row-major with row stride ldd, F32 or BF16, (=|+=) A B^T for A (M, k) and B (N, k).
struct RowMajorOut {
  void* p = nullptr;
  DType dtype = DType::kF32;
  int64_t ld = 0;
};
void matmul(Context& ctx, const OperandView& a, const OperandView& b, const RowMajorOut& d,
            Accumulate acc, Accumulation accumulation);

}  // namespace octet::cuda
