// Internal: the per-backend implementations behind grouped_gemm.h. grouped_gemm.cpp validates the
// arguments and reads the row counts to the host once; these functions only compute.
#pragma once

#include <vector>

#include "ops/grouped_gemm/grouped_gemm.h"

namespace octet {

// Host copy of the contiguous layout: expert e owns rows (or token columns) [offset[e], offset[e] +
// size[e]).
struct GroupLayout {
  std::vector<int64_t> size;
  std::vector<int64_t> offset;
  int64_t experts() const { return static_cast<int64_t>(size.size()); }
};

#define OCTET_GROUPED_GEMM_BACKEND_DECLS                                                          \
  void grouped_gemm_fp8(Context& ctx, const GroupedGemmFp8Args& args, const GroupLayout& layout); \
  void grouped_gemm_bf16(Context& ctx, const GroupedGemmBf16Args& args,                           \
                         const GroupLayout& layout);                                              \
  void grouped_wgrad_fp8(Context& ctx, const GroupedWgradFp8Args& args,                           \
                         const GroupLayout& layout);                                              \
  void grouped_wgrad_bf16(Context& ctx, const GroupedWgradBf16Args& args,                         \
                          const GroupLayout& layout);

namespace cpu {
OCTET_GROUPED_GEMM_BACKEND_DECLS
}
namespace cuda {
OCTET_GROUPED_GEMM_BACKEND_DECLS
}

#undef OCTET_GROUPED_GEMM_BACKEND_DECLS

}  // namespace octet
