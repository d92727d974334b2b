// quantize_grouped.h: validation and allocation, the CPU reference (plain loops), dispatch.
#include "ops/quantize/quantize_grouped.h"

#include <algorithm>
#include <vector>

#include "backend/dispatch.h"
#include "core/cast_counter.h"

namespace octet {
namespace cuda {
void quantize_grouped_tensorwise(Context& ctx, const GroupedQuantizeArgs& args,
                                 GroupedQuantTensor& out);
}
namespace cpu {
namespace {

float element(const Tensor& x, int64_t i) {
  return x.dtype() == DType::kF32 ? x.data_as<const float>()[i]
                                  : bf16_to_float(x.data_as<const uint16_t>()[i]);
}

}  // namespace

void quantize_grouped_tensorwise(Context&, const GroupedQuantizeArgs& args,
                                 GroupedQuantTensor& out) {
  const Tensor& x = args.input;
  const int64_t rows = x.rows(), cols = x.cols(), groups = args.group_sizes.numel();
  const int32_t* sizes = args.group_sizes.data_as<const int32_t>();
  std::vector<int64_t> offset(static_cast<size_t>(groups) + 1, 0);
  for (int64_t g = 0; g < groups; ++g) {
    OCTET_CHECK(sizes[g] >= 0, "quantize grouped: group ", g, " has a negative row count ",
                sizes[g]);
    offset[g + 1] = offset[g] + sizes[g];
  }
  OCTET_CHECK(offset[groups] <= rows, "quantize grouped: the groups' counts sum to ",
              offset[groups], " but the input has only ", rows, " rows");
  if (args.output != QuantizeOutput::kRowwise)
    for (int64_t g = 0; g < groups; ++g)
      OCTET_CHECK(sizes[g] == 0 || offset[g] % kGroup == 0, "quantize grouped: group ", g,
                  " starts at row ", offset[g],
                  ", not a multiple of 128; the column-wise copy's blocks of 128 rows must not "
                  "straddle two groups (pad each group to 128 rows)");
  const ScaleRule rule{args.format, args.rounding, args.epsilon, 0};
  std::vector<float> row_scale(static_cast<size_t>(rows), 1.0f),
      row_scale_inv(static_cast<size_t>(rows), 1.0f);
  float* amax = out.amax.data_as<float>();
  float* scale_inv = out.scale_inv.data_as<float>();
  for (int64_t g = 0; g < groups; ++g) {
    uint32_t a = 0;
    for (int64_t i = offset[g] * cols; i < offset[g + 1] * cols; ++i)
      a = std::max(a, abs_bits(element(x, i)));
    amax[g] = bits_float(a);
    const float fixed = args.scale.defined() ? args.scale.data_as<const float>()[g] : 0.0f;
    const float s = fixed > 0.0f ? fixed : compute_scale(amax[g], rule);
    scale_inv[g] = scale_inverse(s);
    for (int64_t r = offset[g]; r < offset[g + 1]; ++r) {
      row_scale[r] = s;
      row_scale_inv[r] = scale_inv[g];
    }
  }
  const int64_t cb = ceil_div(cols, kGroup), rb = ceil_div(rows, kGroup);
  if (args.output != QuantizeOutput::kColumnwise) {
    uint8_t* q = out.q.data.data_as<uint8_t>();
    float* s = out.q.scale_inv.data_as<float>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c)
        q[r * cols + c] = quantize_value(element(x, r * cols + c), row_scale[r], args.format);
      for (int64_t b = 0; b < cb; ++b) s[r * cb + b] = row_scale_inv[r];
    }
  }
  if (args.output != QuantizeOutput::kRowwise) {
    uint8_t* q = out.q.columnwise_data.data_as<uint8_t>();
    float* s = out.q.columnwise_scale_inv.data_as<float>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        q[c * rows + r] = quantize_value(element(x, r * cols + c), row_scale[r], args.format);
    const bool tile = args.columnwise_granularity == Granularity::k128x128;
    const int64_t srows = tile ? cb : cols;
    for (int64_t i = 0; i < srows; ++i)
      for (int64_t b = 0; b < rb; ++b) s[i * rb + b] = row_scale_inv[b * kGroup];
  }
}

}  // namespace cpu

GroupedQuantTensor quantize_grouped_tensorwise(Context& ctx, const GroupedQuantizeArgs& args) {
  const Tensor& x = args.input;
  check_dtype(x, "quantize grouped input", {DType::kF32, DType::kBF16});
  check_device(x, "quantize grouped input", ctx.device);
  OCTET_CHECK(x.rank() >= 2, "quantize grouped input: expected (rows, cols), got ",
              shape_str(x.shape()));
  check_dtype(args.group_sizes, "quantize grouped group_sizes", {DType::kI32});
  check_device(args.group_sizes, "quantize grouped group_sizes", ctx.device);
  const int64_t groups = args.group_sizes.numel(), rows = x.rows(), cols = x.cols();
  OCTET_CHECK(args.group_sizes.rank() == 1 && groups >= 1,
              "quantize grouped group_sizes: expected shape [G] with G >= 1, got ",
              shape_str(args.group_sizes.shape()));
  OCTET_CHECK(args.epsilon >= 0.0f && args.epsilon < 3.4e38f,
              "quantize grouped: epsilon must be finite and >= 0, got ", args.epsilon);
  OCTET_CHECK(args.columnwise_granularity == Granularity::k1x128 ||
                  args.columnwise_granularity == Granularity::k128x128,
              "quantize grouped: column-wise scales are 1x128 or 128x128, got ",
              granularity_name(args.columnwise_granularity));
  if (args.scale.defined()) {
    check_dtype(args.scale, "quantize grouped scale", {DType::kF32});
    check_device(args.scale, "quantize grouped scale", ctx.device);
    OCTET_CHECK(args.scale.numel() == groups, "quantize grouped scale: expected ", groups,
                " elements (one per group), got ", args.scale.numel());
  }
  count_casts(ctx, CastKind::kQuantize, args.output == QuantizeOutput::kBoth ? 2 : 1);
  GroupedQuantTensor out;
  QuantTensor& q = out.q;
  q.format = args.format;
  q.granularity = Granularity::k1x128;
  q.columnwise_granularity = args.columnwise_granularity;
  q.rounding = args.rounding;
  const DType dt = fp8_dtype(args.format);
  if (args.output != QuantizeOutput::kColumnwise) {
    q.data = Tensor::empty(ctx, {rows, cols}, dt);
    q.scale_inv = Tensor::empty(ctx, scale_shape(Granularity::k1x128, rows, cols), DType::kF32);
  } else {
    q.data = Tensor::wrap(nullptr, {rows, cols}, dt, ctx.device);
  }
  if (args.output != QuantizeOutput::kRowwise) {
    q.columnwise_data = Tensor::empty(ctx, {cols, rows}, dt);
    q.columnwise_scale_inv =
        Tensor::empty(ctx, scale_shape(args.columnwise_granularity, cols, rows), DType::kF32);
  }
  out.amax = Tensor::empty(ctx, {groups}, DType::kF32);
  out.scale_inv = Tensor::empty(ctx, {groups}, DType::kF32);
  GroupedQuantizeArgs a = args;
  a.input = x.reshape({rows, cols});
  OCTET_DISPATCH(ctx, quantize_grouped_tensorwise, ctx, a, out);
  return out;
}

}  // namespace octet
