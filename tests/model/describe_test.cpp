#include <gtest/gtest.h>

#include <cmath>

#include "model/checkpoint.h"
#include "model/describe.h"

namespace octet {
namespace {

ModelConfig small() {
  ModelConfig c;
  c.vocab_size = 1000;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.moe_intermediate_size = 32;
  c.num_hidden_layers = 3;
  c.first_k_dense_replace = 1;
  c.num_attention_heads = 4;
  c.q_lora_rank = 48;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 16;
  c.n_routed_experts = 8;
  c.n_group = 2;
  c.topk_group = 1;
  c.num_experts_per_tok = 2;
  c.num_nextn_predict_layers = 1;
  c.validate();
  return c;
}

// An independent count: the checkpoint's tensor list, where the release layout repeats the
// embedding and the head in every MTP layer (shared weights, counted once here).
int64_t count_from_checkpoint_names(const ModelConfig& c) {
  int64_t n = 0;
  for (const auto& t : expected_tensors(c)) {
    const bool mtp_copy =
        t.mtp_depth >= 0 && (t.name.find("embed_tokens") != std::string::npos ||
                             t.name.find("shared_head.head") != std::string::npos);
    if (!mtp_copy) n += shape_numel(t.shape);
  }
  return n;
}

TEST(Describe, ParameterCountMatchesTheCheckpointLayout) {
  for (bool tie : {false, true})
    for (int64_t mtp : {0, 1, 2})
      for (bool q_lora : {true, false}) {
        ModelConfig c = small();
        c.tie_word_embeddings = tie;
        c.num_nextn_predict_layers = mtp;
        if (!q_lora) c.q_lora_rank.reset();
        EXPECT_EQ(count_parameters(c).total, count_from_checkpoint_names(c))
            << tie << mtp << q_lora;
      }
}

TEST(Describe, DeepSeekV3Is671BillionParameters) {
  ModelConfig c;  // DeepseekV3Config defaults
  c.num_nextn_predict_layers = 0;
  const ParameterCount p = count_parameters(c);
  EXPECT_NEAR(static_cast<double>(p.total) / 1e9, 671.0, 1.0);
  EXPECT_NEAR(static_cast<double>(p.per_token) / 1e9, 37.0, 1.0);  // "37B activated"
}

TEST(Describe, Fp8ShareFollowsTheRecipe) {
  const ModelConfig c = small();
  EXPECT_EQ(fp8_flop_share(c, recipe_preset("bf16")), 0.0);
  const double ds = fp8_flop_share(c, recipe_preset("deepseek"));
  EXPECT_GT(ds, 0.0);
  EXPECT_LT(ds, 1.0);  // router, MTP projection and head stay BF16
  // Every overridable site in FP8: all but the router's FLOPs (the router stays BF16, and
  // describe used to count a refused gemm.router=fp8-block as FP8).
  Recipe all = recipe_preset("deepseek");
  for (const char* s : {"gemm.mtp.proj=fp8-block", "gemm.head=fp8-block"})
    apply_recipe_override(all, s);
  EXPECT_THROW(apply_recipe_override(all, "gemm.router=fp8-block"), Error);
  double flops = 0, router = 0;
  for (const auto& s : gemm_flops_per_token(c)) {
    flops += s.flops_per_token;
    if (s.site == GemmSite::kRouter) router = s.flops_per_token;
  }
  EXPECT_GT(router, 0.0);
  EXPECT_DOUBLE_EQ(fp8_flop_share(c, all), 1.0 - router / flops);
  // FP8 storage saves activation memory.
  EXPECT_LT(estimate_memory(c, recipe_preset("deepseek"), 4096).activation_bytes,
            estimate_memory(c, recipe_preset("bf16"), 4096).activation_bytes);
  const std::string text = describe_model(c, recipe_preset("deepseek"), 4096, 256);
  EXPECT_NE(text.find("in FP8"), std::string::npos);
  EXPECT_NE(text.find("fp8-flow"), std::string::npos);
  // fp8-flow keeps no expert outputs for the combine's backward (its combine is unweighted).
  EXPECT_LT(estimate_memory(c, recipe_preset("fp8-flow"), 4096).activation_bytes,
            estimate_memory(c, recipe_preset("deepseek"), 4096).activation_bytes);
  // The casts per MoE layer, counted: deepseek's routed path runs 5 explicit casts, fp8-flow's 2.
  EXPECT_NE(text.find("routed path    explicit casts 5 "), std::string::npos) << text;
  const std::string flow = describe_model(c, recipe_preset("fp8-flow"), 4096, 256);
  EXPECT_NE(flow.find("routed path    explicit casts 2 "), std::string::npos) << flow;
  EXPECT_NE(flow.find("FP8-Flow MoE dataflow"), std::string::npos);
  EXPECT_EQ(describe_model(c, recipe_preset("bf16"), 4096, 256).find("casts per MoE layer"),
            std::string::npos);
}

}  // namespace
}  // namespace octet
