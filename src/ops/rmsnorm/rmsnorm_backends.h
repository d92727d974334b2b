// Internal: the per-backend implementations behind rmsnorm.h. Arguments are validated by
// rmsnorm.cpp (shapes, dtypes, devices, rows >= 1); these functions only compute.
#pragma once

#include "ops/rmsnorm/rmsnorm.h"

namespace octet {

#define OCTET_RMSNORM_BACKEND_DECLS                                   \
  void rmsnorm_forward(Context& ctx, const RmsNormForwardArgs& args); \
  void rmsnorm_backward(Context& ctx, const RmsNormBackwardArgs& args);

namespace cpu {
OCTET_RMSNORM_BACKEND_DECLS
}
namespace cuda {
OCTET_RMSNORM_BACKEND_DECLS
}

#undef OCTET_RMSNORM_BACKEND_DECLS

}  // namespace octet
