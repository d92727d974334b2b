// `octet bench moe-dispatch`: the MoE dispatch, combine and router kernels against a
// device-to-device copy of the same bytes, timed in the same run.
//
// Bytes counted are the fewest an op must move: every input read once, every output written once
// (a permuted row that several kernels of the op touch still counts once). "copy us" is a cudaMemcpy
// moving the same bytes (half read, half written); "of copy" = copy time / op time, the op's share
// of the copy bandwidth. The routing comes from the router itself on random logits, so the expert
// loads are those of a real (untrained) router. L2 flushed before every timed call.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench.h"
#include "cli.h"
#include "ops/moe_permute/moe_permute.h"
#include "ops/moe_router/moe_router.h"

namespace octet::bench {
namespace {

struct MoeShape {
  std::string name;
  int64_t tokens, hidden, experts, top_k, sequences, n_group, topk_group;
};

// Random, never constant data from a host LCG (a few outliers), copied once.
Tensor random_tensor(Context& ctx, int64_t rows, int64_t cols, DType dtype, uint64_t seed,
                     float scale) {
  Tensor h = Tensor::empty({rows, cols}, dtype);
  uint64_t s = 0x9E3779B97F4A7C15ull ^ seed;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int32_t>(s >> 32)) * 0x1p-31f;
  };
  for (int64_t i = 0; i < rows * cols; ++i) {
    float v = (next() + next() + next()) * scale;
    if ((i & 1023) == 7) v *= 30.0f;
    if (dtype == DType::kBF16)
      h.data_as<uint16_t>()[i] = float_to_bf16(v);
    else
      h.data_as<float>()[i] = v;
  }
  return h.to(ctx, ctx.device);
}

// The FP8 dispatch's quantization: 1x128 E4M3 with power-of-2 scales.
QuantizeArgs pow2_args(const Tensor& x) {
  return {.input = x,
          .format = Fp8Format::kE4M3,
          .granularity = Granularity::k1x128,
          .rounding = ScaleRounding::kPow2};
}

struct Timed {
  std::string op;
  double bytes;
  std::function<void()> fn;
};

std::vector<std::vector<std::string>> run_shape(Context& ctx, const MoeShape& sh, int warmup,
                                                int runs, L2Flusher& flush) {
  const int64_t T = sh.tokens, D = sh.hidden, E = sh.experts, k = sh.top_k;
  const RouterConfig rc{
      .num_experts = E, .top_k = k, .n_group = sh.n_group, .topk_group = sh.topk_group};
  const Tensor logits = random_tensor(ctx, T, E, DType::kF32, 1, 1.0f);
  const Tensor bias = random_tensor(ctx, 1, E, DType::kF32, 6, 1e-3f).reshape({E});
  const RouterOutput route =
      moe_router_forward(ctx, {.logits = logits, .bias = bias, .config = rc});
  const PermuteMap map = moe_permute_map(
      ctx, {.topk_idx = route.topk_idx, .num_experts = E, .padding = PermutePadding::kTo128});
  const int64_t R = map.num_rows, Tk = T * k, groups = ceil_div(D, int64_t{128});
  const Tensor x = random_tensor(ctx, T, D, DType::kBF16, 2, 1.0f);
  const Tensor y = random_tensor(ctx, R, D, DType::kBF16, 3, 1.0f);
  const Tensor dy = random_tensor(ctx, T, D, DType::kBF16, 4, 1e-3f);
  const Tensor gw = random_tensor(ctx, T, k, DType::kF32, 5, 1.0f);
  Tensor d_logits = random_tensor(ctx, T, E, DType::kF32, 7, 1e-3f);
  const double bf = 2.0, dTD = static_cast<double>(T * D), dTkD = static_cast<double>(Tk * D),
               dRD = static_cast<double>(R * D), dTE = static_cast<double>(T * E),
               dTk = static_cast<double>(Tk);
  const SeqBalanceLossArgs bal{
      .logits = logits, .topk_idx = route.topk_idx, .num_sequences = sh.sequences, .alpha = 1e-4f};
  const std::vector<Timed> ops = {
      {"router forward (route, counts)", 4 * dTE + 8 * dTk + 4 * E,
       [&] { moe_router_forward(ctx, {.logits = logits, .bias = bias, .config = rc}); }},
      {"router backward", 4 * dTk + 4 * dTk + 4 * dTk + 4 * dTE,
       [&] {
         moe_router_backward(
             ctx,
             {.logits = logits, .topk_idx = route.topk_idx, .d_topk_weight = gw, .config = rc});
       }},
      {"balance loss forward", 4 * dTE + 4 * dTk, [&] { moe_seq_balance_loss_forward(ctx, bal); }},
      {"balance loss backward", 4 * dTE + 4 * dTk + 8 * dTE,
       [&] { moe_seq_balance_loss_backward(ctx, bal, 1.0f, d_logits); }},
      {"permute map (sort, rows)", 4 * dTk + 4 * dTk + 4 * static_cast<double>(R),
       [&] {
         moe_permute_map(
             ctx,
             {.topk_idx = route.topk_idx, .num_experts = E, .padding = PermutePadding::kTo128});
       }},
      {"permute + quantize fp8 (dispatch)", bf * dTD + dRD + 4.0 * static_cast<double>(R * groups),
       [&] { moe_permute_quantize(ctx, map, pow2_args(x)); }},
      // fp8-flow's backward dispatch of dY with down's Wgrad copy: one pass, against the two it
      // replaced (the dispatch keeping the token rows, then their gathered transpose).
      {"permute + quantize + transpose (dispatch with column-wise copy)",
       bf * dTD + 2 * dRD + 8.0 * static_cast<double>(R * groups),
       [&] { moe_permute_quantize_transposed(ctx, map, pow2_args(x), Granularity::k1x128); }},
      {"  the same as two passes (keep rows, gathered transpose)",
       bf * dTD + 2 * dRD + 8.0 * static_cast<double>(R * groups),
       [&] {
         const PermuteQuantizeResult kept =
             moe_permute_quantize_keeping_rows(ctx, map, pow2_args(x));
         moe_permute_transposed(ctx, map, kept.rows, Granularity::k1x128);
       }},
      {"permute bf16 (dispatch)", bf * dTD + bf * dRD, [&] { moe_permute(ctx, map, x); }},
      {"combine (weighted gather)", bf * dTkD + 4 * dTk + bf * dTD,
       [&] { moe_combine(ctx, map, {.expert_out = y, .topk_weight = route.topk_weight}); }},
      {"permute backward (gather)", bf * dTkD + bf * dTD,
       [&] { moe_permute_backward(ctx, map, y, DType::kBF16); }},
      {"combine backward (rows + weights)", bf * dTD + bf * dTkD + bf * dRD + 8 * dTk,
       [&] {
         moe_combine_backward(ctx, map,
                              {.d_out = dy, .expert_out = y, .topk_weight = route.topk_weight});
       }},
  };
  std::vector<std::vector<std::string>> table;
  for (const Timed& op : ops) {
    const double us = time_op(ctx, op.fn, warmup, runs, flush).median_ms * 1e3;
    // A device-to-device copy moving the same bytes: bytes / 2 read and bytes / 2 written.
    const int64_t half = std::max<int64_t>(16, static_cast<int64_t>(op.bytes / 2));
    Tensor a = Tensor::empty(ctx, {half}, DType::kU8), b = Tensor::empty(ctx, {half}, DType::kU8);
    ctx.be().memset(a.data(), 0x3C, half);
    const double copy_us =
        time_op(
            ctx, [&] { ctx.be().copy(b.data(), a.data(), half, CopyKind::kDeviceToDevice); },
            warmup, runs, flush)
            .median_ms *
        1e3;
    table.push_back({sh.name, op.op, fmt(op.bytes / 1e6, 1), fmt(us, 1),
                     fmt(op.bytes / (us * 1e-6) / 1e9, 0), fmt(copy_us, 1),
                     fmt(100.0 * copy_us / us, 0) + "%"});
  }
  return table;
}

