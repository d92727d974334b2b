// trainer_state.json: every key checked with one clear error naming the file and the key (issue
// 13: a missing key surfaced as the JSON library's "key 'sampler' not found", no file named), both
// through read_trainer_state and through a resume that meets such a file.
#include "train/trainer_state.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "train/trainer.h"

namespace octet::train {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const Json kGood = {{"step", 6},
                    {"tokens_seen", 192},
                    {"sampler", {-7, 1, 12, 3000, 16}},
                    {"spike_window", {5.5, 5.25}}};

std::string error_of(const std::string& text) {
  try {
    parse_trainer_state(text, "ck/trainer_state.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainerState, ParsesEveryField) {
  const TrainerState s = parse_trainer_state(kGood.dump(1), "x");
  EXPECT_EQ(s.step, 6);
  EXPECT_EQ(s.tokens_seen, 192);
  EXPECT_EQ(s.sampler.to_array(), (std::array<int64_t, 5>{-7, 1, 12, 3000, 16}));
  EXPECT_EQ(s.spike_window, (std::vector<double>{5.5, 5.25}));
  Json extra = kGood;
  extra["written_by"] = "a newer octet";
  EXPECT_EQ(parse_trainer_state(extra.dump(), "x").step, 6);
}

TEST(TrainerState, EachMissingKeyIsNamedWithTheFile) {
  for (const char* key : {"step", "tokens_seen", "sampler", "spike_window"}) {
    Json j = kGood;
    j.erase(key);
    const std::string msg = error_of(j.dump());
    EXPECT_EQ(msg, std::string("ck/trainer_state.json: missing key '") + key +
                       "' (not a complete trainer state)");
  }
}

TEST(TrainerState, WrongTypesAndValuesAreNamed) {
  const std::pair<const char*, Json> cases[] = {
      {"'step' must be a non-negative integer, got -1", -1},
      {"'step' must be a non-negative integer, got 1.5", 1.5},
      {"'step' must be a non-negative integer, got 9223372036854775808", 9223372036854775808ull},
      {"'step' must be a non-negative integer, got \"6\"", "6"},
  };
  for (const auto& [want, value] : cases) {
    Json j = kGood;
    j["step"] = value;
    EXPECT_EQ(error_of(j.dump()), std::string("ck/trainer_state.json: ") + want);
  }
  Json j = kGood;
  j["sampler"] = {1, 2, 3, 4};
  EXPECT_NE(error_of(j.dump()).find("'sampler' must be an array of 5 integers, got [1,2,3,4]"),
            std::string::npos);
  j = kGood;
  j["spike_window"] = {1.0, nullptr};
  EXPECT_NE(error_of(j.dump()).find("'spike_window' must hold finite losses, got null"),
            std::string::npos);
  EXPECT_EQ(error_of("[]"), "ck/trainer_state.json: expected a JSON object, got array");
  EXPECT_EQ(error_of("{\"step\": ").rfind("ck/trainer_state.json: not valid JSON", 0), 0u);
}

// A resume from a checkpoint whose trainer_state.json lacks a key fails with that file and key.
TEST(TrainerState, ResumeNamesTheFileAndTheMissingKey) {
  const fs::path dir =
      fs::temp_directory_path() / ("octet_trainer_state_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ostringstream text;
  for (int i = 0; i < 200; ++i)
    text << "Pack my box with five dozen liquor jugs, number " << i << ".\n";
  std::ofstream(dir / "corpus.txt") << text.str();
  TrainConfig c;
  for (const char* kv : {"steps=2",
                         "checkpoint_every=2",
                         "batch_size=1",
                         "seq_len=8",
                         "eval.every=0",
                         "optim.warmup_steps=0",
                         "device=cpu",
                         "recipe=bf16",
                         "model.hidden_size=16",
                         "model.intermediate_size=16",
                         "model.moe_intermediate_size=8",
                         "model.num_hidden_layers=1",
                         "model.first_k_dense_replace=1",
                         "model.num_nextn_predict_layers=0",
                         "model.num_attention_heads=1",
                         "model.q_lora_rank=8",
                         "model.kv_lora_rank=8",
                         "model.qk_nope_head_dim=8",
                         "model.qk_rope_head_dim=8",
                         "model.v_head_dim=8",
                         "model.max_position_embeddings=16"})
    apply_set(c, kv);
  apply_set(c, "run_dir=" + (dir / "run").string());
  apply_set(c, "data.text=" + (dir / "corpus.txt").string());
  RunOptions o;
  o.cache_dir = (dir / "cache").string();
  std::ostringstream log;
  run_training(c, o, log);

  const fs::path state = dir / "run" / "checkpoints" / "step_00000002" / "trainer_state.json";
  Json j;
  std::ifstream(state) >> j;
  j.erase("sampler");
  std::ofstream(state, std::ios::trunc) << j.dump(1);
  apply_set(c, "steps=4");
  o.resume_from = (dir / "run").string();
  try {
    run_training(c, o, log);
    ADD_FAILURE() << "the resume did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              state.string() + ": missing key 'sampler' (not a complete trainer state)");
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace octet::train
