// Saved-activation accounting (model/saved_bytes.h) on the CPU, and what the memory changes keep:
// the o_proj input shares the attention output's buffer (E5M6 rounding happens in backward), and
// with recompute_down the MoE keeps neither the experts' outputs nor the SwiGLU output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

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
    // What recompute_down drops: the experts' outputs (R, D) and down's saved input; and in
    // deepseek (moe_swiglu_input fp8 by default) gu's BF16 bytes for its FP8 copy.
    int64_t dropped = kept.moe.expert_out.nbytes();
    for (const Tensor* t : {&kept.moe.down.x, &kept.moe.down.qx.columnwise_data,
                            &kept.moe.down.qx.columnwise_scale_inv, &kept.moe.down.qx.amax})
      if (t->data() != nullptr) dropped += t->nbytes();
    EXPECT_GT(dropped, kept.moe.expert_out.nbytes()) << recipe;
    EXPECT_EQ(again.moe.gu_fp8.data.defined(), std::string(recipe) == "deepseek") << recipe;
    if (again.moe.gu_fp8.data.defined())
      dropped += kept.moe.gu.nbytes() - again.moe.gu_fp8.data.nbytes() -
                 again.moe.gu_fp8.scale_inv.nbytes() -
                 (again.moe.gu_fp8.amax.defined() ? again.moe.gu_fp8.amax.nbytes() : 0);
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

namespace octet {
namespace {

// moe_swiglu_input=fp8 (the default of deepseek and fp8-flow): gu kept as 1x128 E4M3 (one byte per
// element plus the scales); the forward is unchanged (the same loss, bit for bit) and the gradients
// move by FP8 noise only. moe_swiglu_input=bf16 restores the BF16 gu.
class SavedBytesFp8SwigluInput : public ::testing::TestWithParam<const char*> {};

TEST_P(SavedBytesFp8SwigluInput, HalvesGu) {
  Context cpu = make_context(Device::kCpu);
  const ModelConfig c = test::memory_test_config();
  const std::string preset = GetParam();
  EXPECT_EQ(resolve_recipe({.preset = preset}).moe_swiglu_input, Storage::kFp8);
  auto run = [&](const std::vector<std::string>& overrides) {
    Model m(cpu, c, {resolve_recipe({.preset = preset, .overrides = overrides}), DType::kBF16});
    m.load(cpu, init_parameters(c, 3));
    m.prepare(cpu);
    m.zero_grad(cpu);
    const ModelBatch b = test::patterned_batch(c, 2, 32);
    const LossValues l = m.read_losses(cpu, m.step(cpu, b, Pass::kForwardBackward));
    const Tensor x =
        cast(cpu, test::random_tensor({64, c.hidden_size}, DType::kF32, 9), DType::kBF16);
    DecoderLayer::Saved s;
    m.layer(1).forward(cpu, m.precision(), m.rope(), x, 2, 32, s);
    std::map<std::string, Tensor> g;
    for (Parameter* p : m.parameters()) g[p->name] = p->grad.to_host(cpu);
    return std::tuple{l, saved_bytes(s), s.moe.gu_fp8.data.defined() && s.moe.gu_fp8.data.data(),
                      s.moe.gu.data() != nullptr ? s.moe.gu.nbytes() : 0, g};
  };
  const auto [l16, b16, q16, gu16, g16] = run({"moe_swiglu_input=bf16"});
  const auto [l8, b8, q8, gu8, g8] = run({});
  EXPECT_FALSE(q16);
  EXPECT_TRUE(q8);
  EXPECT_EQ(gu8, 0);
  EXPECT_EQ(l8.main, l16.main);  // the forward does not read the cached copy
  EXPECT_GT(b16.mlp - b8.mlp, gu16 / 2 - gu16 / 16) << "gu: BF16 -> FP8 + 1x128 scales";
  double num = 0, den = 0;
  for (const auto& [name, t] : g16)
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double a = g8.at(name).data_as<const float>()[i], b = t.data_as<const float>()[i];
      num += (a - b) * (a - b);
      den += b * b;
    }
  const double rel = std::sqrt(num / den);
  std::printf("%s moe_swiglu_input=fp8: all gradients against BF16 gu, relative Frobenius %.4f\n",
              preset.c_str(), rel);
  EXPECT_GT(rel, 0.0);
  EXPECT_LT(rel, 0.05);
}

INSTANTIATE_TEST_SUITE_P(Recipes, SavedBytesFp8SwigluInput,
                         ::testing::Values("deepseek", "fp8-flow"), [](const auto& info) {
                           return std::string(info.param) == "deepseek" ? "deepseek" : "fp8_flow";
                         });

TEST(SavedBytes, Fp8SwigluInputNeedsARecomputableDown) {
  EXPECT_THROW(
      resolve_recipe({.preset = "fp8-tensor-delayed", .overrides = {"moe_swiglu_input=fp8"}}),
      Error);
  EXPECT_THROW(resolve_recipe({.preset = "deepseek", .overrides = {"moe_swiglu_input=e5m6"}}),
               Error);
  // The default of the block recipes; gemm.*=bf16 turns it off with the other FP8 storage.
  EXPECT_EQ(resolve_recipe({.preset = "fp8-flow"}).moe_swiglu_input, Storage::kFp8);
  EXPECT_EQ(resolve_recipe({.preset = "bf16"}).moe_swiglu_input, Storage::kBf16);
  EXPECT_EQ(resolve_recipe({.preset = "fp8-tensor-current"}).moe_swiglu_input, Storage::kBf16);
  EXPECT_EQ(resolve_recipe({.preset = "deepseek", .overrides = {"gemm.*=bf16"}}).moe_swiglu_input,
            Storage::kBf16);
  EXPECT_EQ(resolve_recipe({.preset = "deepseek", .overrides = {"moe_swiglu_input=bf16"}})
                .moe_swiglu_input,
            Storage::kBf16);
}

}  // namespace
}  // namespace octet

