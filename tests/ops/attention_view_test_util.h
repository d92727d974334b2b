// Shared by attention_view_test.cpp and attention_view_gpu_test.cpp: attention on column windows
// (HeadView) of wider tensors against the same values in compact tensors, bitwise. The columns
// around each window hold other random values, so a kernel that reads the wrong columns fails.
#pragma once

#include <cstring>
#include <string>

#include "backend/backend.h"
#include "ops/attention/attention.h"
#include "test_util.h"

namespace octet::test {

// Host (B, T, H, W) tensor of random values with `t` (B, T, H, D) in columns [col, col + D).
inline Tensor widen(const Tensor& t, int64_t W, int64_t col, uint64_t seed) {
  const int64_t D = t.size(3), rows = t.numel() / D, e = dtype_size(t.dtype());
  Tensor w = random_tensor({t.size(0), t.size(1), t.size(2), W}, t.dtype(), seed);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(w.data_as<char>() + (r * W + col) * e, t.data_as<const char>() + r * D * e,
                static_cast<size_t>(D * e));
  return w;
}

// Columns [col, col + D) of a host (B, T, H, W) tensor, compact.
inline Tensor narrow(const Tensor& w, int64_t col, int64_t D) {
  const int64_t W = w.size(3), rows = w.numel() / W, e = dtype_size(w.dtype());
  Tensor t = Tensor::empty({w.size(0), w.size(1), w.size(2), D}, w.dtype());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(t.data_as<char>() + r * D * e, w.data_as<const char>() + (r * W + col) * e,
                static_cast<size_t>(D * e));
  return t;
}

// Whether the host (B, T, H, W) tensors agree bitwise outside columns [col, col + D).
inline ::testing::AssertionResult same_outside(const Tensor& before, const Tensor& after,
                                               int64_t col, int64_t D) {
  const int64_t W = before.size(3), rows = before.numel() / W, e = dtype_size(before.dtype());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < W; ++c) {
      if (c >= col && c < col + D) continue;
      if (std::memcmp(before.data_as<const char>() + (r * W + c) * e,
                      after.data_as<const char>() + (r * W + c) * e, static_cast<size_t>(e)))
        return ::testing::AssertionFailure()
               << "row " << r << ", column " << c << " outside the window [" << col << ", "
               << col + D << ") was written";
    }
  return ::testing::AssertionSuccess();
}

struct ViewCase {
  int64_t B, T, H, dqk, dv;
  int64_t wq, cq, wk, ck, wv, cv;  // widths and first columns of q's, k's and v's base tensors
  int64_t wdv, cdv;                // of grad_v_into's base
};

// Forward and backward on compact q, k, v against the same values as windows of wider tensors
// (and dv written into a window), on ctx's device; every output compared bitwise.
inline void expect_views_match_compact(Context& ctx, const ViewCase& c, DType dtype, uint64_t seed,
                                       bool deterministic = true) {
  const std::string where = "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
                            " H=" + std::to_string(c.H) + " Dqk=" + std::to_string(c.dqk) +
                            " Dv=" + std::to_string(c.dv);
  const Device dev = ctx.device;
  const Tensor q = random_tensor({c.B, c.T, c.H, c.dqk}, dtype, seed);
  const Tensor k = random_tensor({c.B, c.T, c.H, c.dqk}, dtype, seed + 1);
  const Tensor v = random_tensor({c.B, c.T, c.H, c.dv}, dtype, seed + 2);
  const Tensor dO = random_tensor({c.B, c.T, c.H, c.dv}, dtype, seed + 3);
  const Tensor qd = q.to(ctx, dev), kd = k.to(ctx, dev), vd = v.to(ctx, dev);
  const Tensor dOd = dO.to(ctx, dev);
  const Tensor qw = widen(q, c.wq, c.cq, seed + 4).to(ctx, dev);
  const Tensor kw = widen(k, c.wk, c.ck, seed + 5).to(ctx, dev);
  const Tensor vw = widen(v, c.wv, c.cv, seed + 6).to(ctx, dev);
  const HeadView qv(qw, c.cq, c.dqk), kv(kw, c.ck, c.dqk), vv(vw, c.cv, c.dv);

  const auto want = attention_forward(ctx, {.q = qd, .k = kd, .v = vd});
  const auto got = attention_forward(ctx, {.q = qv, .k = kv, .v = vv});
  EXPECT_TRUE(bitwise_equal(want.o.to_host(ctx), got.o.to_host(ctx))) << where << ": o";
  EXPECT_TRUE(bitwise_equal(want.lse.to_host(ctx), got.lse.to_host(ctx))) << where << ": lse";

  const auto gw = attention_backward(ctx, {.q = qd,
                                           .k = kd,
                                           .v = vd,
                                           .o = want.o,
                                           .lse = want.lse,
                                           .grad_o = dOd,
                                           .deterministic = deterministic});
  // dv into a window of a tensor of random values: the columns around it must survive.
  const Tensor dv_before = random_tensor({c.B, c.T, c.H, c.wdv}, dtype, seed + 7);
  const Tensor dvw = dv_before.to(ctx, dev);
  const auto gg = attention_backward(ctx, {.q = qv,
                                           .k = kv,
                                           .v = vv,
                                           .o = got.o,
                                           .lse = got.lse,
                                           .grad_o = dOd,
                                           .deterministic = deterministic,
                                           .grad_v_into = HeadView(dvw, c.cdv, c.dv)});
  EXPECT_EQ(gg.grad_v.data(), nullptr) << "grad_v should stay empty when grad_v_into is given";
  EXPECT_TRUE(bitwise_equal(gw.grad_q.to_host(ctx), gg.grad_q.to_host(ctx))) << where << ": dq";
  EXPECT_TRUE(bitwise_equal(gw.grad_k.to_host(ctx), gg.grad_k.to_host(ctx))) << where << ": dk";
  const Tensor dv_after = dvw.to_host(ctx);
  EXPECT_TRUE(bitwise_equal(gw.grad_v.to_host(ctx), narrow(dv_after, c.cdv, c.dv)))
      << where << ": dv";
  EXPECT_TRUE(same_outside(dv_before, dv_after, c.cdv, c.dv)) << where << ": dv's neighbours";
}

}  // namespace octet::test
