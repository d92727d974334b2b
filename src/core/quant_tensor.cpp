#include "core/quant_tensor.h"

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

DType fp8_dtype(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? DType::kE4M3 : DType::kE5M2;
}

}  // namespace octet
