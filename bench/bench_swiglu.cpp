// `octet bench swiglu`: the SwiGLU kernels of the MoE layer against a device-to-device copy of the
// same byte count, timed in the same run with the L2 flushed before each run.
//
// Bytes counted are the fewest an op must move: every input read once, every output written once.
//   op                                  | reads                  | writes
//   ------------------------------------|------------------------|-----------------------------------
//   forward (bf16 h)                    | gate_up                | h (bf16)
//   quantize (deepseek, fp8 h)          | gate_up                | h (fp8), 1x128 scales
//   quantize + row weight (fp8-flow)    | gate_up, weights       | h (fp8), 1x128 scales
//   backward (deepseek, bf16 d_gate_up) | gate_up, dh            | d_gate_up (bf16)
//   backward quantize (fp8-flow)        | gate_up, dh, weights   | d_gate_up (fp8), scales, d_weight
//   ... + h (from fp8 gu only)          | the same               | the same, and h (fp8), its scales
//   quantize + cache gu (deepseek)      | gate_up                | h and gate_up (fp8), their scales
//   ... from fp8 gu (the rows below)    | gate_up's fp8 copy and its scales in place of gate_up
// "of copy" = copy time / op time for a copy that reads and writes the op's byte count in total;
// "scalar us" = the same op on a gate_up that is not 16-byte aligned, which takes the scalar kernels
// (the code before the vectorised ones), and "speedup" = scalar us / us ("-" for the rows of the
// FP8 gate_up cache, Recipe::moe_swiglu_input fp8, which always take the vectorised kernels here).
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench.h"
#include "cli.h"
#include "ops/swiglu/swiglu.h"

