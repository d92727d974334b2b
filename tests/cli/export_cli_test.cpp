// `octet export` end to end: a checkpoint exported as bf16 and as fp8 evaluates to the same loss
// (within BF16 rounding, and within the deepseek recipe's FP8 budget), every exported tensor has
// the release's name, dtype and shape, fp8 carries the release's quantization_config, sharding
// writes an index above the size limit, and --drop-mtp leaves the MTP layers out.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>

#include "cli_fixture.h"
#include "io/safetensors.h"
#include "io/token_shard.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "tiny_model.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using test::slurp;

class ExportCli : public test::CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    config_ = test::tiny_model_config();
    write_model_config(path("config.json"), config_);
    std::mt19937 gen(11);
    std::vector<uint16_t> tokens(4 * 32 + 1);
    for (uint16_t& t : tokens) t = static_cast<uint16_t>(gen() % config_.vocab_size);
    io::write_token_shard(path("tokens.bin"), tokens);
    const test::CliResult r =
        run_octet("init '" + path("config.json") + "' '" + path("ckpt") + "' --seed 9");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  test::CliResult run(const std::string& args) const { return run_octet(args); }

  double eval_loss(const std::string& ckpt, const std::string& recipe) const {
    const test::CliResult r = run("eval '" + path(ckpt) + "' --tokens '" + path("tokens.bin") +
                                  "' --seq-len 32 --batch 2 --device cpu --recipe " + recipe);
    EXPECT_EQ(r.code, 0) << r.err;
    std::smatch m;
    const std::regex re("\\nloss: ([0-9.]+)\\n");
    if (!std::regex_search(r.out, m, re)) return -1;
    return std::stod(m[1]);
  }
  // name -> (dtype, shape) of every tensor in a checkpoint directory's safetensors files.
  std::map<std::string, std::pair<DType, Shape>> stored(const std::string& dir) const {
    std::map<std::string, std::pair<DType, Shape>> out;
    for (const auto& e : fs::directory_iterator(path(dir))) {
      if (e.path().extension() != ".safetensors") continue;
      for (const auto& [name, t] : io::read_safetensors(e.path().string()).tensors) {
        EXPECT_EQ(out.count(name), 0u) << name << " in two files";
        out[name] = {t.dtype(), t.shape()};
      }
    }
    return out;
  }
  // What DeepSeek-V3's release (fp8) or its BF16 conversion (bf16) stores for `config`.
  static std::map<std::string, std::pair<DType, Shape>> release(const ModelConfig& config,
                                                                bool fp8) {
    std::map<std::string, std::pair<DType, Shape>> out;
    for (const TensorSpec& s : expected_tensors(config)) {
      if (fp8 && s.kind == TensorKind::kLinear) {
        out[s.name] = {DType::kE4M3, s.shape};
        out[fp8_scale_name(s.name)] = {DType::kF32, fp8_scale_shape(s.shape)};
      } else {
        out[s.name] = {s.kind == TensorKind::kRouterBias ? DType::kF32 : DType::kBF16, s.shape};
      }
    }
    return out;
  }

  ModelConfig config_;
};

TEST_F(ExportCli, Bf16AndFp8ExportsLoadWithTheSameLossAndTheReleaseNames) {
  const double f32_bf16 = eval_loss("ckpt", "bf16");
  const double f32_fp8 = eval_loss("ckpt", "deepseek");

  test::CliResult r = run("export '" + path("ckpt") + "' '" + path("out_bf16") + "' --format bf16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("bf16 (transformers)"), std::string::npos) << r.out;
  EXPECT_TRUE(stored("out_bf16") == release(config_, false));
  const nlohmann::json cb = nlohmann::json::parse(slurp(path("out_bf16/config.json")));
  EXPECT_FALSE(cb.contains("quantization_config"));
  EXPECT_NEAR(eval_loss("out_bf16", "bf16"), f32_bf16, 0.01);

  r = run("export '" + path("ckpt") + "' '" + path("out_fp8") +
          "' --format fp8 --shard-bytes 60000");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(stored("out_fp8") == release(config_, true));
  const nlohmann::json idx =
      nlohmann::json::parse(slurp(path("out_fp8/model.safetensors.index.json")));
  EXPECT_GT(idx["weight_map"].size(), 10u);
  std::set<std::string> files;
  for (const auto& [name, file] : idx["weight_map"].items()) files.insert(file.get<std::string>());
  EXPECT_GT(files.size(), 1u);
  const nlohmann::json cf = nlohmann::json::parse(slurp(path("out_fp8/config.json")));
  EXPECT_EQ(cf["quantization_config"],
            nlohmann::json::parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": [128, 128]})"));
  EXPECT_NEAR(eval_loss("out_fp8", "deepseek"), f32_fp8, 0.05);
  // The export of an export is the same form again.
  r = run("export '" + path("out_fp8") + "' '" + path("out_fp8_2") + "' --format fp8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(stored("out_fp8_2") == release(config_, true));
}

TEST_F(ExportCli, DropMtpAndErrors) {
  test::CliResult r =
      run("export '" + path("ckpt") + "' '" + path("nomtp") + "' --format bf16 --drop-mtp");
  ASSERT_EQ(r.code, 0) << r.err;
  ModelConfig no_mtp = config_;
  no_mtp.num_nextn_predict_layers = 0;
  EXPECT_TRUE(stored("nomtp") == release(no_mtp, false));
  EXPECT_EQ(read_model_config(path("nomtp/config.json")).num_nextn_predict_layers, 0);
  EXPECT_NEAR(eval_loss("nomtp", "bf16"), eval_loss("ckpt", "bf16"), 0.01);

  r = run("export '" + path("ckpt") + "' '" + path("nomtp") + "' --format bf16");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  r = run("export '" + path("ckpt") + "' '" + path("x") + "'");
  EXPECT_NE(r.err.find("--format"), std::string::npos) << r.err;
  r = run("export '" + path("ckpt") + "' '" + path("x") + "' --format int4");
  EXPECT_NE(r.err.find("bf16"), std::string::npos) << r.err;
  // A transformers save without its MTP layers exports only with --drop-mtp.
  write_model_config(path("nomtp/config.json"), config_);
  r = run("export '" + path("nomtp") + "' '" + path("y") + "' --format fp8");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--drop-mtp"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace octet
