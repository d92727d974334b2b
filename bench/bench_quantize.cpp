// `octet bench quantize`: quantization throughput against the device-to-device copy bandwidth
// measured in the same run, and the scaling-aware transpose against dequantize-then-requantize.
//
// Bytes counted are the fewest an op must move: every input read once, every output written once
// (FP8 codes, FP32 scales). GB/s = bytes / median time; "of copy" = that over the copy bandwidth.
#include <cstdio>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench.h"
#include "cli.h"
#include "ops/quantize/quantize.h"
#include "ops/quantize/quantize_backends.h"

namespace octet::bench {
namespace {

struct Row {
  std::string op;
  double ms;
  double bytes;
};

Tensor random_bf16(Context& ctx, int64_t rows, int64_t cols) {
  // Random, never constant data: a host LCG with a Gaussian-ish sum, a few outliers; copied once.
  Tensor h = Tensor::empty({rows, cols}, DType::kBF16);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int32_t>(s >> 32)) * 0x1p-31f;
  };
  auto* p = h.data_as<uint16_t>();
  for (int64_t i = 0; i < rows * cols; ++i) {
    float v = next() + next() + next();
    if ((i & 1023) == 7) v *= 300.0f;
    p[i] = float_to_bf16(v);
  }
  return h.to(ctx, ctx.device);
}

// One row of the transpose table: the scaling-aware transpose of x's 1x128 pow2 E4M3 copy (the
// op, then the kernel it replaced where the build has it), against the path it replaces: dequantize
// to BF16, quantize the transpose. Bytes: codes read and written once, both copies' scales.
std::vector<std::string> transpose_row(Context& ctx, const Tensor& x, double copy_gbs, int warmup,
                                       int runs, L2Flusher& flush) {
  const int64_t rows = x.rows(), cols = x.cols();
  const double n = static_cast<double>(rows) * static_cast<double>(cols);
  QuantTensor q = quantize(ctx, {.input = x,
                                 .format = Fp8Format::kE4M3,
                                 .granularity = Granularity::k1x128,
                                 .rounding = ScaleRounding::kPow2,
                                 .epsilon = 0.0f,
                                 .output = QuantizeOutput::kRowwise});
  const double t_sat = time_op(
                           ctx, [&] { scaling_aware_transpose(ctx, q); }, warmup, runs, flush)
                           .median_ms;
  double t_legacy = 0;
#if OCTET_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    Tensor cdata = q.columnwise_data, cscale = q.columnwise_scale_inv;
    t_legacy = time_op(
                   ctx, [&] { cuda::scaling_aware_transpose_legacy(ctx, q, cdata, cscale); },
                   warmup, runs, flush)
                   .median_ms;
  }
#endif
  const double t_deq = time_op(
                           ctx, [&] { dequantize(ctx, q, DType::kBF16); }, warmup, runs, flush)
                           .median_ms;
  const Tensor xd = dequantize(ctx, q, DType::kBF16);
  const double t_req = time_op(
                           ctx,
                           [&] {
                             quantize(ctx, {.input = xd,
                                            .format = Fp8Format::kE4M3,
                                            .granularity = Granularity::k1x128,
                                            .rounding = ScaleRounding::kPow2,
                                            .epsilon = 0.0f,
                                            .output = QuantizeOutput::kColumnwise});
                           },
                           warmup, runs, flush)
                           .median_ms;
  const double bytes =
      2 * n +
      4.0 * static_cast<double>(shape_numel(scale_shape(Granularity::k1x128, rows, cols)) +
                                shape_numel(scale_shape(Granularity::k128x128, cols, rows)));
  const double gbs = bytes / (t_sat * 1e-3) / 1e9;
  const bool legacy = t_legacy > 0;
  return {std::to_string(rows) + " x " + std::to_string(cols),
          fmt(t_sat * 1e3, 1),
          fmt(gbs, gbs < 10 ? 2 : 0),
          fmt(100.0 * gbs / copy_gbs, 1) + "%",
          legacy ? fmt(t_legacy * 1e3, 1) : "-",
          legacy ? fmt(bytes / (t_legacy * 1e-3) / 1e9, 0) : "-",
          legacy ? fmt(t_legacy / t_sat, 2) + "x" : "-",
          fmt((t_deq + t_req) * 1e3, 1),
          fmt((t_deq + t_req) / t_sat, 2) + "x"};
}

