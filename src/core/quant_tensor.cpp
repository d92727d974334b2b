#include "core/quant_tensor.h"

#include "core/scale_layout.h"

namespace octet {

Shape scale_shape(Granularity g, int64_t rows, int64_t cols) {
  switch (g) {
    case Granularity::kTensor:
      return {1};
    case Granularity::kRow:
      return {rows, 1};
    case Granularity::k1x128:
      return {rows, ceil_div(cols, kGroup)};
    case Granularity::k128x1:
      return {ceil_div(rows, kGroup), cols};
    case Granularity::k128x128:
      return {ceil_div(rows, kGroup), ceil_div(cols, kGroup)};
  }
  OCTET_THROW("unknown granularity");
}

const char* scale_layout_name(ScaleLayout l) {
  return l == ScaleLayout::kKMajor ? "K-major" : "MN-major";
}

Shape scale_shape(Granularity g, int64_t rows, int64_t cols, ScaleLayout layout) {
  if (layout == ScaleLayout::kKMajor) return scale_shape(g, rows, cols);
  OCTET_CHECK(g == Granularity::k1x128,
              "scale layout: only 1x128 scales have an MN-major (cuBLASLt VEC128) layout");
  return {ceil_div(cols, kGroup), mn_major_ld(rows) / kScaleRowAlign, kScaleRowAlign};
}

ScaleLayout scale_layout(Granularity g, const Tensor& scale_inv) {
  return g == Granularity::k1x128 && scale_inv.rank() == 3 ? ScaleLayout::kMNMajor
                                                           : ScaleLayout::kKMajor;
}

void check_k_major_scales(Granularity g, const Tensor& scale_inv, const char* what) {
  OCTET_CHECK(scale_layout(g, scale_inv) == ScaleLayout::kKMajor, what,
              ": needs K-major 1x128 scales [rows, ceil(cols/128)], got MN-major ones (shape ",
              shape_str(scale_inv.shape()),
              "); quantize this tensor with QuantizeArgs::scale_layout = ScaleLayout::kKMajor");
}

DType fp8_dtype(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? DType::kE4M3 : DType::kE5M2;
}

}  // namespace octet
