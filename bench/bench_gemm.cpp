// `octet bench gemm`: dense and grouped GEMM throughput per recipe, with ratios to BF16 measured in
// the same run. `octet bench gemm-accum`: the accumulation-precision table of docs/numerics.md
// (CPU).
//
// TFLOPS = 2 M N K / median time, quantization excluded (operands are quantized once, before
// timing), the L2 flushed before every timed run. Dgrad and Wgrad are timed on the shape of the
// Fprop they belong to: Dgrad is (M, K) = (M, N) x (N, K), Wgrad (N, K) += (N, M) x (M, K) in FP32,
// same FLOPs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench.h"
#include "cli.h"
#include "ops/gemm/gemm.h"
#include "ops/grouped_gemm/grouped_gemm.h"
#include "ops/quantize/quantize.h"

namespace octet::bench {
namespace {

// Random host data (a seeded LCG summed into a Gaussian-like shape; never constant), as F32 or
// BF16.
Tensor random_host(int64_t rows, int64_t cols, uint64_t seed, DType dt) {
  Tensor h = Tensor::empty({rows, cols}, dt);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int32_t>(s >> 32)) * 0x1p-31f;
  };
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float v = next() + next() + next();
    if (dt == DType::kF32)
      h.data_as<float>()[i] = v;
    else
      h.data_as<uint16_t>()[i] = float_to_bf16(v);
  }
  return h;
}

QuantTensor quant(Context& ctx, const Tensor& x, Granularity g, QuantizeOutput out,
                  ScaleLayout layout = ScaleLayout::kKMajor) {
  QuantizeArgs qa;
  qa.input = x;
  qa.granularity = g;
  qa.output = out;
  qa.scale_layout = layout;
  return quantize(ctx, qa);
}

struct Timer {
  Context& ctx;
  int warmup, runs;
  L2Flusher& flush;
  double tflops(int64_t m, int64_t n, int64_t k, const std::function<void()>& fn) const {
    const Timing t = time_op(ctx, fn, warmup, runs, flush);
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) /
           (t.median_ms * 1e-3) / 1e12;
  }
};

std::string cell(double tf, double base) {
  return fmt(tf, 0) + " (" + fmt(tf / base, 2) + "x)";
}

std::vector<std::string> dense_row(const Timer& t, int64_t m, int64_t n, int64_t k) {
  Context& ctx = t.ctx;
  const Tensor x = random_host(m, k, 1, DType::kBF16).to(ctx, ctx.device);
  const Tensor w = random_host(n, k, 2, DType::kBF16).to(ctx, ctx.device);
  const Tensor dy = random_host(m, n, 3, DType::kBF16).to(ctx, ctx.device);
  Tensor y = Tensor::empty(ctx, {m, n}, DType::kBF16);
  const double bf16 = t.tflops(m, n, k, [&] { gemm_bf16(ctx, {.a = x, .b = w, .d = y}); });
  std::vector<std::string> row = {
      std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k), fmt(bf16, 0)};
  for (Granularity g : {Granularity::kTensor, Granularity::kRow}) {
    const QuantTensor qx = quant(ctx, x, g, QuantizeOutput::kRowwise),
                      qw = quant(ctx, w, g, QuantizeOutput::kRowwise);
    row.push_back(cell(
        t.tflops(
            m, n, k,
            [&] { gemm_fp8(ctx, {.a = rowwise_operand(qx), .b = rowwise_operand(qw), .d = y}); }),
        bf16));
  }
  // DeepSeek-V3 blockwise: Fprop, Dgrad, Wgrad, with x's and dy's 1x128 scales MN-major as the
  // dense Linear layers write them (core/scale_layout.h): cuBLASLt reads them in place, no
  // re-layout per call.
  const QuantTensor qx =
      quant(ctx, x, Granularity::k1x128, QuantizeOutput::kBoth, ScaleLayout::kMNMajor);
  const QuantTensor qw = quant(ctx, w, Granularity::k128x128, QuantizeOutput::kBoth);
  const QuantTensor qdy =
      quant(ctx, dy, Granularity::k1x128, QuantizeOutput::kBoth, ScaleLayout::kMNMajor);
  row.push_back(cell(
      t.tflops(
          m, n, k,
          [&] { gemm_fp8(ctx, {.a = rowwise_operand(qx), .b = rowwise_operand(qw), .d = y}); }),
      bf16));
  Tensor dx = Tensor::empty(ctx, {m, k}, DType::kBF16);
  row.push_back(cell(
      t.tflops(m, n, k,
               [&] {
                 gemm_fp8(ctx, {.a = rowwise_operand(qdy), .b = columnwise_operand(qw), .d = dx});
               }),
      bf16));
  Tensor dw = Tensor::empty(ctx, {n, k}, DType::kF32);
  ctx.be().memset(dw.data(), 0, dw.nbytes());
  row.push_back(cell(t.tflops(m, n, k,
                              [&] {
                                gemm_fp8(ctx, {.a = columnwise_operand(qdy),
                                               .b = columnwise_operand(qx),
                                               .d = dw,
                                               .accumulate = Accumulate::kAdd});
                              }),
                     bf16));
  return row;
}

