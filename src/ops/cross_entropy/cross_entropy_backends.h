// Internal: the per-backend implementations behind cross_entropy.h. Arguments are validated by
// cross_entropy.cpp (rows >= 1, V >= 1); these functions only compute.
#pragma once

#include "ops/cross_entropy/cross_entropy.h"

namespace octet {

#define OCTET_CROSS_ENTROPY_BACKEND_DECLS                                  \
  void cross_entropy_rows(Context& ctx, const CrossEntropyRowsArgs& args); \
  void cross_entropy_mean(Context& ctx, const CrossEntropyMeanArgs& args); \
  void cross_entropy_backward(Context& ctx, const CrossEntropyBackwardArgs& args);

namespace cpu {
OCTET_CROSS_ENTROPY_BACKEND_DECLS
}
namespace cuda {
OCTET_CROSS_ENTROPY_BACKEND_DECLS
}

#undef OCTET_CROSS_ENTROPY_BACKEND_DECLS

}  // namespace octet
