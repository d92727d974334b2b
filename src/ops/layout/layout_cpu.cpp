// CPU reference of layout.h: plain loops, FP32 sums in increasing order.
#include "numerics/fp8.h"
#include "ops/layout/layout_backends.h"

namespace octet::cpu {
namespace {

template <typename S, typename D>
void copy_typed(const CopyColumnsArgs& a) {
  const auto* src = a.src.data_as<const S>();
  auto* dst = a.dst.data_as<D>();
  const int64_t rows = a.dst.rows(), sc = a.src.cols(), dc = a.dst.cols();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < a.width; ++j) {
      float v = 0.0f;
      if (a.mode == CopyMode::kSum) {
        for (int64_t i = 0; i < a.repeat; ++i)
          v += load_float(src, (r * a.repeat + i) * sc + a.src_col + j);
      } else {
        v = load_float(src, (r / a.repeat) * sc + a.src_col + j);
      }
      store_float(dst, r * dc + a.dst_col + j, v);
    }
  }
}

}  // namespace

void copy_columns(Context&, const CopyColumnsArgs& a) {
  const bool sf = a.src.dtype() == DType::kF32, df = a.dst.dtype() == DType::kF32;
  if (sf && df)
    copy_typed<float, float>(a);
  else if (sf)
    copy_typed<float, uint16_t>(a);
  else if (df)
    copy_typed<uint16_t, float>(a);
  else
    copy_typed<uint16_t, uint16_t>(a);
}

}  // namespace octet::cpu