// The tile kernel (1x128 with the column-wise copy) on the shapes the deepseek recipe quantizes in
// configs/baseline-h100.toml (B*T = 16384 tokens, top-4 routing: 65536 expert rows): x and dy of
// the MLA projections, the dense MLP and the shared expert (kBoth), the o_proj input re-quantized
// for Wgrad (kColumnwise), and the grouped experts' x and dy.
std::vector<std::vector<std::string>> model_shapes_table(Context& ctx, double copy_gbs, int warmup,
                                                         int runs, L2Flusher& flush) {
  struct Shape2 {
    int64_t rows, cols;
    QuantizeOutput out;
  };
  const std::vector<Shape2> shapes = {
      {16384, 1024, QuantizeOutput::kBoth},       {16384, 384, QuantizeOutput::kBoth},
      {16384, 256, QuantizeOutput::kBoth},        {16384, 288, QuantizeOutput::kBoth},
      {16384, 1536, QuantizeOutput::kBoth},       {16384, 2048, QuantizeOutput::kBoth},
      {16384, 704, QuantizeOutput::kBoth},        {16384, 2816, QuantizeOutput::kBoth},
      {16384, 1024, QuantizeOutput::kColumnwise}, {65536, 1024, QuantizeOutput::kBoth},
      {65536, 1408, QuantizeOutput::kBoth}};
  std::vector<std::vector<std::string>> table;
  for (const Shape2& sh : shapes) {
    const Tensor x = random_bf16(ctx, sh.rows, sh.cols);
    const double n = static_cast<double>(sh.rows) * static_cast<double>(sh.cols);
    const bool both = sh.out == QuantizeOutput::kBoth;
    const double scales =
        4.0 * static_cast<double>(
                  shape_numel(scale_shape(Granularity::k1x128, sh.cols, sh.rows)) +
                  (both ? shape_numel(scale_shape(Granularity::k1x128, sh.rows, sh.cols)) : 0));
    const double bytes = 2 * n + (both ? 2 : 1) * n + scales;
    const double ms = time_op(
                          ctx,
                          [&] {
                            quantize(ctx, {.input = x,
                                           .format = Fp8Format::kE4M3,
                                           .granularity = Granularity::k1x128,
                                           .rounding = ScaleRounding::kPow2,
                                           .epsilon = 0.0f,
                                           .output = sh.out});
                          },
                          warmup, runs, flush)
                          .median_ms;
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    table.push_back({both ? "1x128 + column-wise" : "1x128 column-wise only",
                     std::to_string(sh.rows) + " x " + std::to_string(sh.cols), fmt(ms * 1e3, 1),
                     fmt(gbs, 0), fmt(100.0 * gbs / copy_gbs, 1) + "%"});
  }
  return table;
}

