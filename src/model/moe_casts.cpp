// count_moe_casts: a MoE layer's forward and backward with the cast counter attached.
#include "model/moe_casts.h"

#include <cstdio>
#include <memory>

#include "backend/backend.h"
#include "model/init.h"
#include "model/model.h"
#include "model/moe_error.h"

namespace octet {

MoeCastCounts count_moe_casts(const Recipe& recipe, bool recompute_down) {
  Context ctx = make_context(Device::kCpu);
  // Layer 1 is the MoE layer: hidden and expert widths of one 128-block, 4 experts, top-2.
  const ModelConfig c =
      moe_probe_config({.hidden = 128, .expert_ffn = 128, .experts = 4, .top_k = 2});
  Model model(ctx, c, {recipe, DType::kBF16});
  model.load(ctx, init_parameters(c, 1));
  model.prepare(ctx);
  MoeLayer& moe = *model.layer(1).moe;
  moe.recompute_down = recompute_down;
  constexpr int64_t kTokens = 64;
  const Tensor x = random_bf16({kTokens, c.hidden_size}, 2);
  const Tensor dy = random_bf16({kTokens, c.hidden_size}, 3);
  ctx.casts = std::make_shared<CastCounter>();
  MoeLayer::Saved s;
  moe.forward(ctx, model.precision(), x, 1, s);
  moe.backward(ctx, model.precision(), dy, s);
  return {ctx.casts->at("moe.routed"), ctx.casts->at("moe.shared")};
}

std::string format_cast_counts(const CastCounts& c) {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "explicit casts %lld (quantize %lld, dequantize %lld); fused quantize %lld; "
                "FP8 transposes %lld",
                static_cast<long long>(c.explicit_casts()),
                static_cast<long long>(c[CastKind::kQuantize]),
                static_cast<long long>(c[CastKind::kDequantize]),
                static_cast<long long>(c[CastKind::kFusedQuantize]),
                static_cast<long long>(c[CastKind::kTranspose]));
  return buf;
}

}  // namespace octet