namespace octet {
namespace {

TEST(SavedBytes, ConfigTurnsTheMoeRecomputationOff) {
  Context cpu = make_context(Device::kCpu);
  ModelConfig c = test::memory_test_config();
  EXPECT_TRUE(
      Model(cpu, c, {recipe_preset("deepseek"), DType::kBF16}).layer(1).moe->recompute_down);
  c.moe_recompute = false;
  c.head_chunk_tokens = 512;
  Model m(cpu, c, {recipe_preset("deepseek"), DType::kBF16});
  EXPECT_FALSE(m.layer(1).moe->recompute_down);
  EXPECT_FALSE(m.mtp(0).layer.moe->recompute_down);
  EXPECT_EQ(m.head().chunk_tokens, 512);
  const ModelConfig back = model_config_from_json(model_config_to_json(c));
  EXPECT_FALSE(back.moe_recompute);
  EXPECT_EQ(back.head_chunk_tokens, 512);
}

TEST(SavedBytes, ConfigKeepsKWhenAskedTo) {
  Context cpu = make_context(Device::kCpu);
  ModelConfig c = test::memory_test_config();
  auto attention_bytes = [&](const ModelConfig& mc) {
    Model m(cpu, mc, {recipe_preset("deepseek"), DType::kBF16});
    EXPECT_EQ(m.layer(1).attn.recompute_k, mc.attention_recompute_k);
    m.load(cpu, init_parameters(mc, 3));
    m.prepare(cpu);
    const Tensor x =
        cast(cpu, test::random_tensor({64, mc.hidden_size}, DType::kF32, 9), DType::kBF16);
    DecoderLayer::Saved s;
    m.layer(1).forward(cpu, m.precision(), m.rope(), x, 2, 32, s);
    return saved_bytes(s).attention;
  };
  const int64_t rebuilt = attention_bytes(c);
  c.attention_recompute_k = false;
  EXPECT_GT(attention_bytes(c), rebuilt);  // k kept: N H (nope + rope) BF16 more
  EXPECT_FALSE(model_config_from_json(model_config_to_json(c)).attention_recompute_k);
}

}  // namespace
}  // namespace octet