int run(const std::vector<std::string>& argv) {
  cli::Args args(argv, {"device", "rows", "cols", "runs", "warmup"}, {});
  args.expect_positional(0, 0,
                         "octet bench quantize [--device cuda|cpu] [--rows R --cols C] [--runs N]");
  const std::string dev = args.choice("device", {"cuda", "cpu"}, "cuda");
  Context ctx = make_context(dev == "cuda" ? Device::kCuda : Device::kCpu);
  const int runs = static_cast<int>(args.get_int("runs", 30));
  const int warmup = static_cast<int>(args.get_int("warmup", 3));
  OCTET_CHECK(runs >= 1 && warmup >= 0, "--runs must be >= 1 and --warmup >= 0");
  std::vector<std::pair<int64_t, int64_t>> shapes = {{32768, 7168}, {24576, 5120}};
  if (args.get("rows") || args.get("cols"))
    shapes = {{args.get_int("rows", 4096), args.get_int("cols", 7168)}};

  const double copy_gbs = copy_bandwidth_gbs(ctx, int64_t{1} << (dev == "cuda" ? 30 : 26), runs);
  std::printf("device: %s\n",
              dev == "cuda" ? cuda_device_info(ctx.device_index).name.c_str() : "cpu");
  std::printf("device-to-device copy: %.0f GB/s (bytes read + written, median of %d)\n\n", copy_gbs,
              runs);

  L2Flusher flush(ctx);
  std::vector<std::vector<std::string>> table, transpose_table;
  for (auto [rows, cols] : shapes) {
    const Tensor x = random_bf16(ctx, rows, cols);
    const double n = static_cast<double>(rows) * static_cast<double>(cols);
    // Bytes of FP32 scales per layout (scale.h).
    auto scale_bytes = [](Granularity g, int64_t r, int64_t c) {
      return 4.0 * static_cast<double>(shape_numel(scale_shape(g, r, c)));
    };
    const double s1x128 = scale_bytes(Granularity::k1x128, rows, cols);
    const double s128x1 = scale_bytes(Granularity::k128x1, rows, cols);
    const double s128 = scale_bytes(Granularity::k128x128, rows, cols);
    auto quant = [&](Granularity g, QuantizeOutput o, ScaleRounding r) {
      return [&ctx, &x, g, o, r] {
        quantize(ctx, {.input = x,
                       .format = Fp8Format::kE4M3,
                       .granularity = g,
                       .rounding = r,
                       .epsilon = 0.0f,
                       .output = o});
      };
    };
    const std::vector<Row> rows_out = {
        {"bf16 -> fp8 1x128",
         time_op(ctx, quant(Granularity::k1x128, QuantizeOutput::kRowwise, ScaleRounding::kExact),
                 warmup, runs, flush)
             .median_ms,
         2 * n + n + s1x128},
        {"bf16 -> fp8 1x128 + column-wise",
         time_op(ctx, quant(Granularity::k1x128, QuantizeOutput::kBoth, ScaleRounding::kExact),
                 warmup, runs, flush)
             .median_ms,
         2 * n + 2 * n + s1x128 + s128x1},
        {"bf16 -> fp8 128x128",
         time_op(ctx, quant(Granularity::k128x128, QuantizeOutput::kRowwise, ScaleRounding::kExact),
                 warmup, runs, flush)
             .median_ms,
         2 * n + n + s128},
        {"bf16 -> fp8 per-tensor (amax pass + cast)",
         time_op(ctx, quant(Granularity::kTensor, QuantizeOutput::kRowwise, ScaleRounding::kExact),
                 warmup, runs, flush)
             .median_ms,
         2 * n + n + 4},
    };
    const std::string shape = std::to_string(rows) + " x " + std::to_string(cols);
    for (const Row& r : rows_out) {
      const double gbs = r.bytes / (r.ms * 1e-3) / 1e9;
      table.push_back({r.op, shape, fmt(r.ms, 3), fmt(gbs, gbs < 10 ? 2 : 0),
                       fmt(100.0 * gbs / copy_gbs, 1) + "%"});
    }

    transpose_table.push_back(transpose_row(ctx, x, copy_gbs, warmup, runs, flush));
  }
  print_table({"op", "shape", "ms", "GB/s", "of copy"}, table);
  std::printf(
      "\nscaling-aware transpose (1x128 pow2 -> column-wise, 128x128 scales; on CUDA also the "
      "model's MoE\nshapes): the op, the kernel it replaced (legacy), and dequantize + "
      "requantize:\n");
  if (dev == "cuda" && !args.get("rows") && !args.get("cols"))
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
             {65536, 1024}, {65536, 704}, {16384, 1024}, {16384, 704}})
      transpose_table.push_back(
          transpose_row(ctx, random_bf16(ctx, rows, cols), copy_gbs, warmup, runs, flush));
  print_table({"shape", "transpose us", "GB/s", "of copy", "legacy us", "legacy GB/s", "vs legacy",
               "deq+req us", "vs deq+req"},
              transpose_table);
  if (dev == "cuda" && !args.get("rows") && !args.get("cols")) {
    std::printf(
        "\nbf16 -> fp8 E4M3 1x128 (pow2) with the column-wise copy on the model's shapes "
        "(configs/baseline-h100.toml):\n");
    print_table({"op", "shape", "us", "GB/s", "of copy"},
                model_shapes_table(ctx, copy_gbs, warmup, runs, flush));
  }
  return 0;
}

}  // namespace

Suite quantize_suite() {
  return {"quantize", "quantize / transpose throughput vs device copy bandwidth",
          "usage: octet bench quantize [--device cuda|cpu] [--rows R --cols C] [--runs N] "
          "[--warmup N]\n\n"
          "BF16 -> FP8 E4M3 quantization (1x128, 1x128 with the column-wise copy, 128x128, "
          "per-tensor) at\n"
          "DeepSeek-sized tensors (32768 x 7168 and 24576 x 5120 unless --rows/--cols), in GB/s "
          "and as a share\n"
          "of the device-to-device copy bandwidth measured in the same run; then the scaling-aware "
          "transpose\n"
          "(the op, and on CUDA the kernel it replaced, also on the MoE shapes 65536 / 16384 x "
          "1024 / 704)\n"
          "against dequantize-then-requantize; then (CUDA, no --rows/--cols) the 1x128 tile "
          "kernel with the\n"
          "column-wise copy on the shapes configs/baseline-h100.toml quantizes. Median of --runs "
          "(default 30)\n"
          "with the L2 flushed before each.",
          run};
}

}  // namespace octet::bench