// Token counts of E experts summing to `tokens`: equal, or skewed (expert e's share ~ 1 / (e + 1)),
// each a multiple of 128 as in DeepGEMM's padded contiguous layout.
std::vector<int64_t> token_counts(int64_t tokens, int64_t experts, bool skewed) {
  std::vector<double> w(static_cast<size_t>(experts), 1.0);
  if (skewed)
    for (int64_t e = 0; e < experts; ++e)
      w[static_cast<size_t>(e)] = 1.0 / static_cast<double>(e + 1);
  double sum = 0;
  for (double v : w) sum += v;
  std::vector<int64_t> m(static_cast<size_t>(experts));
  int64_t used = 0;
  for (int64_t e = 0; e < experts; ++e) {
    m[static_cast<size_t>(e)] =
        static_cast<int64_t>(std::floor(w[static_cast<size_t>(e)] / sum * tokens / 128)) * 128;
    used += m[static_cast<size_t>(e)];
  }
  m[0] += tokens - used;  // the remainder (a multiple of 128 when tokens is) to the busiest expert
  return m;
}

// One grouped shape, four GEMMs each against one dense GEMM of the same FLOPs: FP8 Fprop (1x128 x
// 128x128 per expert, BF16 out), FP8 Wgrad (dY's column-wise 1x128 x X's 128x128 from the
// scaling-aware transpose, F32 +=; dense: 1x128 x 1x128), BF16 Fprop (BF16 out) and BF16 Wgrad
// from dY and X as the forward has them (F32 +=). Cells: grouped TFLOPS (grouped / dense).
std::vector<std::string> grouped_row(const Timer& t, int64_t tokens, int64_t experts, bool skewed,
                                     int64_t n, int64_t k) {
  Context& ctx = t.ctx;
  const std::vector<int64_t> sizes = token_counts(tokens, experts, skewed);
  Tensor sizes_h = Tensor::empty({experts}, DType::kI64);
  std::copy(sizes.begin(), sizes.end(), sizes_h.data_as<int64_t>());
  const Tensor sizes_d = sizes_h.to(ctx, ctx.device);
  const Tensor x = random_host(tokens, k, 4, DType::kBF16).to(ctx, ctx.device);
  const Tensor dy = random_host(tokens, n, 7, DType::kBF16).to(ctx, ctx.device);
  const Tensor w = random_host(experts * n, k, 5, DType::kBF16).to(ctx, ctx.device);
  const Tensor w1 = random_host(n, k, 6, DType::kBF16).to(ctx, ctx.device);
  QuantizeArgs qa;
  qa.input = x;
  qa.granularity = Granularity::k1x128;
  qa.rounding = ScaleRounding::kPow2;
  qa.output = QuantizeOutput::kBoth;
  QuantTensor qx = quantize(ctx, qa);
  const QuantTensor qdy = quant(ctx, dy, Granularity::k1x128, QuantizeOutput::kBoth);
  // The dense baselines read MN-major 1x128 scales, as the dense Linear layers write them (no
  // re-layout per call); the grouped kernels read K-major ones.
  qa.scale_layout = ScaleLayout::kMNMajor;
  const QuantTensor qx_mn = quantize(ctx, qa);
  const QuantTensor qx_dense =
      quant(ctx, x, Granularity::k1x128, QuantizeOutput::kBoth, ScaleLayout::kMNMajor);
  const QuantTensor qdy_dense =
      quant(ctx, dy, Granularity::k1x128, QuantizeOutput::kBoth, ScaleLayout::kMNMajor);
  // Stacked weights: n % 128 == 0 here, so one 128x128 quantization of (E * n, k) has per-expert
  // blocks.
  const QuantTensor qw = quant(ctx, w, Granularity::k128x128, QuantizeOutput::kRowwise);
  const QuantTensor qw1 = quant(ctx, w1, Granularity::k128x128, QuantizeOutput::kRowwise);
  Tensor y = Tensor::empty(ctx, {tokens, n}, DType::kBF16);
  Tensor dw = Tensor::empty(ctx, {experts * n, k}, DType::kF32);
  ctx.be().memset(dw.data(), 0, dw.nbytes());
  Tensor dw1 = Tensor::empty(ctx, {n, k}, DType::kF32);
  ctx.be().memset(dw1.data(), 0, dw1.nbytes());
  const Tensor dw3 = dw.reshape({experts, n, k});

  auto pair = [&](const std::function<void()>& dense, const std::function<void()>& grouped) {
    const double d = t.tflops(tokens, n, k, dense), g = t.tflops(tokens, n, k, grouped);
    return fmt(g, 0) + " (" + fmt(g / d, 2) + "x)";
  };
  const std::string fp8_fprop = pair(
      [&] { gemm_fp8(ctx, {.a = rowwise_operand(qx_mn), .b = rowwise_operand(qw1), .d = y}); },
      [&] {
        grouped_gemm_fp8(
            ctx,
            {.a = rowwise_operand(qx), .b = rowwise_operand(qw), .group_sizes = sizes_d, .d = y});
      });
  scaling_aware_transpose(ctx, qx);
  const std::string fp8_wgrad = pair(
      [&] {
        gemm_fp8(ctx, {.a = columnwise_operand(qdy_dense),
                       .b = columnwise_operand(qx_dense),
                       .d = dw1,
                       .accumulate = Accumulate::kAdd});
      },
      [&] {
        grouped_wgrad_fp8(ctx, {.a = columnwise_operand(qdy),
                                .b = columnwise_operand(qx),
                                .group_sizes = sizes_d,
                                .d = dw3,
                                .accumulate = Accumulate::kAdd});
      });
  const std::string bf16_fprop =
      pair([&] { gemm_bf16(ctx, {.a = x, .b = w1, .d = y}); },
           [&] {
             grouped_gemm_bf16(
                 ctx, {.a = x, .b = w.reshape({experts, n, k}), .group_sizes = sizes_d, .d = y});
           });
  const std::string bf16_wgrad = pair(
      [&] {
        gemm_bf16(ctx, {.a = dy,
                        .b = x,
                        .d = dw1,
                        .accumulate = Accumulate::kAdd,
                        .a_layout = OperandLayout::kMNMajor,
                        .b_layout = OperandLayout::kMNMajor});
      },
      [&] {
        grouped_wgrad_bf16(ctx, {.a = dy,
                                 .b = x,
                                 .group_sizes = sizes_d,
                                 .d = dw3,
                                 .accumulate = Accumulate::kAdd,
                                 .layout = OperandLayout::kMNMajor});
      });
  const auto [mn, mx] = std::minmax_element(sizes.begin(), sizes.end());
  return {std::to_string(experts) + (skewed ? " skewed" : " balanced"),
          std::to_string(tokens) + " x " + std::to_string(n) + " x " + std::to_string(k),
          std::to_string(*mn) + ".." + std::to_string(*mx),
          fp8_fprop,
          fp8_wgrad,
          bf16_fprop,
          bf16_wgrad};
}

