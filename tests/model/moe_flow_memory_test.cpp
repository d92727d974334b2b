// What fp8-flow's MoE layer keeps for its backward (model/moe.h), counted by the model's own
// accounting (model/saved_bytes.h) on the CPU: x's FP8 rows before the dispatch (T rows) instead of
// the dispatched column-wise copy (R = about k T rows), as deepseek since the tenth session, and,
// with recompute_down, no copy of h: deepseek's bytes and the routing weight of each row; and the
// copies the backward makes again are the forward's, bit for bit (the losses and gradients:
// head_chunk_test's RecomputedDownProjection).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "memory_test_util.h"
#include "model/linear.h"
#include "model/saved_bytes.h"
#include "ops/cast/cast.h"
#include "ops/moe_permute/moe_permute.h"
#include "test_util.h"

namespace octet {
namespace {

// The tiny model, and one with the baseline's ratios (configs/baseline-h100.toml: top-4 of 32
// experts, expert width 0.69 of hidden) at a CPU-sized width.
ModelConfig baseline_ratios() {
  ModelConfig c = test::memory_test_config();
  c.hidden_size = 256;
  c.moe_intermediate_size = 176;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 4;
  c.n_group = 1;
  c.topk_group = 1;
  return c;
}

struct MoeRun {
  Context ctx = make_context(Device::kCpu);
  ModelConfig config;
  Model model;
  MoeRun(const ModelConfig& c, const std::string& recipe, bool recompute = true)
      : config(c), model(ctx, c, {recipe_preset(recipe), DType::kBF16}) {
    model.load(ctx, init_parameters(c, 3));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l)
      if (model.layer(l).moe) model.layer(l).moe->recompute_down = recompute;
    model.prepare(ctx);
  }
  // The first MoE layer's forward on B x T random tokens: its Saved.
  DecoderLayer::Saved forward(int64_t B, int64_t T) {
    const Tensor x =
        cast(ctx, test::random_tensor({B * T, config.hidden_size}, DType::kF32, 9), DType::kBF16);
    DecoderLayer::Saved s;
    model.layer(config.first_k_dense_replace)
        .forward(ctx, model.precision(), model.rope(), x, B, T, s);
    return s;
  }
};

bool has(const Tensor& t) {
  return t.data() != nullptr && t.numel() > 0;
}

// Its bytes, 0 when undefined (an amax nobody asked for).
int64_t bytes(const Tensor& t) {
  return has(t) ? t.nbytes() : 0;
}

TEST(MoeFlowMemory, KeepsDeepseeksRowsAndTheRoutingWeights) {
  struct Case {
    const char* name;
    ModelConfig config;
    int64_t B, T;
  };
  for (const Case& k : {Case{"tiny model", test::memory_test_config(), 2, 32},
                        Case{"baseline ratios", baseline_ratios(), 4, 128}}) {
    MoeRun ds(k.config, "deepseek"), flow(k.config, "fp8-flow"),
        flow_kept(k.config, "fp8-flow", false);
    const DecoderLayer::Saved sd = ds.forward(k.B, k.T), sf = flow.forward(k.B, k.T),
                              sk = flow_kept.forward(k.B, k.T);
    const SavedBytes bd = saved_bytes(sd), bf = saved_bytes(sf), bk = saved_bytes(sk);
    std::printf(
        "%s, %lld tokens, R %lld rows: saved per MoE layer (MoE feed-forward / whole layer): "
        "deepseek %lld / %lld bytes, fp8-flow %lld / %lld, fp8-flow keeping h %lld / %lld\n",
        k.name, static_cast<long long>(k.B * k.T), static_cast<long long>(sf.moe.map.num_rows),
        static_cast<long long>(bd.mlp), static_cast<long long>(bd.total()),
        static_cast<long long>(bf.mlp), static_cast<long long>(bf.total()),
        static_cast<long long>(bk.mlp), static_cast<long long>(bk.total()));
    // Both keep x's T FP8 rows (no dispatched column-wise copy) and gu in FP8, and recompute h;
    // fp8-flow keeps the routing weight of each permuted row besides (deepseek's combine reads
    // topk_weight, which both keep).
    const MoeLayer::Saved& m = sf.moe;
    ASSERT_TRUE(has(m.w_rows)) << k.name;
    EXPECT_EQ(bf.mlp, bd.mlp + m.w_rows.nbytes()) << k.name;
    EXPECT_EQ(bf.attention, bd.attention) << k.name;
    ASSERT_TRUE(has(sd.moe.x_fp8.data)) << k.name;
    EXPECT_FALSE(has(sd.moe.gate_up.qx.columnwise_data)) << k.name;
    // What fp8-flow keeps of the dispatch: x's T FP8 rows and their scales, no dispatched copy.
    ASSERT_TRUE(has(m.x_fp8.data)) << k.name;
    EXPECT_EQ(m.x_fp8.rows(), k.B * k.T);
    EXPECT_FALSE(has(m.x_fp8.columnwise_data));
    EXPECT_FALSE(has(m.gate_up.qx.columnwise_data)) << k.name;
    EXPECT_FALSE(has(m.gate_up.qx.data)) << k.name;
    // recompute_down: no copy of h either, and gu in FP8 (moe_swiglu_input fp8, the default);
    // without it, h's column-wise copy and gu in BF16 instead of FP8 are what it adds.
    EXPECT_TRUE(m.recomputed_down);
    EXPECT_FALSE(has(m.down.qx.columnwise_data)) << k.name;
    EXPECT_FALSE(has(m.gu)) << k.name;
    ASSERT_TRUE(has(m.gu_fp8.data)) << k.name;
    ASSERT_TRUE(has(sk.moe.down.qx.columnwise_data)) << k.name;
    ASSERT_TRUE(has(sk.moe.gu)) << k.name;
    EXPECT_EQ(bk.mlp - bf.mlp, sk.moe.down.qx.columnwise_data.nbytes() +
                                   sk.moe.down.qx.columnwise_scale_inv.nbytes() +
                                   bytes(sk.moe.down.qx.amax) + sk.moe.gu.nbytes() -
                                   m.gu_fp8.data.nbytes() - m.gu_fp8.scale_inv.nbytes() -
                                   bytes(m.gu_fp8.amax))
        << k.name;
    // Against what the forward kept before (the dispatched column-wise x and h's): the saving.
    const int64_t before = bk.mlp - m.x_fp8.data.nbytes() - m.x_fp8.scale_inv.nbytes() +
                           m.map.num_rows * k.config.hidden_size;
    EXPECT_LT(bf.mlp, before) << k.name;
  }
}

// The copies the backward makes again are the forward's: gate_up's Wgrad copy of the dispatched x
// (from the T kept rows: a permutation, then the transpose) is the one the fused FP8 dispatch gives.
// (h is the same op on the same gu and weights.)
TEST(MoeFlowMemory, RecomputedWgradCopiesAreTheForwardOnes) {
  MoeRun flow(baseline_ratios(), "fp8-flow");
  const int64_t B = 2, T = 128;
  const Tensor x =
      cast(flow.ctx, test::random_tensor({B * T, flow.config.hidden_size}, DType::kF32, 9),
           DType::kBF16);
  MoeLayer& moe = *flow.model.layer(flow.config.first_k_dense_replace).moe;
  const Precision& p = flow.model.precision();
  MoeLayer::Saved s;
  moe.forward(flow.ctx, p, x, B, s);
  const QuantizeArgs qa = quantize_args(p.recipe.at(GemmSite::kExpertGateUp),
                                        GemmOperand::kActivation, x, QuantizeOutput::kRowwise);
  const GroupedLinearLayer::Saved fused =
      moe.gate_up.wgrad_saved(flow.ctx, p, moe_permute_quantize(flow.ctx, s.map, qa));
  const GroupedLinearLayer::Saved again =
      moe.gate_up.wgrad_saved(flow.ctx, p, moe_permute(flow.ctx, s.map, s.x_fp8));
  EXPECT_TRUE(test::bitwise_equal(fused.qx.columnwise_data, again.qx.columnwise_data));
  EXPECT_TRUE(test::bitwise_equal(fused.qx.columnwise_scale_inv, again.qx.columnwise_scale_inv));
  // Neither carries an amax (quantize_args: group-scaled quantizations skip it).
  EXPECT_FALSE(fused.qx.amax.defined());
  EXPECT_FALSE(again.qx.amax.defined());
  EXPECT_GT(again.qx.columnwise_data.numel(), 0);
  // What the backward uses: the transpose that reads the dispatched rows from the tokens' rows.
  const QuantTensor direct = moe_permute_transposed(flow.ctx, s.map, s.x_fp8);
  EXPECT_TRUE(test::bitwise_equal(direct.columnwise_data, fused.qx.columnwise_data));
  EXPECT_TRUE(test::bitwise_equal(direct.columnwise_scale_inv, fused.qx.columnwise_scale_inv));
  EXPECT_EQ(direct.columnwise_granularity, Granularity::k128x128);
  EXPECT_EQ(direct.data.data(), nullptr);
}

}  // namespace
}  // namespace octet
