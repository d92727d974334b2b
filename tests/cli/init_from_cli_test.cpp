// `init_from` end to end: a new run starts from a checkpoint in each form (octet's F32, the
// transformers BF16 form sharded with an index, DeepSeek-V3's released FP8 form, a transformers
// save without MTP layers, an octet run directory) and its first step's loss is what `octet eval`
// reports for that checkpoint on the same batch.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <regex>

#include "cli_fixture.h"
#include "io/token_shard.h"
#include "model/config.h"
#include "tiny_model.h"
#include "train/metrics.h"

namespace octet {
namespace {

namespace fs = std::filesystem;

constexpr int kSeqLen = 32;

class InitFromCli : public test::CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    config_ = test::tiny_model_config();
    write_model_config(path("config.json"), config_);
    // One window of kSeqLen + 1 tokens: the sampler's only batch of one sequence, and eval's.
    std::mt19937 gen(7);
    std::vector<uint16_t> tokens(kSeqLen + 1);
    for (uint16_t& t : tokens) t = static_cast<uint16_t>(gen() % config_.vocab_size);
    fs::create_directories(path("data"));
    io::write_token_shard(path("data/one_train.bin"), tokens);
  }
  test::CliResult run(const std::string& args) const { return run_octet(args); }

  double eval_loss(const std::string& ckpt) const {
    const test::CliResult r =
        run("eval '" + path(ckpt) + "' --tokens '" + path("data/one_train.bin") +
            "' --seq-len 32 --batch 1 --recipe deepseek --device cpu");
    EXPECT_EQ(r.code, 0) << r.err;
    std::smatch m;
    const std::regex re("\\nloss: ([0-9.]+)\\n");
    if (!std::regex_search(r.out, m, re)) return -1;
    return std::stod(m[1]);
  }
  // The first step's loss of a one-step run started from `from`; its output in `log`.
  double first_step_loss(const std::string& from, const std::string& run_dir,
                         std::string* log = nullptr) const {
    const test::CliResult r =
        run("train --set 'init_from=\"" + path(from) + "\"' --set 'data.shards=\"" + path("data") +
            "\"' --set steps=1 --set batch_size=1 --set seq_len=32 --set recipe=deepseek"
            " --set device=cpu --set eval.every=0 --set sites_every=0 --set run_dir='" +
            path(run_dir) + "'");
    EXPECT_EQ(r.code, 0) << r.err << r.out;
    if (log) *log = r.out + r.err;
    const auto m = train::read_metrics(path(run_dir) + "/metrics.jsonl");
    return m.empty() ? -2 : m[0].loss;
  }

  ModelConfig config_;
};

TEST_F(InitFromCli, FirstStepLossEqualsEvalOfTheCheckpoint) {
  ASSERT_EQ(run("init '" + path("config.json") + "' '" + path("f32") + "' --seed 5").code, 0);
  ASSERT_EQ(run("init '" + path("config.json") + "' '" + path("bf16") +
                "' --seed 5 --format bf16 --shard-bytes 40000")
                .code,
            0);
  ASSERT_TRUE(fs::exists(path("bf16/model.safetensors.index.json")));
  ASSERT_EQ(
      run("init '" + path("config.json") + "' '" + path("fp8") + "' --seed 5 --format fp8").code,
      0);
  std::vector<double> evals;
  for (const char* form : {"f32", "bf16", "fp8"}) {
    std::string log;
    const double eval = eval_loss(form);
    const double first = first_step_loss(form, std::string("run_") + form, &log);
    // eval prints 6 decimals.
    EXPECT_NEAR(first, eval, 1e-6) << form;
    EXPECT_NE(log.find("initialised from " + path(form)), std::string::npos) << log;
    EXPECT_NE(log.find(": step 0, fresh optimizer"), std::string::npos) << log;
    evals.push_back(eval);
  }
  // The forms are different checkpoints (BF16 and FP8 round the same initialisation).
  EXPECT_NEAR(evals[1], evals[0], 0.01);
  EXPECT_NEAR(evals[2], evals[0], 0.05);

  // An octet run directory: its latest checkpoint, the one step on from f32.
  std::string log;
  const double resumed = first_step_loss("run_f32", "run_again", &log);
  EXPECT_NE(log.find("checkpoints/step_00000001"), std::string::npos) << log;
  EXPECT_NEAR(resumed, eval_loss("run_f32/checkpoints/step_00000001"), 1e-6);
  EXPECT_EQ(eval_loss("run_f32"), eval_loss("run_f32/checkpoints/step_00000001"));  // its latest
}

TEST_F(InitFromCli, TransformersSaveWithoutMtpInitialisesItWithAWarning) {
  ModelConfig no_mtp = config_;
  no_mtp.num_nextn_predict_layers = 0;
  write_model_config(path("no_mtp.json"), no_mtp);
  ASSERT_EQ(run("init '" + path("no_mtp.json") + "' '" + path("hf") + "' --format bf16").code, 0);
  write_model_config(path("hf/config.json"), config_);  // as transformers saves DeepSeek-V3
  std::string log;
  const double first = first_step_loss("hf", "run", &log);
  EXPECT_NE(log.find("no Multi-Token Prediction layers"), std::string::npos) << log;
  EXPECT_NE(log.find("more"), std::string::npos) << log;
  EXPECT_NEAR(first, eval_loss("hf"), 1e-6);

  const test::CliResult bad =
      run("train --set 'init_from=\"" + path("nothing") + "\"' --set device=cpu");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("init_from = \"" + path("nothing") + "\": not a directory"),
            std::string::npos)
      << bad.err;
}

}  // namespace
}  // namespace octet
