// Routes an op to its cpu:: or cuda:: implementation by the context's device. In a build without
// CUDA the cuda:: side does not exist and a CUDA context cannot be made, so the branch only throws.
#pragma once

#include "core/context.h"

namespace octet::detail {
[[noreturn]] inline void no_cuda(const char* op) {
  OCTET_THROW(op, ": this octet was built without CUDA");
}
}  // namespace octet::detail

#if OCTET_WITH_CUDA
#define OCTET_DISPATCH(ctx, fn, ...) \
  ((ctx).device == ::octet::Device::kCpu ? cpu::fn(__VA_ARGS__) : cuda::fn(__VA_ARGS__))
#else
#define OCTET_DISPATCH(ctx, fn, ...) \
  ((ctx).device == ::octet::Device::kCpu ? cpu::fn(__VA_ARGS__) : ::octet::detail::no_cuda(#fn))
#endif
