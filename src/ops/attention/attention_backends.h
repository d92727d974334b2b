// Internal: the per-backend implementations behind attention.h. Arguments are validated, the
// softmax scale resolved and outputs allocated by attention.cpp; these functions only compute.
#pragma once

#include "ops/attention/attention.h"

namespace octet {

struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0;
  int dqk = 0, dv = 0;
  float scale = 0.0f;  // resolved softmax scale
  // Row strides in elements (HeadView::row_stride): dqk / dv for compact operands.
  int64_t ld_q = 0, ld_k = 0, ld_v = 0, ld_dv = 0;
  // H of the whole tensors, which their strides keep when a call runs a chunk of `heads` of them
  // (the CUDA backward's head chunks, attention.h); 0: heads.
  int64_t row_heads = 0;
};

#define OCTET_ATTENTION_BACKEND_DECLS                                                             \
  void attention_forward(Context& ctx, const AttentionForwardArgs& args, const AttentionShape& s, \
                         AttentionForwardResult& out);                                            \
  void attention_backward(Context& ctx, const AttentionBackwardArgs& args,                        \
                          const AttentionShape& s, AttentionGrads& out);

namespace cpu {
OCTET_ATTENTION_BACKEND_DECLS
}
namespace cuda {
OCTET_ATTENTION_BACKEND_DECLS
// Throws when the loaded cuDNN cannot run these head dims (attention_cudnn.cpp).
void attention_check_support(int dqk, int dv);
// The cuDNN workspaces of the shape's graphs (building them if needed); the backward's chunked
// under max_backward_workspace (0: the default cap).
AttentionWorkspace attention_workspace(Context& ctx, const AttentionShape& s,
                                       int64_t max_backward_workspace);
}  // namespace cuda

#undef OCTET_ATTENTION_BACKEND_DECLS

}  // namespace octet
