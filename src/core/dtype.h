// Element types of tensors, with their sizes and the names used in safetensors headers.
#pragma once

#include <cstdint>
#include <string_view>

namespace octet {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kE4M3,  // float8_e4m3fn: no inf, one NaN pattern per sign, max 448
  kE5M2,  // float8_e5m2: IEEE-like, max 57344
  kE8M0,  // unsigned power-of-two scale, bias 127, 0xFF is NaN
  kI32,
  kI64,
  kU8,
  kU16,
};

constexpr int64_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kE4M3:
      return 1;
    case DType::kE5M2:
      return 1;
    case DType::kE8M0:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
    case DType::kU16:
      return 2;
  }
  return 0;
}

// Names as the safetensors format spells them.
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kE4M3:
      return "F8_E4M3";
    case DType::kE5M2:
      return "F8_E5M2";
    case DType::kE8M0:
      return "F8_E8M0";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kU16:
      return "U16";
  }
  return "?";
}

constexpr bool is_fp8(DType t) {
  return t == DType::kE4M3 || t == DType::kE5M2;
}

}  // namespace octet
