// Dispatcher for rope.h: validates once, allocates outputs, routes to cpu:: or cuda::.
#include "ops/rope/rope.h"

#include <cmath>

#include "backend/backend.h"
#include "backend/dispatch.h"
#include "ops/rope/rope_backends.h"

namespace octet {
namespace {

RopeGeometry validate(Context& ctx, const RopeArgs& a, const char* op) {
  const Tensor& x = a.input;
  check_dtype(x, "rope input", {DType::kF32, DType::kBF16});
  check_device(x, "rope input", ctx.device);
  OCTET_CHECK(x.rank() == 3 || x.rank() == 4, op, ": input must be (B, T, H, W) or (B, T, W), got ",
              shape_str(x.shape()));
  const RopeTable& tb = a.table;
  RopeGeometry g;
  g.seq = x.size(1);
  g.heads = x.rank() == 4 ? x.size(2) : 1;
  g.width = x.size(x.rank() - 1);
  g.rows = x.numel() / std::max<int64_t>(g.width, 1);
  check_rope_table(ctx, tb, g.seq, op);
  OCTET_CHECK(a.offset >= 0 && a.offset + tb.rope_dim <= g.width, op, ": rope channels [", a.offset,
              ", ", a.offset + tb.rope_dim,
              ") do not fit in the input's last dimension W = ", g.width);
  OCTET_CHECK(g.width <= (int64_t{1} << 30), op, ": last dimension W = ", g.width, " too large");
  return g;
}

Tensor run(Context& ctx, const RopeArgs& args, RopeDirection dir, const char* op) {
  const RopeGeometry g = validate(ctx, args, op);
  Tensor out = Tensor::empty(ctx, args.input.shape(), args.input.dtype());
  if (out.numel() == 0) return out;
  OCTET_DISPATCH(ctx, rope, ctx, args, g, dir, out);
  return out;
}

}  // namespace

void check_rope_table(Context& ctx, const RopeTable& tb, int64_t seq, const char* op) {
  OCTET_CHECK(tb.rope_dim > 0 && tb.rope_dim % 2 == 0, op,
              ": table rope_dim must be even and > 0, got ", tb.rope_dim,
              " (was the table made with make_rope_table?)");
  check_dtype(tb.cos, "rope table cos", {DType::kF32});
  check_dtype(tb.sin, "rope table sin", {DType::kF32});
  check_device(tb.cos, "rope table cos", ctx.device);
  check_device(tb.sin, "rope table sin", ctx.device);
  const Shape want{tb.positions, tb.rope_dim / 2};
  OCTET_CHECK(tb.cos.shape() == want && tb.sin.shape() == want, op, ": table cos/sin must be ",
              shape_str(want), ", got ", shape_str(tb.cos.shape()), " and ",
              shape_str(tb.sin.shape()));
  OCTET_CHECK(seq <= tb.positions, op, ": sequence length T = ", seq, " exceeds the table's ",
              tb.positions, " positions");
}

RopeTable make_rope_table(Context& ctx, int64_t positions, int64_t rope_dim, double theta) {
  OCTET_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= 4096,
              "rope table: rope_dim (qk_rope_head_dim) must be even, in [2, 4096], got ", rope_dim);
  OCTET_CHECK(positions >= 1 && positions <= (int64_t{1} << 24),
              "rope table: positions must be in [1, 2^24], got ", positions);
  OCTET_CHECK(std::isfinite(theta) && theta > 1.0,
              "rope table: rope_theta must be finite and > 1, got ", theta);
  const int64_t half = rope_dim / 2;
  Tensor c = Tensor::empty({positions, half}, DType::kF32);
  Tensor s = Tensor::empty({positions, half}, DType::kF32);
  for (int64_t j = 0; j < half; ++j) {
    const double inv_freq =
        1.0 / std::pow(theta, static_cast<double>(2 * j) / static_cast<double>(rope_dim));
    for (int64_t t = 0; t < positions; ++t) {
      const double angle = static_cast<double>(t) * inv_freq;
      c.data_as<float>()[t * half + j] = static_cast<float>(std::cos(angle));
      s.data_as<float>()[t * half + j] = static_cast<float>(std::sin(angle));
    }
  }
  RopeTable tb;
  tb.cos = ctx.device == Device::kCpu ? c : c.to(ctx, ctx.device);
  tb.sin = ctx.device == Device::kCpu ? s : s.to(ctx, ctx.device);
  tb.rope_dim = rope_dim;
  tb.positions = positions;
  tb.theta = theta;
  return tb;
}

Tensor rope_forward(Context& ctx, const RopeArgs& args) {
  return run(ctx, args, RopeDirection::kForward, "rope_forward");
}

Tensor rope_backward(Context& ctx, const RopeArgs& args) {
  return run(ctx, args, RopeDirection::kBackward, "rope_backward");
}

}  // namespace octet
