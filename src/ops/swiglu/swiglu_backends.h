// Internal: the per-backend implementations behind swiglu.h. Arguments are validated and the
// QuantTensors allocated by swiglu.cpp (rows >= 1); these functions only compute. gate_up_out (null
// when not asked for) receives gate_up's own 1x128 copy with its format and rounding, epsilon 0.
#pragma once

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

}  // namespace octet
