// Internal: the per-backend implementations behind quantize.h. Arguments are validated and outputs
// allocated by quantize.cpp; these functions only compute.
#pragma once

#include <cstdint>

#include "core/backend_interface.h"
#include "ops/quantize/quantize.h"

namespace octet {

#define OCTET_QUANTIZE_BACKEND_DECLS                                                               \
  void quantize(Context& ctx, const QuantizeArgs& args, QuantTensor& out);                         \
  void dequantize(Context& ctx, const Tensor& data, const Tensor& scale_inv, Granularity g,        \
                  Fp8Format f, Tensor& out);                                                       \
  void amax(Context& ctx, const Tensor& x, Tensor& out);                                           \
  void scaling_aware_transpose(Context& ctx, const QuantTensor& in, Tensor& cdata, Tensor& cscale, \
                               Granularity cgran);                                                 \
  void delayed_scaling_update(Context& ctx, DelayedScaling& state, const Tensor& amax,             \
                              int64_t step, AmaxReduction reduce, const ScaleRule& rule);

namespace cpu {
OCTET_QUANTIZE_BACKEND_DECLS
}
namespace cuda {
OCTET_QUANTIZE_BACKEND_DECLS
// scaling_aware_transpose of the row gather out[r] = in[row_src[r]] (row_src (R) int32, -1: a row
// of zero codes with scale_inv 1.0), without storing the gather: moe_permute_transposed's device
// code (ops/moe_permute). cdata (cols, R), cscale in `columnwise` granularity (as
// scaling_aware_transpose writes it).
void scaling_aware_transpose_gathered(Context& ctx, const QuantTensor& in, const Tensor& row_src,
                                      Tensor& cdata, Tensor& cscale, Granularity columnwise);
// scaling_aware_transpose through the kernel the 16-byte one replaced (bit for bit the same
// outputs): `octet bench quantize` times both in one run, the GPU tests compare them.
void scaling_aware_transpose_legacy(Context& ctx, const QuantTensor& in, Tensor& cdata,
                                    Tensor& cscale);
}  // namespace cuda

#undef OCTET_QUANTIZE_BACKEND_DECLS

// A result's amax word (FP32 bits) for a CUDA kernel's atomicMax, or null when the caller did not
// want it (QuantizeArgs::amax and its kin false: the QuantTensor has none), so that the kernel
// skips its atomics.
inline uint32_t* amax_bits_of(const QuantTensor& q) {
  return q.amax.defined() ? static_cast<uint32_t*>(q.amax.data()) : nullptr;
}

// amax_bits_of, zeroed first on ctx's stream (nothing to zero when null): what a quantizing
// launcher hands its kernel.
inline uint32_t* zeroed_amax_bits(Context& ctx, const QuantTensor& q) {
  uint32_t* bits = amax_bits_of(q);
  if (bits != nullptr) ctx.be().memset(bits, 0, sizeof(uint32_t));
  return bits;
}

}  // namespace octet