int run_gemm(const std::vector<std::string>& argv) {
  cli::Args args(argv, {"runs", "warmup", "m"}, {"quick", "no-grouped", "no-dense"});
  args.expect_positional(
      0, 0, "octet bench gemm [--quick] [--m M] [--runs N] [--no-grouped] [--no-dense]");
  Context ctx = make_context(Device::kCuda);
  const int runs = static_cast<int>(args.get_int("runs", 20)),
            warmup = static_cast<int>(args.get_int("warmup", 3));
  OCTET_CHECK(runs >= 1 && warmup >= 0, "--runs must be >= 1 and --warmup >= 0");
  const bool quick = args.has("quick");
  std::vector<int64_t> ms =
      quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{128, 4096, 16384};
  if (args.get("m")) ms = {args.get_int("m", 4096)};
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {2112, 7168}, {24576, 1536}, {32768, 512}, {7168, 16384}, {4096, 7168}, {7168, 2048}};
  L2Flusher flush(ctx);
  const Timer t{ctx, warmup, runs, flush};
  std::printf(
      "device: %s; median of %d runs, L2 flushed; TFLOPS (ratio to BF16 of the same shape)\n\n",
      cuda_device_info(ctx.device_index).name.c_str(), runs);
  if (!args.has("no-dense")) {
    std::vector<std::vector<std::string>> rows;
    for (int64_t m : ms)
      for (auto [n, k] : shapes) rows.push_back(dense_row(t, m, n, k));
    if (!quick && !args.get("m")) rows.push_back(dense_row(t, 8192, 8192, 8192));
    print_table({"M x N x K", "BF16", "FP8 tensor", "FP8 row", "blockwise Fprop", "blockwise Dgrad",
                 "blockwise Wgrad +="},
                rows);
  }
  if (!args.has("no-grouped")) {
    std::printf(
        "\ngrouped GEMMs (on Hopper with CUTLASS one launch each, reading the row counts on the\n"
        "device): TFLOPS (ratio to one dense GEMM of the same FLOPs and precision)\n");
    struct GroupedShape {
      int64_t tokens, experts;
      bool skewed;
      int64_t n, k;
    };
    // The baseline configuration's expert GEMMs (gate/up, a 768-wide variant, down with K = 704)
    // and DeepSeek-V3's (gate/up with 8 and 32 experts, skewed, down); then the baseline's gate/up
    // FLOPs in 1 and 4 groups, which separates what the grouped kernel loses per group from what
    // it loses on any GEMM of these shapes.
    const std::vector<GroupedShape> grouped = {
        {65536, 32, false, 1408, 1024}, {65536, 32, false, 1024, 768},
        {65536, 32, false, 1024, 704},  {16384, 8, false, 4096, 7168},
        {16384, 32, false, 4096, 7168}, {16384, 32, true, 4096, 7168},
        {16384, 32, false, 7168, 2048}, {65536, 1, false, 1408, 1024},
        {65536, 4, false, 1408, 1024}};
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 0; i < grouped.size(); ++i)
      if (!quick || i == 0) {
        const GroupedShape& g = grouped[i];
        rows.push_back(grouped_row(t, g.tokens, g.experts, g.skewed, g.n, g.k));
      }
    print_table({"experts", "tokens x N x K", "tokens/expert", "FP8 Fprop",
                 "FP8 Wgrad +=", "BF16 Fprop", "BF16 Wgrad +="},
                rows);
  }
  return 0;
}

