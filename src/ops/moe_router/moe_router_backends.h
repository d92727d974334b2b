// Internal: the per-backend implementations behind moe_router.h. Arguments are validated and
// outputs allocated by moe_router.cpp; these functions only compute.
#pragma once

#include "ops/moe_router/moe_router.h"

namespace octet {

#define OCTET_MOE_ROUTER_BACKEND_DECLS                                                           \
  void moe_router_forward(Context& ctx, const RouterForwardArgs& args, RouterOutput& out);       \
  void moe_router_backward(Context& ctx, const RouterBackwardArgs& args, Tensor& d_logits);      \
  void moe_router_bias_update(Context& ctx, const RouterBiasUpdateArgs& args);                   \
  void moe_seq_balance_loss_forward(Context& ctx, const SeqBalanceLossArgs& args, Tensor& loss); \
  void moe_seq_balance_loss_backward(Context& ctx, const SeqBalanceLossArgs& args, float d_loss, \
                                     Tensor& d_logits);

namespace cpu {
OCTET_MOE_ROUTER_BACKEND_DECLS
}
namespace cuda {
OCTET_MOE_ROUTER_BACKEND_DECLS
}

#undef OCTET_MOE_ROUTER_BACKEND_DECLS

}  // namespace octet
