// The vocabulary of quantized tensors (core/quant_tensor.h): FP8 formats, scale groups and scale
// rounding. The arithmetic behind them is numerics/scale.h's.
#pragma once

#include <cstdint>

#include "core/hd.h"

namespace octet {

enum class Fp8Format : uint8_t { kE4M3, kE5M2 };

// Scale groups. Layout of scale_inv (row-major FP32) for a (rows, cols) tensor, as DeepSeek-V3
// stores its weights: kTensor [1], kRow [rows, 1], k1x128 [rows, ceil(cols/128)], k128x1
// [ceil(rows/128), cols], k128x128 [ceil(rows/128), ceil(cols/128)]. The last group of a row or
// column may be partial.
enum class Granularity : uint8_t { kTensor, kRow, k1x128, k128x1, k128x128 };

enum class ScaleRounding : uint8_t { kExact, kPow2 };

inline constexpr int64_t kGroup = 128;  // DeepSeek-V3's tile and block edge

OCTET_HD int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace octet
