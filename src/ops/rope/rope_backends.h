// Internal: the per-backend implementations behind rope.h. Arguments are validated and outputs
// allocated by rope.cpp; these functions only compute.
#pragma once

#include "ops/rope/rope.h"
#include "ops/rope/rope_key.h"

namespace octet {

enum class RopeDirection : uint8_t { kForward, kBackward };

// (rows, W) view of the input: rows = B * T * H, row r has position (r / H) % T.
struct RopeGeometry {
  int64_t rows = 0, width = 0, heads = 1, seq = 1;
};

// rope_key.h's shapes: B, T, H, the key's dn and d, and the row widths of kv and kr.
struct RopeKeyGeometry {
  int64_t batch = 0, seq = 0, heads = 0, nope = 0, rope = 0, kv_width = 0, kr_width = 0;
};

#define OCTET_ROPE_BACKEND_DECLS                                                          \
  void rope(Context& ctx, const RopeArgs& args, const RopeGeometry& g, RopeDirection dir, \
            Tensor& out);                                                                 \
  void rope_key_forward(Context& ctx, const RopeKeyArgs& args, const RopeKeyGeometry& g,  \
                        Tensor& k);                                                       \
  /* the rope part only: rope_key.cpp copies the nope columns */                          \
  void rope_key_backward(Context& ctx, const RopeKeyBackwardArgs& args, const RopeKeyGeometry& g);

namespace cpu {
OCTET_ROPE_BACKEND_DECLS
}
namespace cuda {
OCTET_ROPE_BACKEND_DECLS
}

#undef OCTET_ROPE_BACKEND_DECLS

}  // namespace octet
