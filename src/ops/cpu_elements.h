// Element access for the CPU references: element i of an f32 or bf16 tensor as a float, and a
// float stored into one (BF16 rounds to nearest even). Wider sums (FP64) convert exactly on the way
// in and round once to FP32 on the way out.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "numerics/fp8.h"

namespace octet::cpu {

inline float load(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::kF32) return t.data_as<const float>()[i];
  return bf16_to_float(t.data_as<const uint16_t>()[i]);
}

// The same element widened to FP64, for references that compute in double.
inline double load_f64(const Tensor& t, int64_t i) {
  return load(t, i);
}

inline void store(const Tensor& t, int64_t i, float v) {
  if (t.dtype() == DType::kF32)
    t.data_as<float>()[i] = v;
  else
    t.data_as<uint16_t>()[i] = float_to_bf16(v);
}

// The same for a typed pointer into an f32 (float) or bf16 (uint16_t) buffer, for loops that have
// dispatched on the dtype once.
template <typename T>
float load(const T* p, int64_t i) {
  if constexpr (sizeof(T) == 2)
    return bf16_to_float(p[i]);
  else
    return p[i];
}
template <typename T>
void store(T* p, int64_t i, float v) {
  if constexpr (sizeof(T) == 2)
    p[i] = float_to_bf16(v);
  else
    p[i] = v;
}

}  // namespace octet::cpu
