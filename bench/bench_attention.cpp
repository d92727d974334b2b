// `octet bench attention`: the causal attention core (forward, backward) in TFLOPS at an MLA-sized
// shape. FLOPs are the algorithm's useful work on the causal half, T(T+1)/2 (query, key) pairs per
// head: forward 2 * pairs * (Dqk + Dv) (Q K^T and P V), backward 2 * pairs * (3 Dqk + 2 Dv) (Q K^T
// recomputed, dO V^T, P^T dO, dS^T Q, dS K). Kernels that recompute more than that (the dQ pass
// recomputes Q K^T and dO V^T) are charged only the useful work.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench.h"
#include "cli.h"
#include "numerics/fp8.h"
#include "ops/attention/attention.h"
#include "ops/cast/cast.h"
#include "ops/rope/rope.h"
#include "ops/rope/rope_key.h"

namespace octet::bench {
namespace {

// MLA's RoPE on the attention inputs of the first shape: q (B, T, H, 96) with the rope part at 64,
// and the shared key row (B, T, kv_lora 256 + 32) with it at 256, forward and backward; then the
// layer's two fused memory-bound kernels around attention, each with its previous kernel beside
// it (the same bits, ops/rope/rope_key.h and ops/cast/cast.h):
//   key    rope_key_forward: k (B, T, H, 64 + 32) from kv's nope columns (B, T, H, 64 + 64) and the
//          rotated k_pe row broadcast over the heads; bytes = k written + kv's 64 nope columns
//          read + k_pe's 32 rope columns read (the v columns between are never touched)
//   E5M6   round_to_storage of the o_proj input (B T, H 64) in DeepSeek-V3's E5M6 (1x128 tiles);
//          bytes = input read + output written
// Memory-bound (the whole row is written, the non-rope channels copied): GB/s of those bytes,
// against the device copy bandwidth.
void rope_table(Context& ctx, int64_t B, int64_t T, int64_t H, int warmup, int runs) {
  const double copy_gbs = copy_bandwidth_gbs(ctx, int64_t{1} << 30, runs);
  L2Flusher flush(ctx);
  const RopeTable tb = make_rope_table(ctx, T, 32, 10000.0);
  struct RopeShape {
    const char* name;
    Shape shape;
    int64_t offset;
  };
  const RopeShape shapes[] = {{"q (B, T, H, 64 + 32)", {B, T, H, 96}, 64},
                              {"k_pe row (B, T, 256 + 32)", {B, T, 288}, 256}};
  std::vector<std::vector<std::string>> table;
  const auto row = [&](const std::string& name, const std::string& what,
                       const std::function<void()>& fn, double bytes) {
    const double ms = time_op(ctx, fn, warmup, runs, flush).median_ms;
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    table.push_back(
        {name, what, fmt(ms * 1e3, 1), fmt(gbs, 0), fmt(100.0 * gbs / copy_gbs, 1) + "%"});
  };
  for (const RopeShape& rs : shapes) {
    const Tensor x = random_bf16(ctx, rs.shape, 5);
    for (bool forward : {true, false}) {
      const RopeArgs a{.input = x, .table = tb, .pairing = RopePairing::kHalf, .offset = rs.offset};
      row(
          rs.name, forward ? "forward" : "backward",
          [&] { forward ? rope_forward(ctx, a) : rope_backward(ctx, a); },
          2.0 * static_cast<double>(x.nbytes()));
    }
  }
  const Tensor kv = random_bf16(ctx, {B, T, H, 128}, 6), kr = random_bf16(ctx, {B, T, 288}, 7);
  const double key_bytes =
      2.0 * static_cast<double>(B * T) * static_cast<double>(H * 96 + H * 64 + 32);
  for (RopeKeyKernel kernel : {RopeKeyKernel::kAuto, RopeKeyKernel::kPerChunk})
    row(
        "key k (B, T, H, 64 + 32) from kv, k_pe",
        kernel == RopeKeyKernel::kAuto ? "forward, block kernel" : "forward, per-chunk (previous)",
        [&] {
          rope_key_forward(ctx, {.kv = kv,
                                 .nope = 64,
                                 .kr = kr,
                                 .kr_col = 256,
                                 .table = tb,
                                 .pairing = RopePairing::kHalf,
                                 .kernel = kernel});
        },
        key_bytes);
  const Tensor o = random_bf16(ctx, {B * T, H * 64}, 8);
  for (StorageKernel kernel : {StorageKernel::kAuto, StorageKernel::kGenericEncode})
    row(
        "E5M6 o_proj input (B T, H 64)",
        kernel == StorageKernel::kAuto ? "integer encode" : "generic encode (previous)",
        [&] { round_to_storage(ctx, o, kE5M6Format, kernel); },
        2.0 * static_cast<double>(o.nbytes()));
  std::printf("\nrope, the MLA key and E5M6 storage (BF16, rope dim 32; device copy %.0f GB/s):\n",
              copy_gbs);
  print_table({"tensor", "direction / kernel", "us", "GB/s", "of copy"}, table);
}

int run(const std::vector<std::string>& argv) {
  cli::Args args(argv, {"device", "batch", "seq", "heads", "dqk", "dv", "runs", "warmup"}, {});
  args.expect_positional(
      0, 0,
      "octet bench attention [--device cuda|cpu] [--batch B --seq T --heads H --dqk D --dv D]");
  const std::string dev = args.choice("device", {"cuda", "cpu"}, "cuda");
  Context ctx = make_context(dev == "cuda" ? Device::kCuda : Device::kCpu);
  const int runs = static_cast<int>(args.get_int("runs", 20)),
            warmup = static_cast<int>(args.get_int("warmup", 3));
  OCTET_CHECK(runs >= 1 && warmup >= 0, "--runs must be >= 1 and --warmup >= 0");
  struct Shape5 {
    int64_t B, T, H, dqk, dv;
  };
  // The baseline configuration's shape, the same with DeepSeek-V3's head dims, and DeepSeek-V3's
  // own attention (128 heads of (192, 128) at T = 4096); or the one shape the flags give.
  std::vector<Shape5> shapes = {
      {8, 2048, 16, 96, 64}, {8, 2048, 16, 192, 128}, {1, 4096, 128, 192, 128}};
  if (dev == "cpu") shapes = {{1, 256, 16, 96, 64}, {1, 256, 16, 192, 128}};
  if (args.get("batch") || args.get("seq") || args.get("heads") || args.get("dqk") ||
      args.get("dv"))
    shapes = {{args.get_int("batch", 8), args.get_int("seq", 2048), args.get_int("heads", 16),
               args.get_int("dqk", 192), args.get_int("dv", 128)}};
  std::printf("device: %s\n",
              dev == "cuda" ? cuda_device_info(ctx.device_index).name.c_str() : "cpu");
  std::vector<std::vector<std::string>> table;
  for (const auto& [B, T, H, dqk, dv] : shapes) {
    const Tensor q = random_bf16(ctx, {B, T, H, dqk}, 1), k = random_bf16(ctx, {B, T, H, dqk}, 2);
    const Tensor v = random_bf16(ctx, {B, T, H, dv}, 3), dO = random_bf16(ctx, {B, T, H, dv}, 4);
    const auto f = attention_forward(ctx, {.q = q, .k = k, .v = v, .softmax_scale = 0.0f});
    const double fwd =
        time_op(
            ctx, [&] { attention_forward(ctx, {.q = q, .k = k, .v = v, .softmax_scale = 0.0f}); },
            warmup, runs)
            .median_ms;
    // The backward both ways: cuDNN's deterministic algorithm (the default) and the one that sums
    // dQ with FP32 atomics (model.deterministic_attention = false), each chunked under the default
    // workspace cap as the model runs it; and the deterministic one as one unchunked call, which is
    // what the chunks cost.
    const auto time_bwd = [&](bool deterministic, int64_t max_workspace) {
      return time_op(
                 ctx,
                 [&] {
                   attention_backward(ctx, {.q = q,
                                            .k = k,
                                            .v = v,
                                            .o = f.o,
                                            .lse = f.lse,
                                            .grad_o = dO,
                                            .softmax_scale = 0.0f,
                                            .deterministic = deterministic,
                                            .max_workspace_bytes = max_workspace});
                 },
                 warmup, runs)
          .median_ms;
    };
    const double bwd = time_bwd(true, 0), bwd_atomics = time_bwd(false, 0),
                 bwd_whole = time_bwd(true, INT64_MAX);
    const double pairs =
        static_cast<double>(B * H) * static_cast<double>(T) * static_cast<double>(T + 1) / 2;
    const double fwd_flops = 2 * pairs * static_cast<double>(dqk + dv),
                 bwd_flops = 2 * pairs * static_cast<double>(3 * dqk + 2 * dv);
    const std::string shape = std::to_string(B) + "x" + std::to_string(T) + "x" +
                              std::to_string(H) + " (" + std::to_string(dqk) + ", " +
                              std::to_string(dv) + ")";
    const AttentionWorkspace ws = attention_workspace(ctx, B, T, H, dqk, dv);
    const AttentionWorkspace whole = attention_workspace(ctx, B, T, H, dqk, dv, 0.0f, INT64_MAX);
    table.push_back({shape, fmt(fwd, 3), fmt(fwd_flops / (fwd * 1e-3) / 1e12, 1), fmt(bwd, 3),
                     fmt(bwd_flops / (bwd * 1e-3) / 1e12, 1), fmt(bwd / fwd, 2), fmt(bwd_whole, 3),
                     fmt(bwd_atomics, 3), fmt(bwd_flops / (bwd_atomics * 1e-3) / 1e12, 1),
                     fmt(ws.forward_bytes / 1048576.0, 1) + " / " +
                         fmt(ws.backward_bytes / 1048576.0, 1) + " x " +
                         std::to_string(ws.backward_chunks),
                     fmt(whole.backward_bytes / 1048576.0, 1)});
  }
  print_table({"B x T x H (Dqk, Dv)", "fwd ms", "fwd TFLOPS", "bwd ms", "bwd TFLOPS", "bwd/fwd",
               "bwd ms (1 call)", "bwd ms (atomics)", "TFLOPS (atomics)",
               "workspace MiB fwd / bwd x chunks", "bwd MiB (1 call)"},
              table);
  if (dev == "cuda")
    rope_table(ctx, shapes.front().B, shapes.front().T, shapes.front().H, warmup, runs);
  return 0;
}

}  // namespace

Suite attention_suite() {
  return {"attention", "causal attention core (MLA head dims): forward / backward TFLOPS",
          "usage: octet bench attention [--device cuda|cpu] [--batch B] [--seq T] [--heads H] "
          "[--dqk D --dv D]\n"
          "                             [--runs N] [--warmup N]\n\n"
          "Times attention_forward and attention_backward (causal, BF16, default scale) at the "
          "baseline\n"
          "configuration's 8 x 2048 x 16 (96, 64), the same with (192, 128), and DeepSeek-V3's 1 x "
          "4096 x 128\n"
          "(192, 128), or at the one shape the flags give; TFLOPS count the causal half's useful "
          "FLOPs\n"
          "(see bench_attention.cpp). The backward runs in chunks under the default workspace "
          "cap\n"
          "(attention.h); \"1 call\" times it unchunked. Median of --runs (default 20). "
          "scripts/peer_attention.py "
          "times\n"
          "cuDNN's attention through PyTorch on the same shapes. On CUDA, then RoPE on the "
          "first shape's\n"
          "q and shared-key tensors, MLA's fused key (rope_key) and the o_proj input's E5M6 "
          "rounding, new and\n"
          "previous kernel side by side, in GB/s against the device copy bandwidth.",
          run};
}

}  // namespace octet::bench
