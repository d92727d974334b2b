// Internal: the per-backend implementations behind embedding.h. Arguments are validated by
// embedding.cpp (rows >= 1); these functions only compute.
#pragma once

#include "ops/embedding/embedding.h"

namespace octet {

#define OCTET_EMBEDDING_BACKEND_DECLS                                     \
  void embedding_forward(Context& ctx, const EmbeddingForwardArgs& args); \
  void embedding_backward(Context& ctx, const EmbeddingBackwardArgs& args);

namespace cpu {
OCTET_EMBEDDING_BACKEND_DECLS
}
namespace cuda {
OCTET_EMBEDDING_BACKEND_DECLS
}

#undef OCTET_EMBEDDING_BACKEND_DECLS

}  // namespace octet
