// `octet moe-report`: what a MoE layer's FP8 dataflow does, measured on the CPU: the casts it runs
// per layer and step (counted in the ops, model/moe_casts.h) and its error against FP64 on
// unquantized inputs per block (model/moe_error.h), for the BF16-centred flow, deepseek, fp8-flow
// and the requantize path fp8-flow avoids. Prints Markdown tables (docs/numerics.md quotes them).
#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"
#include "model/moe_casts.h"
#include "model/moe_error.h"

namespace octet::cli {
namespace {

struct Variant {
  const char* label;
  RecipeSpec spec;
};

std::vector<Variant> variants() {
  return {
      {"bf16", {"bf16", {}}},
      {"deepseek, BF16 dispatch (BF16-centred)", {"deepseek", {"moe_dispatch=bf16"}}},
      {"deepseek", {"deepseek", {}}},
      {"deepseek, requantize (pow2 scales)", {"deepseek", {"fp8_transpose=requantize"}}},
      {"fp8-flow", {"fp8-flow", {}}},
      {"fp8-flow, requantize (pow2 scales)", {"fp8-flow", {"fp8_transpose=requantize"}}},
      {"fp8-flow, requantize (exact scales)", {"fp8-flow", {"fp8_transpose=requantize-exact"}}},
  };
}

std::string n(int64_t v) {
  return std::to_string(v);
}

std::string e(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

int run_moe_report(const std::vector<std::string>& argv) {
  const Args args(argv, {"tokens", "seeds"}, {"casts-only"});
  args.expect_positional(0, 0, "octet moe-report [--tokens T] [--seeds N] [--casts-only]");
  MoeErrorConfig cfg;
  cfg.tokens = args.get_int("tokens", cfg.tokens);
  const int64_t seeds = args.get_int("seeds", 3);
  OCTET_CHECK(cfg.tokens >= 1 && cfg.tokens <= 1 << 16, "--tokens must be in [1, 65536], got ",
              cfg.tokens);
  OCTET_CHECK(seeds >= 1 && seeds <= 64, "--seeds must be in [1, 64], got ", seeds);
  cfg.seeds.clear();
  for (int64_t s = 1; s <= seeds; ++s) cfg.seeds.push_back(static_cast<uint64_t>(s));

  std::printf(
      "Casts per MoE layer per step (one forward + backward), counted in the ops. Explicit = "
      "standalone BF16/FP32->FP8 quantizations (each FP8 copy written counts once) + FP8->BF16/FP32 "
      "dequantizations; fused = quantizations inside the op that computes the value; transposes = "
      "FP8->FP8 scaling-aware transposes.\n\n");
  std::printf(
      "| recipe | routed: explicit | quantize | dequantize | fused | transposes | shared "
      "expert: explicit |\n|---|---|---|---|---|---|---|\n");
  for (const Variant& v : variants()) {
    const MoeCastCounts c = count_moe_casts(resolve_recipe(v.spec));
    std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", v.label,
                n(c.routed.explicit_casts()).c_str(), n(c.routed[CastKind::kQuantize]).c_str(),
                n(c.routed[CastKind::kDequantize]).c_str(),
                n(c.routed[CastKind::kFusedQuantize]).c_str(),
                n(c.routed[CastKind::kTranspose]).c_str(), n(c.shared.explicit_casts()).c_str());
  }
  if (args.has("casts-only")) return 0;

  std::printf(
      "\nError against FP64 on unquantized inputs (relative Frobenius norm, mean of %lld seeds): "
      "one MoE layer, D %lld, F %lld, %lld experts, top-%lld, one shared expert, %lld tokens; "
      "dW is every weight gradient of the layer together.\n\n",
      static_cast<long long>(seeds), static_cast<long long>(cfg.hidden),
      static_cast<long long>(cfg.expert_ffn), static_cast<long long>(cfg.experts),
      static_cast<long long>(cfg.top_k), static_cast<long long>(cfg.tokens));
  std::printf(
      "| recipe | y (forward) | dX | dW | dW experts gate/up | dW experts down |\n"
      "|---|---|---|---|---|---|\n");
  for (const Variant& v : variants()) {
    const MoeErrors r = measure_moe_error(resolve_recipe(v.spec), cfg);
    std::printf("| %s | %s | %s | %s | %s | %s |\n", v.label, e(r.y).c_str(), e(r.dx).c_str(),
                e(r.dw).c_str(), e(r.dw_gate_up).c_str(), e(r.dw_down).c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

Command moe_report_command() {
  return {"moe-report", "casts and FP64 error of a MoE layer's FP8 dataflow, per recipe",
          "usage: octet moe-report [--tokens T] [--seeds N] [--casts-only]\n"
          "\n"
          "Runs one MoE layer (router, routed experts, a shared expert) forward and backward on "
          "the CPU\nunder bf16, deepseek (with a BF16 dispatch too), fp8-flow, and the requantize "
          "path (column-wise\nWgrad operands by dequantize + quantize instead of the "
          "scaling-aware transpose, with power-of-2 or exact scales), and prints\nas Markdown: "
          "the casts per layer and step, "
          "counted in the ops; the error of the output y, dX and\ndW against the same layer "
          "recomputed in FP64 from the unquantized inputs (--tokens, default\n256; --seeds, "
          "default 3). --casts-only prints the first table only.\n",
          run_moe_report};
}

}  // namespace octet::cli
