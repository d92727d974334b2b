// Dispatcher for init_normal.h: validates once, routes to cpu:: or cuda::.
#include "ops/init/init_normal.h"

#include <cmath>

#include "backend/backend.h"
#include "backend/dispatch.h"
#include "ops/init/init_backends.h"

namespace octet {
namespace {

void check_out(const Context& ctx, const Tensor& t, const char* op) {
  check_dtype(t, op, {DType::kF32});
  check_device(t, op, ctx.device);
  OCTET_CHECK(t.data() != nullptr || t.numel() == 0, op, ": tensor has no storage");
}

}  // namespace

InitNormalStats init_normal(Context& ctx, const InitNormalArgs& a) {
  check_out(ctx, a.out, "init_normal out");
  OCTET_CHECK(std::isfinite(a.std) && a.std >= 0.0,
              "init_normal: std must be finite and >= 0, got ", a.std);
  OCTET_CHECK(a.margin_log2 >= 8 && a.margin_log2 <= 50,
              "init_normal: margin_log2 must be in [8, 50], got ", a.margin_log2);
  if (a.out.numel() == 0) return {};
  if (ctx.device == Device::kCpu) return cpu::init_normal(ctx, a);
#if OCTET_WITH_CUDA
  return cuda::init_normal(ctx, a);
#else
  detail::no_cuda("init_normal");
#endif
}

void init_fill(Context& ctx, Tensor& out, float value) {
  check_out(ctx, out, "init_fill out");
  if (out.numel() == 0) return;
  OCTET_DISPATCH(ctx, init_fill, ctx, out, value);
}

float init_normal_value(uint64_t seed, uint64_t stream, double std, int64_t k) {
  return cpu::init_normal_value(seed, stream, std, k);
}

}  // namespace octet
