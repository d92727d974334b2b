// Saved-activation accounting (model/saved_bytes.h) on the CPU, and what the memory changes keep:
// the o_proj input shares the attention output's buffer (E5M6 rounding happens in backward), and
// with recompute_down the MoE keeps neither the experts' outputs nor the SwiGLU output.
#include <gtest/gtest.h>

#include <cstdio>

#include "memory_test_util.h"
#include "model/saved_bytes.h"
#include "ops/cast/cast.h"
#include "test_util.h"

namespace octet {
namespace {

struct LayerRun {
  Context ctx = make_context(Device::kCpu);
  Model model;
  explicit LayerRun(const std::string& recipe)
      : model(ctx, test::memory_test_config(), {recipe_preset(recipe), DType::kBF16}) {
    model.load(ctx, init_parameters(test::memory_test_config(), 3));
    model.prepare(ctx);
  }
  // Layer l's forward on a random input of B x T tokens; its Saved.
  DecoderLayer::Saved forward(int64_t l, bool recompute, int64_t B = 2, int64_t T = 32) {
    DecoderLayer& layer = model.layer(l);
    if (layer.moe) layer.moe->recompute_down = recompute;
    const int64_t D = model.config().hidden_size;
    const Tensor x = cast(ctx, test::random_tensor({B * T, D}, DType::kF32, 9), DType::kBF16);
    DecoderLayer::Saved s;
    layer.forward(ctx, model.precision(), model.rope(), x, B, T, s);
    return s;
  }
};

TEST(SavedBytes, OProjInputSharesTheAttentionOutput) {
  LayerRun run("deepseek");  // attn_out_input = E5M6
  const DecoderLayer::Saved s = run.forward(0, true);
  EXPECT_EQ(s.attn.o.storage, Storage::kE5M6);
  EXPECT_EQ(s.attn.o.x.data(), s.attn.out.data()) << "o_proj keeps a copy of its input";
}

// q_a and kv_a read the same normed input: one quantization, one saved column-wise copy, where
// both sites quantize alike; delayed scaling keeps one per site (each has its own scale).
TEST(SavedBytes, QDownAndKvDownShareTheirInput) {
  for (const char* recipe : {"deepseek", "fp8-tensor-current", "fp8-tensor-delayed"}) {
    LayerRun run(recipe);
    const DecoderLayer::Saved s = run.forward(0, true);
    const void* q = s.attn.q_a.qx.columnwise_data.data();
    ASSERT_NE(q, nullptr) << recipe;
    EXPECT_EQ(q == s.attn.kv_a.qx.columnwise_data.data(),
              recipe != std::string("fp8-tensor-delayed"))
        << recipe;
  }
}

// The shared quantization changes no number: kv_a quantizing the same input on its own saves the
// same column-wise copy, bit for bit.
TEST(SavedBytes, SharedQuantizationIsTheOwnOne) {
  LayerRun run("deepseek");
  const DecoderLayer::Saved s = run.forward(0, true);
  MlaLayer& a = run.model.layer(0).attn;
  const Tensor xn = s.input_norm.x;  // the layer input; its norm is what q_a and kv_a read
  NormLayer::Saved ns;
  const Tensor x = run.model.layer(0).input_norm.forward(run.ctx, xn, ns);
  LinearSaved own;
  a.kv_a.forward(run.ctx, run.model.precision(), x, own);
  EXPECT_TRUE(test::bitwise_equal(own.qx.columnwise_data, s.attn.kv_a.qx.columnwise_data));
  EXPECT_TRUE(
      test::bitwise_equal(own.qx.columnwise_scale_inv, s.attn.kv_a.qx.columnwise_scale_inv));
}

TEST(SavedBytes, RecomputedDownKeepsOnlyGu) {
  for (const char* recipe : {"deepseek", "bf16"}) {
    LayerRun run(recipe);
    const int64_t moe_layer = 1;
    ASSERT_TRUE(run.model.layer(moe_layer).moe.has_value());
    const DecoderLayer::Saved kept = run.forward(moe_layer, false);
    const DecoderLayer::Saved again = run.forward(moe_layer, true);
    EXPECT_TRUE(kept.moe.expert_out.data() != nullptr);
    EXPECT_EQ(again.moe.expert_out.data(), nullptr) << recipe;
    EXPECT_TRUE(again.moe.recomputed_down);
    const SavedBytes a = saved_bytes(kept), b = saved_bytes(again);
    EXPECT_EQ(a.attention, b.attention);
    EXPECT_EQ(a.norms, b.norms);
    // What recompute_down drops: the experts' outputs (R, D) and down's saved input.
    int64_t dropped = kept.moe.expert_out.nbytes();
    for (const Tensor* t : {&kept.moe.down.x, &kept.moe.down.qx.columnwise_data,
                            &kept.moe.down.qx.columnwise_scale_inv, &kept.moe.down.qx.amax})
      if (t->data() != nullptr) dropped += t->nbytes();
    EXPECT_GT(dropped, kept.moe.expert_out.nbytes()) << recipe;
    EXPECT_EQ(a.mlp - b.mlp, dropped) << recipe;
    std::printf(
        "%s MoE layer, 64 tokens: saved %lld bytes (attention %lld, norms %lld, mlp %lld); "
        "recompute_down drops %lld\n",
        recipe, static_cast<long long>(b.total()), static_cast<long long>(b.attention),
        static_cast<long long>(b.norms), static_cast<long long>(b.mlp),
        static_cast<long long>(dropped));
  }
}

}  // namespace
}  // namespace octet
