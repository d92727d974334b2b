// Internal: the per-backend implementations behind rope.h. Arguments are validated and outputs
// allocated by rope.cpp; these functions only compute.
#pragma once

#include "ops/rope/rope.h"

namespace octet {

enum class RopeDirection : uint8_t { kForward, kBackward };

// (rows, W) view of the input: rows = B * T * H, row r has position (r / H) % T.
struct RopeGeometry {
  int64_t rows = 0, width = 0, heads = 1, seq = 1;
};

#define OCTET_ROPE_BACKEND_DECLS                                                          \
  void rope(Context& ctx, const RopeArgs& args, const RopeGeometry& g, RopeDirection dir, \
            Tensor& out);

namespace cpu {
OCTET_ROPE_BACKEND_DECLS
}
namespace cuda {
OCTET_ROPE_BACKEND_DECLS
}

#undef OCTET_ROPE_BACKEND_DECLS

}  // namespace octet