// --- gemm-accum: the accumulator-precision table (CPU emulation)
// -----------------------------------------

double rel_error(const std::vector<double>& ref, const Tensor& d) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = d.data_as<const float>()[i] - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

int run_accum(const std::vector<std::string>& argv) {
  cli::Args args(argv, {"m", "n", "bits", "seed"}, {});
  args.expect_positional(0, 0, "octet bench gemm-accum [--m M --n N] [--bits B] [--seed S]");
  const int64_t m = args.get_int("m", 32), n = args.get_int("n", 32);
  const int bits = static_cast<int>(args.get_int("bits", 14));
  OCTET_CHECK(bits >= 1 && bits <= 23, "--bits must be in [1, 23]");
  Context cpu = make_context(Device::kCpu);
  std::printf(
      "D = A B^T, A (%lld, K) and B (%lld, K) Gaussian, FP8 E4M3 per-tensor scales; relative "
      "Frobenius\n"
      "error against FP64 of the same FP8 inputs (CPU emulation, ops/gemm "
      "AccumulatorEmulation)\n\n",
      static_cast<long long>(m), static_cast<long long>(n));
  std::vector<std::vector<std::string>> rows;
  for (int64_t k = 256; k <= 16384; k *= 2) {
    const uint64_t seed = static_cast<uint64_t>(args.get_int("seed", 1)) + static_cast<uint64_t>(k);
    const QuantTensor qa = quant(cpu, random_host(m, k, seed, DType::kF32), Granularity::kTensor,
                                 QuantizeOutput::kRowwise);
    const QuantTensor qb = quant(cpu, random_host(n, k, seed + 7, DType::kF32),
                                 Granularity::kTensor, QuantizeOutput::kRowwise);
    const Tensor da = dequantize(cpu, qa, DType::kF32), db = dequantize(cpu, qb, DType::kF32);
    std::vector<double> ref(static_cast<size_t>(m * n), 0.0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t c = 0; c < k; ++c)
          ref[static_cast<size_t>(i * n + j)] +=
              static_cast<double>(da.data_as<float>()[i * k + c]) * db.data_as<float>()[j * k + c];
    std::vector<std::string> row = {std::to_string(k)};
    for (const AccumulatorEmulation emu :
         {AccumulatorEmulation{bits, 0}, AccumulatorEmulation{bits, 128},
          AccumulatorEmulation::fp32()}) {
      Tensor d = Tensor::empty({m, n}, DType::kF32);
      GemmFp8Args g;
      g.a = rowwise_operand(qa);
      g.b = rowwise_operand(qb);
      g.d = d;
      g.emulation = emu;
      gemm_fp8(cpu, g);
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2e", rel_error(ref, d));
      row.push_back(buf);
    }
    rows.push_back(row);
  }
  const std::string b = std::to_string(bits);
  print_table(
      {"K", b + "-bit, never promoted", b + "-bit, promoted every 128", "FP32 accumulation"}, rows);
  return 0;
}

}  // namespace

