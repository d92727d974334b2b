// Dispatcher for rope_key.h: validates once, allocates the forward's output, routes to cpu:: or
// cuda::.
#include "ops/rope/rope_key.h"

#include "backend/dispatch.h"
#include "ops/layout/layout.h"
#include "ops/rope/rope_backends.h"

namespace octet {
namespace {

// kv (B, T, H, Wkv) and kr (B, T, Wr) of one dtype on the context's device, kr's window inside Wr.
RopeKeyGeometry geometry(Context& ctx, const Tensor& kv, const char* kv_name, const Tensor& kr,
                         const char* kr_name, int64_t kr_col, const RopeTable& tb, const char* op) {
  check_dtype(kv, kv_name, {DType::kF32, DType::kBF16});
  check_device(kv, kv_name, ctx.device);
  check_device(kr, kr_name, ctx.device);
  OCTET_CHECK(kv.rank() == 4, op, ": ", kv_name, " must be (B, T, H, W), got ",
              shape_str(kv.shape()));
  OCTET_CHECK(kr.rank() == 3 && kr.size(0) == kv.size(0) && kr.size(1) == kv.size(1), op, ": ",
              kr_name, " must be (B, T, W) with the B, T of ", kv_name, " ", shape_str(kv.shape()),
              ", got ", shape_str(kr.shape()));
  OCTET_CHECK(kr.dtype() == kv.dtype(), op, ": ", kr_name, " has dtype ", dtype_name(kr.dtype()),
              ", expected ", dtype_name(kv.dtype()), " (that of ", kv_name, ")");
  check_rope_table(ctx, tb, kv.size(1), op);
  RopeKeyGeometry g;
  g.batch = kv.size(0);
  g.seq = kv.size(1);
  g.heads = kv.size(2);
  g.kv_width = kv.size(3);
  g.kr_width = kr.size(2);
  g.rope = tb.rope_dim;
  OCTET_CHECK(kr_col >= 0 && kr_col + g.rope <= g.kr_width, op, ": the rope key's columns [",
              kr_col, ", ", kr_col + g.rope, ") do not fit in ", kr_name, "'s W = ", g.kr_width);
  return g;
}

}  // namespace

Tensor rope_key_forward(Context& ctx, const RopeKeyArgs& a) {
  RopeKeyGeometry g = geometry(ctx, a.kv, "kv", a.kr, "kr", a.kr_col, a.table, "rope_key_forward");
  OCTET_CHECK(a.nope >= 0 && a.nope <= g.kv_width, "rope_key_forward: nope = ", a.nope,
              " must be in [0, W] of kv ", shape_str(a.kv.shape()));
  g.nope = a.nope;
  Tensor k = Tensor::empty(ctx, {g.batch, g.seq, g.heads, g.nope + g.rope}, a.kv.dtype());
  if (k.numel() == 0) return k;
  OCTET_DISPATCH(ctx, rope_key_forward, ctx, a, g, k);
  return k;
}

void rope_key_backward(Context& ctx, const RopeKeyBackwardArgs& a) {
  RopeKeyGeometry g = geometry(ctx, a.grad_kv, "grad_kv", a.grad_kr, "grad_kr", a.kr_col, a.table,
                               "rope_key_backward");
  const Tensor& dk = a.grad_k;
  check_device(dk, "grad_k", ctx.device);
  OCTET_CHECK(dk.dtype() == a.grad_kv.dtype(), "rope_key_backward: grad_k has dtype ",
              dtype_name(dk.dtype()), ", expected ", dtype_name(a.grad_kv.dtype()),
              " (that of grad_kv)");
  OCTET_CHECK(dk.rank() == 4 && dk.size(0) == g.batch && dk.size(1) == g.seq &&
                  dk.size(2) == g.heads && dk.size(3) >= g.rope,
              "rope_key_backward: grad_k must be (B, T, H, dn + d) with the B, T, H of grad_kv ",
              shape_str(a.grad_kv.shape()), " and d = ", g.rope, ", got ", shape_str(dk.shape()));
  g.nope = dk.size(3) - g.rope;
  OCTET_CHECK(g.nope <= g.kv_width, "rope_key_backward: grad_k's dn = ", g.nope,
              " columns do not fit in grad_kv's W = ", g.kv_width);
  if (dk.numel() == 0) return;
  // The nope columns are a plain column copy (layout.h's 16-byte kernel on CUDA); the backend
  // sums and rotates the rope part.
  const int64_t rows = g.batch * g.seq * g.heads;
  copy_columns(ctx, {.src = dk.reshape({rows, g.nope + g.rope}),
                     .dst = a.grad_kv.reshape({rows, g.kv_width}),
                     .width = g.nope});
  OCTET_DISPATCH(ctx, rope_key_backward, ctx, a, g);
}

}  // namespace octet
