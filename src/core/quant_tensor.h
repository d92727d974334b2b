// QuantTensor: an FP8 tensor with its scales, in TransformerEngine's vocabulary.
//
// The row-wise copy `data` has the logical shape (rows, cols) of the source. The optional
// column-wise copy holds the transpose, (cols, rows) row-major, so that the GEMM that needs the
// other K-major operand (Dgrad for weights, Wgrad for activations and gradients) reads it directly;
// its scales follow the layout of `columnwise_granularity` applied to that (cols, rows) matrix.
#pragma once

#include "core/quant_types.h"
#include "core/tensor.h"

namespace octet {

Shape scale_shape(Granularity g, int64_t rows, int64_t cols);
DType fp8_dtype(Fp8Format f);

struct QuantTensor {
  Fp8Format format = Fp8Format::kE4M3;
  Granularity granularity = Granularity::k1x128;
  ScaleRounding rounding = ScaleRounding::kExact;
  Tensor data;       // (rows, cols) fp8, row-major, the source's shape
  Tensor scale_inv;  // fp32, scale_shape(granularity, rows, cols)
  Tensor amax;       // (1) fp32: max |x| over the whole source (recorded for delayed scaling)

  Granularity columnwise_granularity = Granularity::k1x128;
  Tensor columnwise_data;       // (cols, rows) fp8: the transpose; undefined when not requested
  Tensor columnwise_scale_inv;  // fp32, scale_shape(columnwise_granularity, cols, rows)

  int64_t rows() const { return data.rows(); }
  int64_t cols() const { return data.cols(); }
  bool has_columnwise() const { return columnwise_data.defined(); }
};

}  // namespace octet
