// The casts of one MoE layer, counted (core/cast_counter.h): one forward and one backward of a
// small MoE layer under a recipe on the CPU, with the ops' counter attached. The counts depend on
// the dataflow only, not on the shapes, so `octet describe`, `octet moe-report` and the tests show
// what the model actually executes rather than a table of claims.
#pragma once

#include "core/cast_counter.h"
#include "numerics/recipe.h"

namespace octet {

struct MoeCastCounts {
  CastCounts routed;  // router, dispatch, routed experts, combine (scope "moe.routed")
  CastCounts shared;  // the shared experts (scope "moe.shared")
};

// recompute_down false: the layer keeps h and the experts' outputs (model.moe_recompute = false).
MoeCastCounts count_moe_casts(const Recipe& recipe, bool recompute_down = true);

// One line per recipe: "quantize Q, fused F, dequantize D, FP8 transposes X; explicit casts Q + D".
std::string format_cast_counts(const CastCounts& c);

}  // namespace octet
