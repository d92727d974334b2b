// Internal: the per-backend implementations behind step_verdict.h (validated by step_verdict.cpp).
#pragma once

#include "ops/step_verdict/step_verdict.h"

namespace octet {

#define OCTET_VERDICT_BACKEND_DECLS                                    \
  void step_loss_verdict(Context& ctx, const StepVerdictArgs& args);   \
  void step_remember_loss(Context& ctx, const RememberLossArgs& args); \
  void sum_counts_unless_skipped(Context& ctx, const SumCountsArgs& args);

namespace cpu {
OCTET_VERDICT_BACKEND_DECLS
}
namespace cuda {
OCTET_VERDICT_BACKEND_DECLS
}

#undef OCTET_VERDICT_BACKEND_DECLS

}  // namespace octet
