// Internal: the per-backend implementations behind init_normal.h; init_normal.cpp validated the
// arguments.
#pragma once

#include "ops/init/init_normal.h"

namespace octet {

namespace cpu {
InitNormalStats init_normal(Context& ctx, const InitNormalArgs& args);
void init_fill(Context& ctx, Tensor& out, float value);
// Element k of the stream's tensor: the one definition of the host's value, which the CUDA
// backend's host fix-up also calls.
float init_normal_value(uint64_t seed, uint64_t stream, double std, int64_t k);
}  // namespace cpu
namespace cuda {
InitNormalStats init_normal(Context& ctx, const InitNormalArgs& args);
void init_fill(Context& ctx, Tensor& out, float value);
}  // namespace cuda

}  // namespace octet
