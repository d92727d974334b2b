#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>

#include <fstream>

#include "core/check.h"
#include "model/config.h"

namespace octet {
namespace {

using Json = nlohmann::json;

// The shape of a small DeepseekV3Config.to_json_string() from the transformers library (recent
// versions write rope_parameters instead of rope_theta), with keys octet does not use.
Json small_hf_config() {
  return Json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "dtype": "bfloat16",
    "bos_token_id": 0, "eos_token_id": 1, "attention_bias": false, "attention_dropout": 0.0,
    "vocab_size": 32768, "hidden_size": 1024, "intermediate_size": 2816, "moe_intermediate_size": 512,
    "num_hidden_layers": 8, "first_k_dense_replace": 1, "num_attention_heads": 16, "num_key_value_heads": 16,
    "q_lora_rank": 384, "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
    "n_routed_experts": 32, "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
    "routed_scaling_factor": 2.5, "norm_topk_prob": true, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "hidden_act": "silu", "rms_norm_eps": 1e-06, "max_position_embeddings": 4096, "tie_word_embeddings": false,
    "rope_interleave": true, "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"},
    "initializer_range": 0.02
  })");
}

TEST(ModelConfig, ReadsTransformersLayout) {
  const ModelConfig c = model_config_from_json(small_hf_config());
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.q_lora_rank.value(), 384);
  EXPECT_EQ(c.qk_head_dim(), 96);
  EXPECT_DOUBLE_EQ(c.rope_theta, 50000.0);
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_EQ(c.num_nextn_predict_layers,
            1);  // absent from transformers configs: DeepSeek-V3's default
  EXPECT_EQ(c.extra.at("bos_token_id"), 0);  // kept for the round trip
}

TEST(ModelConfig, RoundTripsThroughAFile) {
  Json j = small_hf_config();
  j["q_lora_rank"] = nullptr;  // plain q_proj
  j["num_nextn_predict_layers"] = 2;
  j["octet_recipe"] = "bf16";
  const ModelConfig c = model_config_from_json(j);
  EXPECT_FALSE(c.q_lora_rank.has_value());
  const auto path = std::filesystem::temp_directory_path() /
                    ("octet_config_" + std::to_string(::getpid()) + ".json");
  write_model_config(path.string(), c);
  const ModelConfig back = read_model_config(path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(model_config_to_json(back), model_config_to_json(c));
  EXPECT_EQ(back.recipe.preset, "bf16");
  EXPECT_EQ(back.num_nextn_predict_layers, 2);
  EXPECT_EQ(back.extra.at("eos_token_id"), 1);
}

// The attention backward's algorithm choice: deterministic unless config.json says otherwise, and
// it survives the round trip.
TEST(ModelConfig, DeterministicAttentionKey) {
  Json j = small_hf_config();
  EXPECT_TRUE(model_config_from_json(j).deterministic_attention);
  j["octet_deterministic_attention"] = false;
  const ModelConfig c = model_config_from_json(j);
  EXPECT_FALSE(c.deterministic_attention);
  EXPECT_FALSE(model_config_from_json(model_config_to_json(c)).deterministic_attention);
}

TEST(ModelConfig, RecipeOverridesRoundTripThroughConfigJson) {
  Json j = small_hf_config();
  const ModelConfig plain = model_config_from_json(j);
  EXPECT_EQ(plain.recipe, RecipeSpec{});  // deepseek, no overrides
  j["octet_recipe"] = "fp8-tensor-delayed";
  j["octet_recipe_overrides"] = {"gemm.head=fp8-tensor", "margin=1"};
  const ModelConfig c = model_config_from_json(j);
  EXPECT_EQ(c.recipe, (RecipeSpec{"fp8-tensor-delayed", {"gemm.head=fp8-tensor", "margin=1"}}));
  const Json out = model_config_to_json(c);
  EXPECT_EQ(out.at("octet_recipe"), "fp8-tensor-delayed");
  EXPECT_EQ(out.at("octet_recipe_overrides"), j.at("octet_recipe_overrides"));
  EXPECT_EQ(model_config_from_json(out).recipe, c.recipe);
  EXPECT_FALSE(c.extra.contains("octet_recipe_overrides"));  // a field, not an unknown key

  auto error = [&](const Json& v) {
    Json bad = j;
    bad["octet_recipe_overrides"] = v;
    try {
      model_config_from_json(bad, "c.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(error("margin=1").find("must be an array of strings"), std::string::npos);
  EXPECT_NE(error(Json::array({1})).find("octet_recipe_overrides[0] must be a string"),
            std::string::npos);
  EXPECT_NE(error(Json::array({"margin=1", "gemm.nowhere=bf16"})).find("octet_recipe_overrides[1]"),
            std::string::npos);
}

TEST(ModelConfig, ReadsRopeThetaAtTheTopLevelToo) {
  Json j = small_hf_config();
  j.erase("rope_parameters");
  j["rope_theta"] = 10000.0;
  j["rope_scaling"] = nullptr;
  EXPECT_DOUBLE_EQ(model_config_from_json(j).rope_theta, 10000.0);
}

void expect_error(const Json& j, const std::string& fragment) {
  try {
    model_config_from_json(j, "cfg.json");
    FAIL() << "accepted a config that should fail with: " << fragment;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, RejectsInvalidCombinationsNamingTheField) {
  auto with = [](const char* key, Json v) {
    Json j = small_hf_config();
    j[key] = std::move(v);
    return j;
  };
  expect_error(with("n_group", 3), "n_routed_experts (32) must be a multiple of n_group (3)");
  expect_error(with("topk_group", 5), "topk_group (5) must be <= n_group (4)");
  expect_error(with("num_experts_per_tok", 17), "num_experts_per_tok (17)");
  expect_error(with("qk_rope_head_dim", 31), "qk_rope_head_dim must be even");
  expect_error(with("first_k_dense_replace", 9), "first_k_dense_replace");
  expect_error(with("num_key_value_heads", 4), "num_key_value_heads");
  expect_error(with("scoring_func", "softmax"), "scoring_func 'softmax'");
  expect_error(with("hidden_size", "big"), "field hidden_size must be an integer");
  expect_error(with("vocab_size", 0), "vocab_size must be > 0");
  expect_error(with("rope_parameters", Json::parse(R"({"rope_type": "yarn", "factor": 40})")),
               "'yarn' is not supported");
  expect_error(Json::array(), "must be a JSON object");
}

TEST(ModelConfig, MalformedFileIsOneClearError) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("octet_bad_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << "{\"hidden_size\": 12,";
  try {
    read_model_config(path.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
  EXPECT_THROW(read_model_config("/nonexistent/config.json"), Error);
}

}  // namespace
}  // namespace octet
