// Where the swiglu kernels read gate_up from (swiglu.h): a BF16 or FP32 buffer, or its 1x128 FP8
// copy (Recipe::moe_swiglu_input fp8) dequantized in registers. Both give the kernels FP32 values by
// row r and column j of the (rows, 2F) matrix, one element (load) or 8 consecutive ones starting on
// a multiple of 8 (fetch, then unpack: the raw words first, so that a kernel can issue the next
// loads before it computes).
//
//   source          | load / unpack gives                      | 8 elements are
//   ----------------|------------------------------------------|---------------------------------
//   DenseGateUp<T>  | the element widened exactly               | one 16-byte word (two for FP32)
//   Fp8GateUp<T>    | code * scale_inv (one FP32 product), then | an 8-byte word of codes and the
//                   | rounded to T: dequantize(q, T) bit for    | scale of their group (8 columns
//                   | bit (ops/quantize); unpack decodes by the | from a multiple of 8 never
//                   | hardware, a pair of codes at a time       | straddle a 128-column group)
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "ops/swiglu/swiglu_math.h"

namespace octet::cuda::swiglu_kernels {

constexpr int kChunk = 8;

// Eight consecutive elements of a BF16 (one 16-byte word) or FP32 (two) buffer as loaded, read
// once and not kept in L1; unpack8 widens them to FP32 (exactly).
template <typename T>
struct Raw8 {
  uint4 w[sizeof(T) / 2];
};

template <typename T>
__device__ __forceinline__ Raw8<T> load_raw8(const T* __restrict__ p) {
  Raw8<T> r;
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) / 2); ++i)
    r.w[i] = __ldcs(reinterpret_cast<const uint4*>(p) + i);
  return r;
}

template <typename T>
__device__ __forceinline__ void unpack8(const Raw8<T>& r, float (&v)[kChunk]) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      v[4 * i] = bits_float(r.w[i].x), v[4 * i + 1] = bits_float(r.w[i].y);
      v[4 * i + 2] = bits_float(r.w[i].z), v[4 * i + 3] = bits_float(r.w[i].w);
    }
  } else {
    const uint32_t x[4] = {r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = bits_float(x[i] << 16);  // little-endian: the even element is the low half
      v[2 * i + 1] = bits_float(x[i] & 0xFFFF0000u);
    }
  }
}

template <typename T>
__device__ __forceinline__ void load8(const T* __restrict__ p, float (&v)[kChunk]) {
  unpack8(load_raw8(p), v);
}

// gate_up as a (rows, n) BF16 (T = uint16_t) or FP32 (T = float) buffer, n = 2F.
template <typename T>
struct DenseGateUp {
  using Raw = Raw8<T>;
  const T* p;
  int64_t n;
  __device__ __forceinline__ float load(int64_t r, int64_t j) const {
    return load_float(p, r * n + j);
  }
  __device__ __forceinline__ Raw fetch(int64_t r, int64_t c) const {
    return load_raw8(p + r * n + c);
  }
  // The raw words of 8 zeros, for lanes past the row (unpacked like any others).
  __device__ __forceinline__ static Raw zero() { return {}; }
  // Whether a kernel may read it with the FP8 format fixed to E4M3 (no codes here: always).
  bool e4m3() const { return true; }
  // kE4M3: Fp8GateUp's compile-time format; nothing to decode here.
  template <bool kE4M3 = false>
  __device__ __forceinline__ void unpack(const Raw& w, float (&v)[kChunk]) const {
    unpack8(w, v);
  }
  __device__ __forceinline__ void load8(int64_t r, int64_t c, float (&v)[kChunk]) const {
    unpack(fetch(r, c), v);
  }
};

// gate_up's 1x128 FP8 copy: codes (rows, n), K-major scale_inv (rows, groups), read as T.
template <typename T>
struct Fp8GateUp {
  struct Raw {
    uint2 codes;
    float scale;
  };
  const uint8_t* data;
  const float* scale_inv;
  int64_t n, groups;
  Fp8Format format;
  __device__ __forceinline__ float value(uint32_t code, float s) const {
    const float v = rn::mul(fp8_to_float(static_cast<uint8_t>(code), format), s);
    if constexpr (sizeof(T) == 4)
      return v;
    else
      return bf16_to_float(float_to_bf16(v));
  }
  __device__ __forceinline__ float load(int64_t r, int64_t j) const {
    return value(data[r * n + j], scale_inv[r * groups + j / kGroup]);
  }
  __device__ __forceinline__ Raw fetch(int64_t r, int64_t c) const {
    return {__ldcs(reinterpret_cast<const uint2*>(data + r * n + c)),
            scale_inv[r * groups + c / kGroup]};
  }
  // The raw words of 8 zeros, for lanes past the row: scale 1.0 keeps them on unpack's
  // power-of-two path (a zero scale would send the whole warp through the rounding path).
  __device__ __forceinline__ static Raw zero() { return {make_uint2(0, 0), 1.0f}; }
  bool e4m3() const { return format == Fp8Format::kE4M3; }
  // The vectorised path: each pair of codes decoded by the hardware (cvt.rn.f16x2.e4m3x2 or
  // .e5m2x2, exact for every code: FP16 holds every E4M3 and E5M2 value, NaN and inf included),
  // widened to FP32 (exact), times the scale as value() does; for BF16 the pair is rounded by
  // cvt.rn.bf16x2.f32, float_to_bf16's rounding (the product of a NaN is the GPU's canonical
  // 0x7FFFFFFF, which both turn into 0x7FFF). So value()'s bits, in a few instructions a pair
  // instead of a software decode per element.
  //   For BF16, when the scale is a power of two in [2^-100, 2^100] (a pow2 recipe's scales always
  // are) the rounding is skipped: a code has at most 4 significant bits and its product with such
  // a scale is a normal FP32 number, so BF16 holds it exactly. (A NaN code then keeps the
  // product's NaN 0x7FFFFFFF instead of 0x7FFF0000: the kernels only compute with these values,
  // and every NaN operand gives the same result.)
  //   kE4M3: the caller knows the copy is E4M3 (the launcher checked `format`), so only that
  // conversion is compiled, not one for each format under a predicate.
  template <bool kE4M3 = false>
  __device__ __forceinline__ void unpack(const Raw& w, float (&v)[kChunk]) const {
    const __nv_fp8_interpretation_t kind =
        kE4M3 || format == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
    const uint32_t x[2] = {w.codes.x, w.codes.y};
    float2 f[kChunk / 2];
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i)
      f[i] = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((x[i / 2] >> (16 * (i % 2))) & 0xFFFFu), kind)));
    const uint32_t sb = float_bits(w.scale);
    if (sizeof(T) == 4 || ((sb & 0x807FFFFFu) == 0 && sb - (27u << 23) <= (200u << 23))) {
#pragma unroll
      for (int i = 0; i < kChunk / 2; ++i)
        v[2 * i] = rn::mul(f[i].x, w.scale), v[2 * i + 1] = rn::mul(f[i].y, w.scale);
      return;
    }
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) {
      const float a = rn::mul(f[i].x, w.scale), b = rn::mul(f[i].y, w.scale);
      uint32_t p;  // b goes to the upper half
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(b), "f"(a));
      v[2 * i] = bits_float(p << 16), v[2 * i + 1] = bits_float(p & 0xFFFF0000u);
    }
  }
  __device__ __forceinline__ void load8(int64_t r, int64_t c, float (&v)[kChunk]) const {
    unpack(fetch(r, c), v);
  }
};

}  // namespace octet::cuda::swiglu_kernels
