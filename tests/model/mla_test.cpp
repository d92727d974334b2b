// MlaLayer on the CPU: bitwise the outputs and gradients of the copy-based composition it replaced
// (mla_test_util.h), with v read in place in kv, dv written into dkv and k kept or rebuilt in
// backward, and with the compact copy when qk_nope_head_dim is not a multiple of 8.
#include <gtest/gtest.h>

#include "mla_test_util.h"

namespace octet {
namespace {

ModelConfig unaligned_nope_config() {
  ModelConfig c = test::tiny_model_config();
  c.qk_nope_head_dim = 12;  // Dqk = 16, but v's window would start at column 12
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 16;
  return c;
}

TEST(MlaLayer, MatchesCopyBasedCompositionBitwise) {
  Context ctx = make_context(Device::kCpu);
  for (const char* recipe : {"bf16", "deepseek"})
    for (const bool recompute_k : {true, false})
      test::expect_mla_matches_reference(ctx, test::tiny_model_config(), recipe, recompute_k);
}

TEST(MlaLayer, UnalignedNopeCopiesVAndMatchesBitwise) {
  Context ctx = make_context(Device::kCpu);
  test::expect_mla_matches_reference(ctx, unaligned_nope_config(), "deepseek");
}

TEST(MlaLayer, VIsAWindowOfKvAndKIsRebuilt) {
  Context ctx = make_context(Device::kCpu);
  for (const bool aligned : {true, false}) {
    const ModelConfig c = aligned ? test::tiny_model_config() : unaligned_nope_config();
    Model m(ctx, c, {recipe_preset("bf16"), DType::kBF16});
    m.load(ctx, init_parameters(c, 5));
    m.prepare(ctx);
    MlaLayer& a = m.layer(0).attn;
    EXPECT_EQ(a.v_in_place(), aligned);
    const int64_t B = 1, T = 8;
    const Tensor x =
        cast(ctx, test::random_tensor({B * T, c.hidden_size}, DType::kF32, 3), DType::kBF16);
    MlaLayer::Saved s;
    a.forward(ctx, m.precision(), m.rope(), x, B, T, s);
    const Shape kv_shape{B, T, a.heads, a.nope + a.v_dim};
    if (aligned) {
      EXPECT_EQ(s.v.base.shape(), kv_shape) << "v should be read in place in kv";
      EXPECT_EQ(s.v.col, a.nope);
      EXPECT_EQ(s.v.head_dim(), a.v_dim);
      EXPECT_EQ(s.k.data(), nullptr) << "k should be rebuilt in backward, not kept";
      EXPECT_EQ(s.kva.shape(), (Shape{B * T, a.kv_lora + a.rope}));
    } else {
      EXPECT_TRUE(s.v.compact());
      EXPECT_EQ(s.v.base.shape(), (Shape{B, T, a.heads, a.v_dim}));
      EXPECT_EQ(s.k.shape(), (Shape{B, T, a.heads, a.nope + a.rope})) << "k is kept";
      EXPECT_EQ(s.kva.data(), nullptr);
    }
  }
}

}  // namespace
}  // namespace octet
