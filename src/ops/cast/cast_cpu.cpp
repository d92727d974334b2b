// CPU reference for cast.h: plain loops over the elements, the same FP32 operations as the kernels.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "numerics/fp8.h"
#include "ops/cast/cast_backends.h"
#include "ops/cpu_elements.h"

namespace octet::cpu {
void cast(Context&, const Tensor& x, const Tensor& out) {
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) store(out, i, load(x, i));
}

void transpose(Context&, const Tensor& x, const Tensor& out) {
  // Element bytes are moved as they are: a transpose never rounds (NaN payloads included).
  const int64_t rows = x.rows(), cols = x.cols();
  const auto es = static_cast<size_t>(dtype_size(x.dtype()));
  const auto* src = static_cast<const unsigned char*>(x.data());
  auto* dst = static_cast<unsigned char*>(out.data());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      std::memcpy(dst + static_cast<size_t>(j * rows + i) * es,
                  src + static_cast<size_t>(i * cols + j) * es, es);
}

void transpose_batched(Context& ctx, const Tensor& x, const Tensor& out) {
  const int64_t batch = x.size(0), rows = x.size(1), cols = x.size(2);
  const int64_t bytes = rows * cols * dtype_size(x.dtype());
  for (int64_t b = 0; b < batch; ++b) {
    auto* src = static_cast<char*>(x.data()) + b * bytes;
    auto* dst = static_cast<char*>(out.data()) + b * bytes;
    transpose(ctx, Tensor::wrap(src, {rows, cols}, x.dtype(), Device::kCpu),
              Tensor::wrap(dst, {cols, rows}, x.dtype(), Device::kCpu));
  }
}

void add_into(Context&, const Tensor& y, const Tensor& x) {
  const int64_t n = y.numel();
  for (int64_t i = 0; i < n; ++i) store(y, i, add_element(load(y, i), load(x, i)));  // +=
}

void round_to_storage(Context&, const Tensor& x, ExMyFormat f, StorageKernel, const Tensor& out) {
  const int64_t rows = x.rows(), cols = x.cols();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += kGroup) {
      const int64_t c1 = std::min(cols, c0 + kGroup);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) {
        const float v = std::fabs(load(x, r * cols + c));
        amax = v != v ? v : std::max(amax, v);  // a NaN poisons the tile (scale 1)
        if (amax != amax) break;
      }
      const float s = storage_tile_scale(amax, f);
      for (int64_t c = c0; c < c1; ++c)
        store(out, r * cols + c, storage_round(load(x, r * cols + c), s, f));
    }
  }
}

}  // namespace octet::cpu