Suite gemm_suite() {
  return {
      "gemm", "dense and grouped GEMM TFLOPS per recipe vs BF16 (GPU)",
      "usage: octet bench gemm [--quick] [--m M] [--runs N] [--warmup N] [--no-grouped] "
      "[--no-dense]\n\n"
      "DeepSeek-V3 shapes (N, K) = (2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), "
      "(4096, 7168),\n"
      "(7168, 2048) at M = 128, 4096, 16384, plus 8192^3: BF16, FP8 per-tensor, row-wise, and "
      "blockwise\n"
      "(1x128 x 128x128) Fprop, Dgrad and Wgrad (+= FP32) in TFLOPS with the ratio to BF16; then "
      "the grouped\n"
      "MoE Fprop (8 and 32 experts, balanced and skewed token counts, 16384 tokens) against a "
      "dense FP8 GEMM\n"
      "of equal FLOPs. --quick: M = 4096 and one grouped shape (about a minute). --m: one M only.\n"
      "Median of --runs (default 20), L2 flushed before each run.",
      run_gemm};
}

Suite gemm_accum_suite() {
  return {"gemm-accum", "FP8 GEMM error vs K for a limited-precision accumulator (CPU emulation)",
          "usage: octet bench gemm-accum [--m M --n N] [--bits B] [--seed S]\n\n"
          "The table of docs/numerics.md: relative error of a (M x K) x (K x N) FP8 GEMM (default "
          "32 x 32) for K\n"
          "from 256 to 16384, with a B-bit truncating accumulator (default 14, DeepSeek-V3's "
          "figure for Hopper)\n"
          "never promoted, promoted into FP32 every 128 elements, and plain FP32 accumulation. "
          "Runs on the CPU.",
          run_accum};
}

}  // namespace octet::bench
