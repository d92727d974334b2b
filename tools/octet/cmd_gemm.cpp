// `octet gemm IN OUT --recipe ...`: D = A B^T of the tensors `a` (M, K) and `b` (N, K) of a
// safetensors file, quantized by a recipe's rules (or taken as FP8 with their scales), written as
// `d` (M, N).
#include <cstdio>

#include "backend/backend.h"
#include "cli.h"
#include "core/context.h"
#include "io/safetensors.h"
#include "ops/gemm/gemm.h"
#include "ops/quantize/quantize.h"

namespace octet::cli {
namespace {

const char* kUsage =
    "usage: octet gemm IN OUT --recipe bf16|tensor|row|blockwise [--out-dtype bf16|f32] [--device "
    "cpu|cuda]\n"
    "                  [--force]\n\n"
    "Reads `a` (M, K) and `b` (N, K) from the safetensors file IN and writes d = a b^T (M, N) to "
    "OUT.\n"
    "  bf16       a and b rounded to BF16, FP32 accumulation\n"
    "  tensor     FP8 E4M3, one scale per tensor\n"
    "  row        FP8 E4M3, one scale per row (of a and of b)\n"
    "  blockwise  FP8 E4M3, a in 1x128 tiles, b in 128x128 blocks (DeepSeek-V3)\n"
    "F32 or BF16 inputs are quantized here. FP8 inputs (F8_E4M3 / F8_E5M2) are used as given, "
    "with\n"
    "`a_scale_inv` and `b_scale_inv` in the layout of `octet quantize` (the recipe names their\n"
    "granularity). FP8 accumulation is promoted into FP32 every 128 elements of K.\n"
    "  --out-dtype  bf16 (default) or f32\n"
    "  --device     cpu (default; the reference) or cuda (cuBLASLt: K a multiple of 16)\n"
    "  --force      replace an existing OUT (default: refuse; OUT is never IN)";

Tensor to_bf16(const Tensor& t, const char* name) {
  if (t.dtype() == DType::kBF16) return t;
  OCTET_CHECK(t.dtype() == DType::kF32, "tensor '", name,
              "': the bf16 recipe takes F32 or BF16, got ", dtype_name(t.dtype()));
  Tensor out = Tensor::empty(t.shape(), DType::kBF16);
  for (int64_t i = 0; i < t.numel(); ++i)
    out.data_as<uint16_t>()[i] = float_to_bf16(t.data_as<const float>()[i]);
  return out;
}

// One FP8 operand on the host: quantized here, or read with its scales.
Fp8Operand host_operand(Context& cpu, const io::SafetensorsFile& in, const std::string& name,
                        Granularity g) {
  const Tensor& x = in.at(name);
  OCTET_CHECK(x.rank() == 2, "tensor '", name, "': expected a matrix, got shape ",
              shape_str(x.shape()));
  if (is_fp8(x.dtype())) {
    Fp8Operand op;
    op.data = x;
    op.format = x.dtype() == DType::kE4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
    op.scale_inv = in.at(name + "_scale_inv");
    op.granularity = g;
    return op;
  }
  QuantizeArgs qa;
  qa.input = x;
  qa.granularity = g;
  return rowwise_operand(quantize(cpu, qa));
}

Fp8Operand to_device(Context& ctx, const Fp8Operand& op) {
  if (ctx.device == Device::kCpu) return op;
  Fp8Operand o = op;
  o.data = op.data.to(ctx, ctx.device);
  o.scale_inv = op.scale_inv.to(ctx, ctx.device);
  return o;
}

Tensor run(Context& ctx, const io::SafetensorsFile& in, const std::string& recipe,
           DType out_dtype) {
  Context cpu = make_context(Device::kCpu);
  const int64_t m = in.at("a").rows(), n = in.at("b").rows();
  Tensor d = Tensor::empty(ctx, {m, n}, out_dtype);
  if (recipe == "bf16") {
    gemm_bf16(ctx, {.a = to_bf16(in.at("a"), "a").to(ctx, ctx.device),
                    .b = to_bf16(in.at("b"), "b").to(ctx, ctx.device),
                    .d = d});
    return d.to_host(ctx);
  }
  const Granularity ga = recipe == "tensor" ? Granularity::kTensor
                         : recipe == "row"  ? Granularity::kRow
                                            : Granularity::k1x128;
  const Granularity gb = recipe == "blockwise" ? Granularity::k128x128 : ga;
  GemmFp8Args args;
  args.a = to_device(ctx, host_operand(cpu, in, "a", ga));
  args.b = to_device(ctx, host_operand(cpu, in, "b", gb));
  args.d = d;
  gemm_fp8(ctx, args);
  return d.to_host(ctx);
}

int run_gemm(const std::vector<std::string>& argv) {
  const Args args(argv, {"recipe", "out-dtype", "device"}, {"force"});
  args.expect_positional(2, 2, "octet gemm IN OUT --recipe bf16|tensor|row|blockwise");
  OCTET_CHECK(args.has("recipe"), "missing --recipe bf16|tensor|row|blockwise");
  const std::string recipe = args.choice("recipe", {"bf16", "tensor", "row", "blockwise"}, "");
  const DType out_dtype =
      args.choice("out-dtype", {"bf16", "f32"}, "bf16") == "f32" ? DType::kF32 : DType::kBF16;
  const Device device =
      args.choice("device", {"cpu", "cuda"}, "cpu") == "cuda" ? Device::kCuda : Device::kCpu;
  refuse_output_over_input(args.positional()[0], args.positional()[1]);
  refuse_existing_output(args.positional()[1], existing_output(args));
  const io::SafetensorsFile in = io::read_safetensors(args.positional()[0]);
  Context ctx = make_context(device);
  const Tensor d = run(ctx, in, recipe, out_dtype);
  io::write_safetensors(args.positional()[1], {{"d", d}}, {{"octet.recipe", recipe}});
  std::printf("d = a b^T: [%lld, %lld] %s (%s, %s) -> %s\n", static_cast<long long>(d.rows()),
              static_cast<long long>(d.cols()), std::string(dtype_name(out_dtype)).c_str(),
              recipe.c_str(), device_name(device), args.positional()[1].c_str());
  return 0;
}

}  // namespace

Command gemm_command() {
  return {"gemm",
          "D = A B^T of two tensors of a safetensors file, by a recipe (bf16, FP8 "
          "tensor/row/blockwise)",
          kUsage, run_gemm};
}

}  // namespace octet::cli