namespace octet::bench {
namespace {

struct ShapeSet {
  const char* name;
  int64_t rows, f;
};

double scale_bytes(int64_t rows, int64_t cols) {
  return 4.0 * static_cast<double>(shape_numel(scale_shape(Granularity::k1x128, rows, cols)));
}

int run(const std::vector<std::string>& argv) {
  cli::Args args(argv, {"rows", "runs", "warmup"}, {});
  args.expect_positional(0, 0, "octet bench swiglu [--rows R] [--runs N] [--warmup N]");
  OCTET_CHECK(cuda_device_count() > 0, "octet bench swiglu: needs a CUDA device, found none");
  Context ctx = make_context(Device::kCuda);
  const int runs = static_cast<int>(args.get_int("runs", 20));
  const int warmup = static_cast<int>(args.get_int("warmup", 3));
  OCTET_CHECK(runs >= 1 && warmup >= 0, "--runs must be >= 1 and --warmup >= 0");
  // configs/baseline-h100.toml: 16384 tokens x top-4 = 65536 expert rows, expert width 704;
  // DeepSeek-V3's slice: 16384 rows, moe_intermediate_size 2048.
  std::vector<ShapeSet> sets = {{"baseline experts", 65536, 704},
                                {"DeepSeek-V3 slice", 16384, 2048}};
  if (args.get("rows")) {
    const int64_t r = args.get_int("rows", 0);
    OCTET_CHECK(r >= 1, "--rows must be >= 1, got ", r);
    for (ShapeSet& s : sets) s.rows = r;
  }
  std::printf("device: %s\n", cuda_device_info(ctx.device_index).name.c_str());
  std::printf("median of %d runs, L2 flushed before each; E4M3, power-of-2 scales\n\n", runs);

  L2Flusher flush(ctx);
  std::vector<std::vector<std::string>> table;
  for (const ShapeSet& s : sets) {
    const int64_t rows = s.rows, f = s.f;
    const double n = static_cast<double>(rows) * static_cast<double>(f), r4 = 4.0 * rows;
    const Tensor gu = random_bf16(ctx, {rows, 2 * f}, 11);
    const Tensor dh = random_bf16(ctx, {rows, f}, 12);
    Tensor w = Tensor::empty({rows}, DType::kF32);
    for (int64_t i = 0; i < rows; ++i) w.data_as<float>()[i] = 0.05f + 0.9f * (i % 97) / 97.0f;
    w = w.to(ctx, Device::kCuda);
    Tensor h = Tensor::empty(ctx, {rows, f}, DType::kBF16);
    Tensor dgu = Tensor::empty(ctx, {rows, 2 * f}, DType::kBF16);
    // The same gate_up one element past a 16-byte boundary: the scalar kernels (what ran before the
    // vectorised ones), for the speedup column.
    const Tensor gu_buf = Tensor::empty(ctx, {rows * 2 * f + 8}, DType::kBF16);
    ctx.be().copy(gu_buf.data_as<uint16_t>() + 1, gu.data(), gu.nbytes(),
                  CopyKind::kDeviceToDevice);
    const Tensor gu_scalar =
        Tensor::wrap(gu_buf.data_as<uint16_t>() + 1, {rows, 2 * f}, DType::kBF16, Device::kCuda);
    // gate_up's 1x128 FP8 copy (what Recipe::moe_swiglu_input fp8 keeps for the backward).
    const QuantTensor gu8 = swiglu_quantize_caching_input(ctx, {.gate_up = gu}).gate_up;
    const double n8 = 2 * n + scale_bytes(rows, 2 * f);  // the copy's bytes
    struct Op {
      const char* name;
      double bytes;
      std::function<void(const Tensor&)> fn;
      bool scalar = true;  // also timed on the unaligned gate_up
    };
    const std::vector<Op> ops = {
        {"forward (bf16 h)", 4 * n + 2 * n,
         [&](const Tensor& x) { swiglu_forward(ctx, {.gate_up = x, .h = h}); }},
        {"quantize (deepseek)", 4 * n + n + scale_bytes(rows, f),
         [&](const Tensor& x) { swiglu_quantize(ctx, {.gate_up = x}); }},
        {"quantize + row weight (fp8-flow)", 4 * n + r4 + n + scale_bytes(rows, f),
         [&](const Tensor& x) { swiglu_quantize(ctx, {.gate_up = x, .row_weight = w}); }},
        {"backward (deepseek, bf16)", 4 * n + 2 * n + 4 * n,
         [&](const Tensor& x) {
           swiglu_backward(ctx, {.dh = dh, .gate_up = x, .d_gate_up = dgu});
         }},
        {"backward quantize (fp8-flow)", 4 * n + 2 * n + r4 + 2 * n + scale_bytes(rows, 2 * f) + r4,
         [&](const Tensor& x) {
           swiglu_backward_quantize(ctx, {.dh = dh, .gate_up = x, .row_weight = w});
         }},
        {"quantize + cache gu (deepseek)", 4 * n + n + scale_bytes(rows, f) + n8,
         [&](const Tensor&) { swiglu_quantize_caching_input(ctx, {.gate_up = gu}); }, false},
        {"quantize from fp8 gu (recompute)", n8 + n + scale_bytes(rows, f),
         [&](const Tensor&) { swiglu_quantize(ctx, {.gate_up_fp8 = gu8}); }, false},
        {"backward from fp8 gu (deepseek)", n8 + 2 * n + 4 * n,
         [&](const Tensor&) {
           swiglu_backward(ctx, {.dh = dh, .d_gate_up = dgu, .gate_up_fp8 = gu8});
         },
         false},
        {"backward quantize from fp8 gu (fp8-flow)",
         n8 + 2 * n + r4 + 2 * n + scale_bytes(rows, 2 * f) + r4,
         [&](const Tensor&) {
           swiglu_backward_quantize(ctx, {.dh = dh, .row_weight = w, .gate_up_fp8 = gu8});
         },
         false},
        // What fp8-flow's step runs with model.moe_recompute: h made again in the same pass.
        {"... + h (fp8-flow, recompute)",
         n8 + 2 * n + r4 + 2 * n + scale_bytes(rows, 2 * f) + r4 + n + scale_bytes(rows, f),
         [&](const Tensor&) {
           swiglu_backward_quantize(
               ctx, {.dh = dh, .row_weight = w, .gate_up_fp8 = gu8, .want_h = true});
         },
         false},
    };
    for (const Op& op : ops) {
      const double ms = time_op(
                            ctx, [&] { op.fn(gu); }, warmup, runs, flush)
                            .median_ms;
      const double scalar_ms = op.scalar ? time_op(
                                               ctx, [&] { op.fn(gu_scalar); }, warmup, runs, flush)
                                               .median_ms
                                         : 0.0;
      // A copy that reads and writes the op's byte count in total.
      const auto half = static_cast<int64_t>(op.bytes / 2);
      Tensor a = Tensor::empty(ctx, {half}, DType::kU8), b = Tensor::empty(ctx, {half}, DType::kU8);
      ctx.be().memset(a.data(), 0x3C, half);
      const double copy_ms =
          time_op(
              ctx, [&] { ctx.be().copy(b.data(), a.data(), half, CopyKind::kDeviceToDevice); },
              warmup, runs, flush)
              .median_ms;
      const double gbs = op.bytes / (ms * 1e-3) / 1e9;
      table.push_back({s.name, std::to_string(rows) + " x 2*" + std::to_string(f), op.name,
                       fmt(op.bytes / 1e6, 0), fmt(ms * 1e3, 1), fmt(gbs, 0), fmt(copy_ms * 1e3, 1),
                       fmt(100.0 * copy_ms / ms, 1) + "%",
                       op.scalar ? fmt(scalar_ms * 1e3, 1) : "-",
                       op.scalar ? fmt(scalar_ms / ms, 2) + "x" : "-"});
    }
  }
  print_table(
      {"shapes", "gate_up", "op", "MB", "us", "GB/s", "copy us", "of copy", "scalar us", "speedup"},
      table);
  return 0;
}

}  // namespace

Suite swiglu_suite() {
  return {
      "swiglu", "SwiGLU kernels (fused quantize, backward) vs a device copy of the same bytes",
      "usage: octet bench swiglu [--rows R] [--runs N] [--warmup N]\n\n"
      "The MoE layer's SwiGLU kernels (forward, fused 1x128 quantize with and without the "
      "routing weight,\n"
      "backward, backward fused with the 1x128 quantize of d_gate_up) on BF16 inputs of the "
      "baseline's\n"
      "expert shapes (65536 rows x 2*704) and a DeepSeek-V3 slice (16384 rows x 2*2048; --rows "
      "sets both\n"
      "row counts): median microseconds of --runs (default 20) with the L2 flushed before each, "
      "the bytes\n"
      "each must move, GB/s, and the time of a device-to-device copy moving the same bytes in "
      "the same run;\n"
      "then the scalar kernels' time on the same data (gate_up not 16-byte aligned) and the "
      "speedup.\n"
      "Then the same ops with gate_up cached in FP8 (Recipe::moe_swiglu_input fp8): the forward "
      "that also\n"
      "writes the copy, and the recompute quantize, backward and fp8-flow backward quantize "
      "reading it.",
      run};
}

}  // namespace octet::bench