int run(const std::vector<std::string>& argv) {
  cli::Args args(argv, {"runs", "warmup"}, {});
  args.expect_positional(0, 0, "octet bench moe-dispatch [--runs N] [--warmup N]");
  const int runs = static_cast<int>(args.get_int("runs", 30));
  const int warmup = static_cast<int>(args.get_int("warmup", 3));
  OCTET_CHECK(runs >= 1 && warmup >= 0, "--runs must be >= 1 and --warmup >= 0");
  OCTET_CHECK(cuda_device_count() > 0, "octet bench moe-dispatch: needs a CUDA device");
  Context ctx = make_context(Device::kCuda);
  const double copy_gbs = copy_bandwidth_gbs(ctx, int64_t{1} << 30, runs);
  std::printf("device: %s\n", cuda_device_info(ctx.device_index).name.c_str());
  std::printf("device-to-device copy (1 GiB): %.0f GB/s (bytes read + written, median of %d)\n\n",
              copy_gbs, runs);
  const std::vector<MoeShape> shapes = {
      {"baseline", 16384, 1024, 32, 4, 8, 1, 1},    // configs/baseline-h100.toml: 8 x 2048
      {"dsv3-slice", 4096, 7168, 16, 4, 1, 4, 2}};  // configs/dsv3-slice.toml: 1 x 4096
  L2Flusher flush(ctx);
  std::vector<std::vector<std::string>> table;
  for (const MoeShape& sh : shapes)
    for (auto& row : run_shape(ctx, sh, warmup, runs, flush)) table.push_back(std::move(row));
  std::printf(
      "baseline: 16384 tokens x 1024, 32 experts top-4, 8 sequences; dsv3-slice: 4096 tokens x "
      "7168, 16 experts in 4 groups top-2 groups top-4, 1 sequence; rows padded to 128 per "
      "expert, BF16 payloads\n");
  print_table({"shape", "op", "MB", "us", "GB/s", "copy us", "of copy"}, table);
  return 0;
}

}  // namespace

Suite moe_dispatch_suite() {
  return {"moe-dispatch", "MoE dispatch / combine / router kernels vs a copy of the same bytes",
          "usage: octet bench moe-dispatch [--runs N] [--warmup N]\n\n"
          "The MoE layer's memory-bound kernels (router forward and backward, balance loss, "
          "permute map,\n"
          "fused permute + FP8 quantize, BF16 permute, weighted combine and its backward) on the "
          "baseline\n"
          "configuration's shapes and on a DeepSeek-V3 slice, each against a device-to-device "
          "copy of the\n"
          "same number of bytes timed in the same run. Median of --runs (default 30), L2 flushed "
          "before each.",
          run};
}

}  // namespace octet::bench
