// Dispatcher for gemm.h: validates once, routes to cpu:: or cuda::.
#include "ops/gemm/gemm.h"

#include "backend/dispatch.h"
#include "core/cast_counter.h"
#include "core/scale_layout.h"
#include "numerics/scale.h"
#include "ops/gemm/gemm_backends.h"

namespace octet {
void check_high_precision_operand(const Tensor& t, const char* name, Device device) {
  if (device == Device::kCpu)
    check_dtype(t, name, {DType::kBF16, DType::kF32});
  else
    check_dtype(t, name, {DType::kBF16});
  check_device(t, name, device);
}

void check_gemm_operand(const Fp8Operand& op, const char* name, Device device,
                        ScaleShapeCheck scales) {
  OCTET_CHECK(op.data.data() != nullptr || op.data.numel() == 0, "gemm operand ", name,
              ": data is not written (was that copy of the QuantTensor requested?)");
  check_dtype(op.data, name, {fp8_dtype(op.format)});
  check_device(op.data, name, device);
  check_dtype(op.scale_inv, name, {DType::kF32});
  check_device(op.scale_inv, name, device);
  OCTET_CHECK(op.granularity != Granularity::k128x1, "gemm operand ", name,
              ": 128x1 scales run across rows of K; "
              "pass the other copy of the tensor, whose 1x128 groups lie along K");
  if (scales == ScaleShapeCheck::kStacked) return;
  // 1x128 scales in either layout (core/scale_layout.h); MN-major ones by their exact shape.
  const ScaleLayout layout = scale_layout(op.granularity, op.scale_inv);
  const Shape want = scale_shape(op.granularity, op.rows(), op.cols(), layout);
  OCTET_CHECK(layout == ScaleLayout::kKMajor ? op.scale_inv.numel() == shape_numel(want)
                                             : op.scale_inv.shape() == want,
              "gemm operand ", name, ": scale_inv for granularity ",
              granularity_name(op.granularity), " (", scale_layout_name(layout), ") of a ",
              op.rows(), " x ", op.cols(), " operand must have shape ", shape_str(want), ", got ",
              shape_str(op.scale_inv.shape()));
}

void check_gemm_output(const Tensor& d, int64_t m, int64_t n, Accumulate acc, Device device) {
  check_dtype(d, "gemm output D", {DType::kBF16, DType::kF32});
  check_device(d, "gemm output D", device);
  OCTET_CHECK(d.defined() && d.rows() == m && d.cols() == n, "gemm output D: expected shape [", m,
              ", ", n, "], got ", shape_str(d.shape()));
  OCTET_CHECK(acc == Accumulate::kOverwrite || d.dtype() == DType::kF32,
              "gemm output D: accumulation (+=) needs an F32 destination, got ",
              dtype_name(d.dtype()));
}

void check_cuda_block_output(int64_t n, DType d) {
  OCTET_CHECK((n * dtype_size(d)) % 16 == 0, "gemm on CUDA: output D has rows of N = ", n, " ",
              dtype_name(d),
              " elements; with block scales (1x128, 128x128) cuBLASLt needs them to be "
              "whole 16-byte vectors: N a multiple of ",
              16 / dtype_size(d), " for ", dtype_name(d), " output");
}

void check_cuda_fp8_k(int64_t k) {
  OCTET_CHECK(k % 16 == 0, "gemm on CUDA: K = ", k,
              " must be a multiple of 16 for FP8 operands "
              "(cuBLASLt reads rows of A and B in 16-byte vectors); pad K with zeros");
}

Fp8Operand rowwise_operand(const QuantTensor& q) {
  return {q.data.reshape({q.data.rows(), q.data.cols()}), q.scale_inv, q.granularity, q.format};
}

Fp8Operand columnwise_operand(const QuantTensor& q) {
  OCTET_CHECK(q.has_columnwise(),
              "gemm operand: the QuantTensor has no column-wise copy (quantize with "
              "QuantizeOutput::kColumnwise or kBoth, or run the scaling-aware transpose)");
  return {q.columnwise_data, q.columnwise_scale_inv, q.columnwise_granularity, q.format};
}

void check_fp8_pairing(const Fp8Operand& a, const Fp8Operand& b, Accumulation accumulation) {
  const Granularity ga = a.granularity, gb = b.granularity;
  OCTET_CHECK(!(a.format == Fp8Format::kE5M2 && b.format == Fp8Format::kE5M2),
              "gemm: E5M2 x E5M2 is not supported by the FP8 tensor cores (cuBLASLt); "
              "quantize one operand E4M3");
  const bool both_block = scales_vary_along_k(ga) && scales_vary_along_k(gb);
  OCTET_CHECK(ga == gb || both_block, "gemm: A is ", granularity_name(ga), "-scaled and B ",
              granularity_name(gb),
              "-scaled; supported pairings are tensor x tensor, row x row, and the "
              "blockwise 1x128 x 128x128, 128x128 x 1x128, 1x128 x 1x128");
  OCTET_CHECK(
      !(ga == Granularity::k128x128 && gb == Granularity::k128x128),
      "gemm: 128x128 x 128x128 is not supported (cuBLASLt has no such mode); quantize one operand "
      "in 1x128 tiles (DeepSeek-V3: activations 1x128, weights 128x128)");
  OCTET_CHECK(
      !(both_block && accumulation == Accumulation::kFast),
      "gemm: fast accumulation is not available with block scales (1x128, 128x128): their scales "
      "are applied at the FP32 promotion every 128 elements of K");
}

void gemm_fp8(Context& ctx, const GemmFp8Args& args) {
  check_gemm_operand(args.a, "A", ctx.device);
  check_gemm_operand(args.b, "B", ctx.device);
  OCTET_CHECK(args.a.cols() == args.b.cols(), "gemm: A is ", args.a.rows(), " x ", args.a.cols(),
              " and B is ", args.b.rows(), " x ", args.b.cols(),
              "; both must have the same K (columns): D = A B^T");
  check_fp8_pairing(args.a, args.b, args.accumulation);
  check_gemm_output(args.d, args.a.rows(), args.b.rows(), args.accumulate, ctx.device);
  const AccumulatorEmulation& e = args.emulation;
  OCTET_CHECK(e.mantissa_bits >= 0 && e.mantissa_bits <= 23,
              "gemm: emulated accumulator mantissa bits must be in [0, 23], got ", e.mantissa_bits);
  OCTET_CHECK(e.promote_interval >= 0, "gemm: promotion interval must be >= 0, got ",
              e.promote_interval);
  if (ctx.device == Device::kCuda && args.a.cols() > 0) check_cuda_fp8_k(args.a.cols());
  if (ctx.device == Device::kCuda && scales_vary_along_k(args.a.granularity))
    check_cuda_block_output(args.b.rows(), args.d.dtype());
  // cast_counter.h kScaleRelayout: operands whose 1x128 scales the CUDA backend re-lays out for
  // cuBLASLt on this call (K-major ones), counted on every device.
  for (const Fp8Operand* op : {&args.a, &args.b})
    if (op->granularity == Granularity::k1x128 &&
        scale_layout(op->granularity, op->scale_inv) == ScaleLayout::kKMajor)
      count_casts(ctx, CastKind::kScaleRelayout, 1);
  OCTET_DISPATCH(ctx, gemm_fp8, ctx, args);
}

void gemm_bf16(Context& ctx, const GemmBf16Args& args) {
  check_high_precision_operand(args.a, "gemm A", ctx.device);
  check_high_precision_operand(args.b, "gemm B", ctx.device);
  OCTET_CHECK(args.a.dtype() == args.b.dtype(), "gemm: A is ", dtype_name(args.a.dtype()),
              " but B is ", dtype_name(args.b.dtype()), "; both must be BF16 (or both F32)");
  const bool a_t = args.a_layout == OperandLayout::kMNMajor,
             b_t = args.b_layout == OperandLayout::kMNMajor;
  const int64_t m = a_t ? args.a.cols() : args.a.rows(), ka = a_t ? args.a.rows() : args.a.cols();
  const int64_t n = b_t ? args.b.cols() : args.b.rows(), kb = b_t ? args.b.rows() : args.b.cols();
  OCTET_CHECK(ka == kb, "gemm: A is ", args.a.rows(), " x ", args.a.cols(),
              a_t ? " (K, M)" : " (M, K)", " and B is ", args.b.rows(), " x ", args.b.cols(),
              b_t ? " (K, N)" : " (N, K)", "; both must have the same K: D = A B^T");
  check_gemm_output(args.d, m, n, args.accumulate, ctx.device);
  OCTET_DISPATCH(ctx, gemm_bf16, ctx, args);
}

#if !OCTET_WITH_CUDA
int64_t gemm_cached_plans(const Context&) {
  return 0;
}
#endif

}  // namespace octet
