// Internal: the per-backend implementations behind swiglu.h. Arguments are validated and the
// QuantTensors allocated by swiglu.cpp (rows >= 1); these functions only compute. gate_up_out (null
// when not asked for) receives gate_up's own 1x128 copy with its format and rounding, epsilon 0.
// swiglu_backward_quantize fills out.h when args.want_h (swiglu.h).
#pragma once

#include <cstdint>

#include "ops/quantize/quantize_backends.h"  // amax_bits_of, zeroed_amax_bits
#include "ops/swiglu/swiglu.h"

namespace octet {

#define OCTET_SWIGLU_BACKEND_DECLS                                                     \
  void swiglu_forward(Context& ctx, const SwigluForwardArgs& args);                    \
  void swiglu_backward(Context& ctx, const SwigluBackwardArgs& args);                  \
  void swiglu_quantize(Context& ctx, const SwigluQuantizeArgs& args, QuantTensor& out, \
                       QuantTensor* gate_up_out);                                      \
  void swiglu_backward_quantize(Context& ctx, const SwigluBackwardQuantizeArgs& args,  \
                                SwigluBackwardQuantizeResult& out);

namespace cpu {
OCTET_SWIGLU_BACKEND_DECLS
}
namespace cuda {
OCTET_SWIGLU_BACKEND_DECLS
}

#undef OCTET_SWIGLU_BACKEND_DECLS

// swiglu_quantize's arguments for the h that want_h asks of swiglu_backward_quantize (swiglu.h):
// the backends that do not fuse it call their swiglu_quantize with these.
inline SwigluQuantizeArgs h_quantize_args(const SwigluBackwardQuantizeArgs& a) {
  return {.gate_up = a.gate_up,
          .format = a.h_format,
          .rounding = a.h_rounding,
          .epsilon = 0.0f,
          .row_weight = a.row_weight,
          .gate_up_fp8 = a.gate_up_fp8,
          .gate_up_dtype = a.dh.dtype(),
          .amax = a.amax};
}

}  // namespace octet
