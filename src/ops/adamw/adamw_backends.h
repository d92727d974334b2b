// Internal: the per-backend implementations behind adamw.h. Arguments are validated, outputs
// allocated and the step's FP32 constants computed (once, on the host) by adamw.cpp; these
// functions only compute.
#pragma once

#include <vector>

#include "ops/adamw/adamw.h"

namespace octet {

// The per-call constants of the AdamW arithmetic in adamw.h, identical for both backends.
struct AdamWConsts {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float decay;      // 1 - lr * weight_decay
  float step_size;  // lr / (1 - beta1^step)
  float bc2_sqrt;   // sqrt(1 - beta2^step)
  float eps;
};

static_assert(sizeof(AdamWConsts) == kAdamWConstsFloats * sizeof(float),
              "adamw_device_consts writes AdamWConsts as floats");

// The fixed reduction shape of global_grad_norm (adamw.h).
inline constexpr int kNormLanes = 256;
inline constexpr int kNormRounds = 16;
inline constexpr int64_t kNormChunk = int64_t{kNormLanes} * kNormRounds;
inline constexpr float kClipEpsilon = 1e-6f;  // torch.nn.utils.clip_grad_norm_

#define OCTET_ADAMW_BACKEND_DECLS                                                            \
  void adamw_step(Context& ctx, const AdamWArgs& args, const AdamWConsts& k);                \
  void global_grad_norm(Context& ctx, const std::vector<Tensor>& grads, Tensor& norm);       \
  void grad_clip_coefficient(Context& ctx, const Tensor& norm, float max_norm, Tensor& out); \
  void nonfinite_flag(Context& ctx, const std::vector<Tensor>& grads, Tensor& flag);         \
  void adamw_device_consts(Context& ctx, const AdamWDeviceConstsArgs& args);                 \
  void adamw_advance_steps(Context& ctx, const Tensor& steps, const Tensor& skipped);

namespace cpu {
OCTET_ADAMW_BACKEND_DECLS
}
namespace cuda {
OCTET_ADAMW_BACKEND_DECLS
// adamw_step_block_quantize_many's steps (none empty) and their constants; the CPU composes the
// update and ops/quantize instead (adamw.cpp).
void adamw_step_block_quantize_many(Context& ctx, const std::vector<BlockQuantStep>& steps,
                                    const std::vector<AdamWConsts>& k);
}  // namespace cuda

#undef OCTET_ADAMW_BACKEND_DECLS

}  // namespace octet
