// Shared by rope_key_test.cpp and rope_key_gpu_test.cpp: rope_key.h's fused forward and backward
// against the composition they replace (rope_forward / rope_backward and copy_columns), bitwise,
// on one context.
#pragma once

#include <string>

#include "backend/backend.h"
#include "ops/layout/layout.h"
#include "ops/rope/rope_key.h"
#include "test_util.h"

namespace octet::test {

struct RopeKeyCase {
  int64_t B, T, H, nope, rope, kv_width, kr_width, kr_col;
  RopePairing pairing;
  DType dtype;
};

struct RopeKeyOut {
  Tensor k, grad_kv, grad_kr;  // host
};

// The fused ops (fused = true, the forward's CUDA kernel picked by `kernel`) or the composition, on
// random inputs of the case; grad_kv and grad_kr start as random values so that the columns the
// backward must not touch are checked too.
inline RopeKeyOut run_rope_key(Context& ctx, const RopeKeyCase& c, bool fused, uint64_t seed,
                               RopeKeyKernel kernel = RopeKeyKernel::kAuto) {
  const Device dev = ctx.device;
  const RopeTable tb = make_rope_table(ctx, c.T + 3, c.rope, 10000.0);
  const Tensor kv = random_tensor({c.B, c.T, c.H, c.kv_width}, c.dtype, seed).to(ctx, dev);
  const Tensor kr = random_tensor({c.B, c.T, c.kr_width}, c.dtype, seed + 1).to(ctx, dev);
  const Tensor dk = random_tensor({c.B, c.T, c.H, c.nope + c.rope}, c.dtype, seed + 2).to(ctx, dev);
  Tensor dkv = random_tensor({c.B, c.T, c.H, c.kv_width}, c.dtype, seed + 3).to(ctx, dev);
  Tensor dkr = random_tensor({c.B, c.T, c.kr_width}, c.dtype, seed + 4).to(ctx, dev);
  const int64_t N = c.B * c.T, R = N * c.H, dqk = c.nope + c.rope;
  RopeKeyOut out;
  if (fused) {
    out.k = rope_key_forward(ctx, {.kv = kv,
                                   .nope = c.nope,
                                   .kr = kr,
                                   .kr_col = c.kr_col,
                                   .table = tb,
                                   .pairing = c.pairing,
                                   .kernel = kernel})
                .to_host(ctx);
    rope_key_backward(ctx, {.grad_k = dk,
                            .grad_kv = dkv,
                            .grad_kr = dkr,
                            .kr_col = c.kr_col,
                            .table = tb,
                            .pairing = c.pairing});
  } else {
    const Tensor kr_rot =
        rope_forward(ctx, {.input = kr, .table = tb, .pairing = c.pairing, .offset = c.kr_col});
    Tensor k = Tensor::empty(ctx, {c.B, c.T, c.H, dqk}, c.dtype);
    copy_columns(ctx, {.src = kv.reshape({R, c.kv_width}), .dst = k, .width = c.nope});
    copy_columns(ctx, {.src = kr_rot.reshape({N, c.kr_width}),
                       .src_col = c.kr_col,
                       .dst = k,
                       .dst_col = c.nope,
                       .width = c.rope,
                       .repeat = c.H,
                       .mode = CopyMode::kBroadcast});
    out.k = k.to_host(ctx);
    copy_columns(ctx, {.src = dk, .dst = dkv.reshape({R, c.kv_width}), .width = c.nope});
    // The old layout: the head sum into the rope columns of a copy of grad_kr, rope_backward
    // over the whole row, then only the rope columns taken back (the others must stay as given).
    Tensor sum = dkr.to(ctx, dev);
    copy_columns(ctx, {.src = dk.reshape({R, dqk}),
                       .src_col = c.nope,
                       .dst = sum.reshape({N, c.kr_width}),
                       .dst_col = c.kr_col,
                       .width = c.rope,
                       .repeat = c.H,
                       .mode = CopyMode::kSum});
    const Tensor back =
        rope_backward(ctx, {.input = sum, .table = tb, .pairing = c.pairing, .offset = c.kr_col});
    copy_columns(ctx, {.src = back.reshape({N, c.kr_width}),
                       .src_col = c.kr_col,
                       .dst = dkr.reshape({N, c.kr_width}),
                       .dst_col = c.kr_col,
                       .width = c.rope});
  }
  out.grad_kv = dkv.to_host(ctx);
  out.grad_kr = dkr.to_host(ctx);
  return out;
}

inline void expect_rope_key_matches_composition(Context& ctx, const RopeKeyCase& c, uint64_t seed) {
  const std::string where = "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
                            " H=" + std::to_string(c.H) + " dn=" + std::to_string(c.nope) +
                            " d=" + std::to_string(c.rope) +
                            (c.pairing == RopePairing::kInterleave ? " interleave" : " half") +
                            " " + std::string(dtype_name(c.dtype));
  const RopeKeyOut got = run_rope_key(ctx, c, true, seed);
  const RopeKeyOut want = run_rope_key(ctx, c, false, seed);
  EXPECT_TRUE(bitwise_equal(want.k, got.k)) << where << ": k";
  EXPECT_TRUE(bitwise_equal(want.grad_kv, got.grad_kv)) << where << ": grad_kv";
  EXPECT_TRUE(bitwise_equal(want.grad_kr, got.grad_kr)) << where << ": grad_kr";
}

}  // namespace octet::test
