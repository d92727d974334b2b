// `octet bench train-step --data`: the step on the first batch the trainer would draw from real
// text instead of uniform random tokens (a tiny model on the CPU), and a data path that is not
// there refused with one error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli_fixture.h"

namespace octet {
namespace {

const std::string kBaseline =
    (std::filesystem::path(OCTET_SOURCE_DIR) / "configs/baseline-h100.toml").string();

// The baseline config cut to a model small enough for a CPU step in milliseconds.
const char* const kTiny =
    " --set device=cpu --set batch_size=2 --set seq_len=16 --set model.hidden_size=32"
    " --set model.intermediate_size=64 --set model.moe_intermediate_size=16"
    " --set model.num_attention_heads=2 --set model.q_lora_rank=16 --set model.kv_lora_rank=16"
    " --set model.qk_nope_head_dim=16 --set model.qk_rope_head_dim=16 --set model.v_head_dim=16"
    " --set model.max_position_embeddings=32 --set model.num_hidden_layers=2";

class BenchTrainStepCli : public test::CliFixture {
 protected:
  test::CliResult bench(const std::string& extra) const {
    return run_octet("bench train-step '" + kBaseline + "' --recipe deepseek --runs 1" + kTiny +
                     " " + extra);
  }
};

TEST_F(BenchTrainStepCli, DataFeedsTheFirstBatchOfRealText) {
  std::ostringstream s;
  for (int i = 0; i < 200; ++i) s << "the cat sat on the mat, and the dog sat on the log. ";
  std::ofstream(path("corpus.txt")) << s.str();
  const test::CliResult r =
      bench("--data '" + path("corpus.txt") + "' --cache-dir '" + path("cache") + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("tokens: the first batch of " + path("corpus.txt")), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| deepseek"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(path("cache"))) << "the text is prepared into --cache-dir";
  const test::CliResult plain = bench("");
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_NE(plain.out.find("tokens: uniform random"), std::string::npos) << plain.out;
}

TEST_F(BenchTrainStepCli, AMissingDataPathIsOneError) {
  const test::CliResult r = bench("--data '" + path("none") + "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("data path not found"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace octet
