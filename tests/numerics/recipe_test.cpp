#include <gtest/gtest.h>

#include "core/check.h"
#include "numerics/recipe.h"

namespace octet {
namespace {

TEST(Recipe, PresetsFollowThePrecisionMap) {
  const Recipe bf16 = recipe_preset("bf16");
  for (const auto& g : bf16.gemm) EXPECT_EQ(g.precision, GemmPrecision::kBf16);

  const Recipe delayed = recipe_preset("fp8-tensor-delayed");
  EXPECT_EQ(delayed.at(GemmSite::kAttnQUp).precision, GemmPrecision::kFp8Tensor);
  EXPECT_EQ(delayed.at(GemmSite::kAttnQUp).scaling, ScalingMode::kDelayed);
  EXPECT_EQ(delayed.at(GemmSite::kAttnQUp).backward_format, Fp8Format::kE5M2);  // HYBRID
  EXPECT_EQ(recipe_preset("fp8-tensor-current").at(GemmSite::kExpertDown).scaling,
            ScalingMode::kCurrent);

  const Recipe ds = recipe_preset("deepseek");
  for (GemmSite s : {GemmSite::kAttnQDown, GemmSite::kAttnKvUp, GemmSite::kExpertGateUp,
                     GemmSite::kSharedDown}) {
    EXPECT_EQ(ds.at(s).precision, GemmPrecision::kFp8Block) << gemm_site_name(s);
    EXPECT_EQ(ds.at(s).backward_format, Fp8Format::kE4M3) << gemm_site_name(s);
  }
  // BF16 sites in every preset: router, MTP projection, head.
  for (const auto& name : recipe_names())
    for (GemmSite s : {GemmSite::kRouter, GemmSite::kMtpProj, GemmSite::kHead})
      EXPECT_EQ(recipe_preset(name).at(s).precision, GemmPrecision::kBf16)
          << name << " " << gemm_site_name(s);
  EXPECT_EQ(ds.attn_out_input, Storage::kE5M6);
  EXPECT_EQ(ds.moe_dispatch, Storage::kFp8);
  EXPECT_EQ(ds.at(GemmSite::kAttnOut).activation_rounding, ScaleRounding::kPow2);
  EXPECT_EQ(ds.at(GemmSite::kExpertDown).gradient_rounding, ScaleRounding::kPow2);
  EXPECT_FALSE(ds.fp8_flow);
  EXPECT_TRUE(recipe_preset("fp8-flow").fp8_flow);
  for (const auto& name : recipe_names()) EXPECT_NO_THROW(recipe_preset(name).validate()) << name;
}

TEST(Recipe, OverridesChangeOneSiteOrAll) {
  Recipe r = recipe_preset("deepseek");
  apply_recipe_override(r, "gemm.attn.out=bf16");
  EXPECT_EQ(r.at(GemmSite::kAttnOut).precision, GemmPrecision::kBf16);
  EXPECT_EQ(r.at(GemmSite::kAttnQUp).precision, GemmPrecision::kFp8Block);
  apply_recipe_override(r, "gemm.head=fp8-block");
  EXPECT_EQ(r.at(GemmSite::kHead).precision, GemmPrecision::kFp8Block);
  apply_recipe_override(r, "attn_out_input=bf16");
  EXPECT_EQ(r.attn_out_input, Storage::kBf16);
  apply_recipe_override(r, "gemm.*=bf16");  // everything BF16, and the dispatch with it
  for (const auto& g : r.gemm) EXPECT_EQ(g.precision, GemmPrecision::kBf16);
  EXPECT_EQ(r.moe_dispatch, Storage::kBf16);

  Recipe t = recipe_preset("fp8-tensor-delayed");
  apply_recipe_override(t, "gemm.head=fp8-tensor");  // takes the preset's delayed scaling
  EXPECT_EQ(t.at(GemmSite::kHead).scaling, ScalingMode::kDelayed);
  EXPECT_TRUE(t.at(GemmSite::kHead).is_delayed());
  EXPECT_EQ(t.at(GemmSite::kHead).backward_format, Fp8Format::kE5M2);
  apply_recipe_override(t, "amax_history_len=16");
  apply_recipe_override(t, "amax_reduction=most_recent");
  apply_recipe_override(t, "margin=2");
  EXPECT_EQ(t.amax_history_len, 16);
  EXPECT_EQ(t.amax_reduction, AmaxReduction::kMostRecent);
  EXPECT_EQ(t.margin, 2);
  // The overrides are recorded with the recipe, in order.
  EXPECT_EQ(t.spec.preset, "fp8-tensor-delayed");
  EXPECT_EQ(t.spec.overrides.size(), 4u);
  EXPECT_EQ(t.name(),
            "fp8-tensor-delayed + gemm.head=fp8-tensor, amax_history_len=16, "
            "amax_reduction=most_recent, margin=2");
}

TEST(Recipe, ASiteSwitchedToBlocksTakesDeepSeekV3sSettingsForIt) {
  // Back to FP8 after BF16: the same settings as the preset (power-of-2 input scales at attn.out).
  Recipe r = recipe_preset("deepseek");
  apply_recipe_override(r, "gemm.attn.out=bf16");
  apply_recipe_override(r, "gemm.attn.out=fp8-block");
  EXPECT_EQ(r.at(GemmSite::kAttnOut).activation_rounding, ScaleRounding::kPow2);
  // On a per-tensor preset, the experts switched to blocks can take the FP8 dispatch.
  Recipe t = recipe_preset("fp8-tensor-current");
  apply_recipe_override(t, "gemm.expert.gate_up=fp8-block");
  apply_recipe_override(t, "moe_dispatch=fp8");
  EXPECT_EQ(t.at(GemmSite::kExpertGateUp).activation_rounding, ScaleRounding::kPow2);
  // A hand-made recipe whose dispatch could not be transposed exactly is refused.
  t.at(GemmSite::kExpertGateUp).activation_rounding = ScaleRounding::kExact;
  EXPECT_THROW(t.validate(), Error);
}

TEST(Recipe, RouterSiteStaysBf16) {
  const Recipe ds = recipe_preset("deepseek");
  for (const char* a : {"gemm.router=fp8-block", "gemm.router=fp8-tensor"}) {
    Recipe r = ds;
    try {
      apply_recipe_override(r, a);
      ADD_FAILURE() << "accepted " << a;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("router"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("BF16"), std::string::npos) << e.what();
    }
  }
  Recipe r = recipe_preset("fp8-tensor-current");
  apply_recipe_override(r, "gemm.router=bf16");   // what it is anyway
  apply_recipe_override(r, "gemm.*=fp8-tensor");  // every other site, not the router
  EXPECT_EQ(r.at(GemmSite::kRouter).precision, GemmPrecision::kBf16);
  EXPECT_EQ(r.at(GemmSite::kHead).precision, GemmPrecision::kFp8Tensor);
  r.at(GemmSite::kRouter).precision = GemmPrecision::kFp8Block;  // by hand
  EXPECT_THROW(r.validate(), Error);
}

TEST(Recipe, ResolvesAPresetAndItsOverridesNamingTheOneAtFault) {
  const Recipe r = resolve_recipe({"deepseek", {"gemm.attn.out=bf16", "margin=1"}});
  EXPECT_EQ(r.at(GemmSite::kAttnOut).precision, GemmPrecision::kBf16);
  EXPECT_EQ(r.margin, 1);
  EXPECT_EQ(r.spec, (RecipeSpec{"deepseek", {"gemm.attn.out=bf16", "margin=1"}}));
  EXPECT_EQ(r.name(), "deepseek + gemm.attn.out=bf16, margin=1");
  EXPECT_EQ(resolve_recipe({"bf16", {}}).name(), "bf16");
  EXPECT_FALSE(resolve_recipe({"bf16", {}}).any_fp8());
  EXPECT_TRUE(r.any_fp8());
  try {
    resolve_recipe({"deepseek", {"margin=1", "gemm.router=fp8-block"}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recipe_overrides[1] 'gemm.router=fp8-block'"),
              std::string::npos)
        << e.what();
  }
  try {
    resolve_recipe({"fp4", {}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("recipe: unknown recipe 'fp4'", 0), 0u) << e.what();
  }
}

TEST(Recipe, OneMappingFromASiteToItsQuantization) {
  const Recipe ds = recipe_preset("deepseek");
  const GemmRecipe& down = ds.at(GemmSite::kExpertDown);
  EXPECT_EQ(down.quantization(GemmOperand::kActivation).granularity, Granularity::k1x128);
  EXPECT_EQ(down.quantization(GemmOperand::kActivation).rounding, ScaleRounding::kPow2);
  EXPECT_EQ(down.quantization(GemmOperand::kWeight).granularity, Granularity::k128x128);
  EXPECT_EQ(down.quantization(GemmOperand::kWeight).rounding, ScaleRounding::kExact);
  EXPECT_EQ(down.quantization(GemmOperand::kGradient).rounding, ScaleRounding::kPow2);
  const GemmRecipe& t = recipe_preset("fp8-tensor-delayed").at(GemmSite::kAttnQUp);
  EXPECT_EQ(t.quantization(GemmOperand::kActivation).granularity, Granularity::kTensor);
  EXPECT_EQ(t.quantization(GemmOperand::kActivation).format, Fp8Format::kE4M3);
  EXPECT_EQ(t.quantization(GemmOperand::kGradient).format, Fp8Format::kE5M2);
}

void expect_error(Recipe r, const char* assignment, const std::string& fragment) {
  try {
    apply_recipe_override(r, assignment);
    FAIL() << "accepted " << assignment;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Recipe, RejectsBadOverridesAndInconsistentRecipes) {
  const Recipe ds = recipe_preset("deepseek");
  expect_error(ds, "gemm.attn.bogus=bf16", "unknown GEMM site 'attn.bogus'");
  expect_error(ds, "gemm.head=fp16", "bad value 'fp16'");
  expect_error(ds, "colour=red", "unknown key 'colour'");
  expect_error(ds, "margin=x", "expected an integer");
  expect_error(ds, "margin=99", "margin must be in [0, 64]");
  expect_error(ds, "gemm.expert.gate_up=bf16", "gemm.expert.gate_up must be fp8-block");
  expect_error(recipe_preset("fp8-flow"), "gemm.expert.down=fp8-tensor", "fp8_flow");
  expect_error(ds, "fp8_flow=true", "power-of-2");
  expect_error(ds, "noequals", "expected key=value");
  EXPECT_THROW(recipe_preset("fp4"), Error);
}

TEST(Recipe, TableListsEverySite) {
  const std::string t = recipe_table(recipe_preset("deepseek"));
  for (int i = 0; i < kGemmSiteCount; ++i)
    EXPECT_NE(t.find(gemm_site_name(static_cast<GemmSite>(i))), std::string::npos);
  EXPECT_NE(t.find("e5m6"), std::string::npos);
  // The routed experts' SwiGLU input: FP8 by default in the block recipes, BF16 on request.
  EXPECT_NE(t.find("MoE SwiGLU input cached as fp8"), std::string::npos);
  EXPECT_NE(recipe_table(recipe_preset("fp8-flow")).find("MoE SwiGLU input cached as fp8"),
            std::string::npos);
  EXPECT_NE(
      recipe_table(resolve_recipe({.preset = "deepseek", .overrides = {"moe_swiglu_input=bf16"}}))
          .find("MoE SwiGLU input cached as bf16"),
      std::string::npos);
  EXPECT_NE(recipe_table(recipe_preset("bf16")).find("MoE SwiGLU input cached as bf16"),
            std::string::npos);
}

}  // namespace
}  // namespace octet
