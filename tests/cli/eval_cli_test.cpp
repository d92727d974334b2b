// `octet eval` end to end: a fresh checkpoint scores about ln(vocab) on text, the same number on
// the token shard of that text, with an MTP line per depth; FP8 checkpoints load; errors are one
// line.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "cli_fixture.h"
#include "io/token_shard.h"
#include "model/config.h"
#include "tiny_model.h"
#include "train/data.h"

namespace octet {
namespace {

namespace fs = std::filesystem;

using test::slurp;

class EvalCli : public test::CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    ModelConfig c = test::tiny_model_config();
    c.vocab_size = 272;  // byte-level text needs 257 ids
    write_model_config(p("config.json"), c);
    std::ofstream(p("text.txt")) << std::string(
        "It was the best of times, it was the worst of times, it was the age of wisdom, it was "
        "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity.\n");
  }
  std::string p(const std::string& n) const { return path(n); }
  test::CliResult run(const std::string& args) const { return run_octet(args); }

  static double value(const std::string& out, const std::string& key) {
    std::smatch m;
    const std::regex re("(^|\\n)" + key + ": ([0-9.]+)\\n");
    if (!std::regex_search(out, m, re)) return -1;
    return std::stod(m[2]);
  }
};

TEST_F(EvalCli, FreshCheckpointScoresAboutLnVocabOnTextAndShard) {
  ASSERT_EQ(run("init " + p("config.json") + " " + p("ckpt") + " --seed 3").code, 0);
  const test::CliResult text = run("eval " + p("ckpt") + " --text " + p("text.txt") +
                                   " --device cpu --seq-len 32 --batch 2 --recipe bf16");
  ASSERT_EQ(text.code, 0) << text.err;
  const double loss = value(text.out, "loss");
  EXPECT_NEAR(loss, std::log(272.0), 0.1) << text.out;
  EXPECT_GT(value(text.out, "mtp_loss\\[1\\]"), 0.0) << text.out;

  // The same tokens as an llm.c shard: the same loss.
  std::vector<uint16_t> toks = {static_cast<uint16_t>(train::kEndOfText)};
  for (uint16_t t : train::encode_bytes(slurp(p("text.txt")))) toks.push_back(t);
  io::write_token_shard(p("text.bin"), toks);
  const test::CliResult shard = run("eval " + p("ckpt") + " --tokens " + p("text.bin") +
                                    " --device cpu --seq-len 32 --batch 2 --recipe bf16");
  ASSERT_EQ(shard.code, 0) << shard.err;
  EXPECT_EQ(value(shard.out, "loss"), loss);

  // The FP8 release form loads (dequantized) and scores within FP8 noise of the F32 one.
  ASSERT_EQ(run("init " + p("config.json") + " " + p("ckpt8") + " --seed 3 --format fp8").code, 0);
  const test::CliResult fp8 = run("eval " + p("ckpt8") + " --text " + p("text.txt") +
                                  " --device cpu --seq-len 32 --batch 2 --recipe deepseek");
  ASSERT_EQ(fp8.code, 0) << fp8.err;
  EXPECT_NEAR(value(fp8.out, "loss"), loss, 0.02);
}

// A checkpoint's recipe is its config.json's preset and overrides (octet_recipe_overrides):
// deepseek with every GEMM site in BF16 scores what --recipe bf16 does, bit for bit, and not what
// deepseek alone does.
TEST_F(EvalCli, UsesTheCheckpointsRecipeOverrides) {
  ModelConfig c = test::tiny_model_config();
  c.vocab_size = 272;
  c.recipe = {"deepseek", {"gemm.*=bf16"}};
  write_model_config(p("over.json"), c);
  ASSERT_EQ(run("init " + p("over.json") + " " + p("ckpt") + " --seed 3").code, 0);
  EXPECT_EQ(read_model_config(p("ckpt/config.json")).recipe, c.recipe);
  const std::string data = " --text " + p("text.txt") + " --device cpu --seq-len 32 --batch 2";
  const test::CliResult over = run("eval " + p("ckpt") + data);
  ASSERT_EQ(over.code, 0) << over.err;
  EXPECT_NE(over.out.find("recipe: deepseek + gemm.*=bf16\n"), std::string::npos) << over.out;
  const test::CliResult bf16 = run("eval " + p("ckpt") + data + " --recipe bf16");
  ASSERT_EQ(bf16.code, 0) << bf16.err;
  EXPECT_EQ(value(over.out, "loss"), value(bf16.out, "loss"));
  const test::CliResult fp8 = run("eval " + p("ckpt") + data + " --recipe deepseek");
  ASSERT_EQ(fp8.code, 0) << fp8.err;
  EXPECT_NE(value(over.out, "loss"), value(fp8.out, "loss"));

  // An override the recipe refuses is one clear error naming it.
  nlohmann::json j = model_config_to_json(c);
  j["octet_recipe_overrides"] = {"gemm.router=fp8-block"};
  std::ofstream(p("ckpt/config.json")) << j.dump();
  const test::CliResult bad = run("eval " + p("ckpt") + data);
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("octet_recipe_overrides[0]"), std::string::npos) << bad.err;
}

TEST_F(EvalCli, BadInputsAreOneClearError) {
  ASSERT_EQ(run("init " + p("config.json") + " " + p("ckpt")).code, 0);
  test::CliResult r = run("eval " + p("ckpt") + " --text " + p("missing.txt") + " --device cpu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("missing.txt"), std::string::npos) << r.err;
  r = run("eval " + p("ckpt") + " --device cpu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--text"), std::string::npos) << r.err;
  std::ofstream(p("bad.bin")) << "not a shard";
  r = run("eval " + p("ckpt") + " --tokens " + p("bad.bin") + " --device cpu");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("bad.bin"), std::string::npos) << r.err;
  r = run("eval " + p("nope") + " --text " + p("text.txt") + " --device cpu");
  EXPECT_NE(r.code, 0);
  // A negative batch limit scored nothing and printed "loss: -nan" with exit 0 (issue 13).
  std::ofstream(p("some.txt")) << std::string(4000, 'a');
  r = run("eval " + p("ckpt") + " --text " + p("some.txt") + " --device cpu --max-batches -1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--max-batches"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("nan"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace octet
