// The fused residual adds of rmsnorm.h against what they stand for (add_into, then the plain call),
// bit for bit, on the given backend: shared by the CPU test and the CUDA test.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "norm_act_test_util.h"
#include "ops/cast/cast.h"
#include "ops/rmsnorm/rmsnorm.h"

namespace octet::test {

inline void expect_residual_fusion_exact(Context& ctx, int64_t rows, int64_t d, DType dt,
                                         uint64_t seed) {
  const std::string where = "rows " + std::to_string(rows) + " D " + std::to_string(d) + " " +
                            std::string(dtype_name(dt));
  auto put = [&](const Tensor& t) {
    return ctx.device == Device::kCuda ? t.to(ctx, Device::kCuda) : t.to_host(ctx);
  };
  const Tensor x = random_tensor({rows, d}, dt, seed, Dist::kOutliers);
  const Tensor r = random_tensor({rows, d}, dt, seed + 1, Dist::kGaussian);
  const Tensor w = random_tensor({d}, DType::kF32, seed + 2);
  const Tensor dy = random_tensor({rows, d}, dt, seed + 3);
  const Tensor rg = random_tensor({rows, d}, dt, seed + 4);
  const Tensor dw0 = random_tensor({d}, DType::kF32, seed + 5);
  auto fresh = [&](DType t) { return Tensor::empty(ctx, {rows, d}, t); };
  // Unfused: x + r, the norm, its backward, + rg.
  Tensor xa = put(x), ya = fresh(dt), ra = Tensor::empty(ctx, {rows}, DType::kF32), dxa = fresh(dt),
         dwa = put(dw0);
  add_into(ctx, xa, put(r));
  rmsnorm_forward(ctx, {.x = xa, .weight = put(w), .epsilon = 1e-6f, .y = ya, .rstd = ra});
  rmsnorm_backward(
      ctx, {.dy = put(dy), .x = xa, .weight = put(w), .rstd = ra, .dx = dxa, .dweight = dwa});
  add_into(ctx, dxa, put(rg));
  // Fused.
  Tensor xb = put(x), yb = fresh(dt), rb = Tensor::empty(ctx, {rows}, DType::kF32), dxb = fresh(dt),
         dwb = put(dw0);
  rmsnorm_forward(
      ctx, {.x = xb, .weight = put(w), .epsilon = 1e-6f, .y = yb, .rstd = rb, .residual = put(r)});
  rmsnorm_backward(ctx, {.dy = put(dy),
                         .x = xb,
                         .weight = put(w),
                         .rstd = rb,
                         .dx = dxb,
                         .dweight = dwb,
                         .residual_grad = put(rg)});
  EXPECT_TRUE(bitwise_equal(xa.to_host(ctx), xb.to_host(ctx))) << where << ": x + residual";
  EXPECT_TRUE(bitwise_equal(ya.to_host(ctx), yb.to_host(ctx))) << where << ": y";
  EXPECT_TRUE(bitwise_equal(ra.to_host(ctx), rb.to_host(ctx))) << where << ": rstd";
  EXPECT_TRUE(bitwise_equal(dxa.to_host(ctx), dxb.to_host(ctx))) << where << ": dx + residual_grad";
  EXPECT_TRUE(bitwise_equal(dwa.to_host(ctx), dwb.to_host(ctx))) << where << ": dw";
}

}  // namespace octet::test
