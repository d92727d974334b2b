// `octet init` end to end: the checkpoint it writes reads back equal to init_parameters bit for bit
// (F32, BF16, sharded), the FP8 form reads in both ways, the summary line, and one-line errors that
// leave OUT_DIR as it was.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cli_fixture.h"
#include "model/checkpoint.h"
#include "model/init.h"
#include "test_util.h"
#include "tiny_model.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using test::bitwise_equal;

using RunResult = test::CliResult;
using test::slurp;

ModelConfig tiny_config() {
  return test::tiny_model_config();
}

class InitCli : public test::CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    write_model_config(path("config.json"), tiny_config());
  }

  RunResult run(const std::string& args) const { return run_octet("init " + args); }

  // Exit code 1, one line "octet init: error: ...<fragment>...", nothing staged left behind.
  void expect_failure(const std::string& args, const std::string& fragment) const {
    SCOPED_TRACE(args);
    const RunResult r = run(args);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("octet init: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos)
        << "missing '" << fragment << "' in " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    for (const auto& e : fs::directory_iterator(dir_))
      EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
  }
};

void expect_equal_params(const io::NamedTensors& expected, const io::NamedTensors& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].first);
    EXPECT_EQ(actual[i].first, expected[i].first);
    EXPECT_TRUE(bitwise_equal(expected[i].second, actual[i].second));
  }
}

TEST_F(InitCli, F32CheckpointEqualsInitParameters) {
  const RunResult r = run(path("config.json") + " " + path("ckpt") + " --seed 1234");
  ASSERT_EQ(r.code, 0) << r.err;
  const io::NamedTensors expected = init_parameters(tiny_config(), 1234);
  int64_t numel = 0;
  for (const auto& [name, t] : expected) numel += t.numel();
  EXPECT_EQ(
      r.out.rfind("initialised " + std::to_string(numel) + " parameters in " +
                      std::to_string(expected.size()) + " tensors (seed 1234, f32): 2 files, ",
                  0),
      0u)
      << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_TRUE(fs::is_regular_file(path("ckpt/model.safetensors")));

  const LoadedCheckpoint ck = read_checkpoint(path("ckpt"));
  EXPECT_FALSE(ck.stored_fp8);
  EXPECT_TRUE(ck.warnings.empty());
  EXPECT_EQ(ck.config.hidden_size, 64);
  EXPECT_EQ(ck.config.num_nextn_predict_layers, 1);
  expect_equal_params(expected, ck.tensors);

  // The default seed is 0, and --seed=S is the same flag.
  ASSERT_EQ(run(path("config.json") + " " + path("zero")).code, 0);
  expect_equal_params(init_parameters(tiny_config(), 0), read_checkpoint(path("zero")).tensors);
  ASSERT_EQ(run(path("config.json") + " " + path("big") + " --seed=18446744073709551615").code, 0);
  expect_equal_params(init_parameters(tiny_config(), ~uint64_t{0}),
                      read_checkpoint(path("big")).tensors);
}

TEST_F(InitCli, Bf16AndShardedCheckpoints) {
  const RunResult r =
      run(path("config.json") + " " + path("ckpt") + " --seed 5 --format bf16 --shard-bytes 20000");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("(seed 5, bf16)"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_regular_file(path("ckpt/model.safetensors.index.json")));
  EXPECT_FALSE(fs::exists(path("ckpt/model.safetensors")));
  int shards = 0;
  for (const auto& e : fs::directory_iterator(path("ckpt")))
    shards += e.path().filename().string().rfind("model-", 0) == 0;
  EXPECT_GT(shards, 3);
  EXPECT_NE(r.out.find(std::to_string(shards + 2) + " files"), std::string::npos) << r.out;
  expect_equal_params(init_parameters(tiny_config(), 5, DType::kBF16),
                      read_checkpoint(path("ckpt")).tensors);
}

TEST_F(InitCli, Fp8CheckpointReads) {
  const RunResult r = run(path("config.json") + " " + path("ckpt") + " --format fp8 --seed 8");
  ASSERT_EQ(r.code, 0) << r.err;
  const ModelConfig c = tiny_config();
  const std::vector<TensorSpec> specs = expected_tensors(c);
  const io::NamedTensors f32 = init_parameters(c, 8);

  CheckpointReadOptions keep;
  keep.fp8_weights = Fp8Weights::kKeep;
  const LoadedCheckpoint q = read_checkpoint(path("ckpt"), keep);
  EXPECT_TRUE(q.stored_fp8);
  size_t linear = 0;
  for (const TensorSpec& s : specs) {
    if (s.kind != TensorKind::kLinear) continue;
    ++linear;
    ASSERT_TRUE(q.quantized.count(s.name)) << s.name;
    EXPECT_EQ(q.quantized.at(s.name).data.dtype(), DType::kE4M3);
    EXPECT_EQ(q.quantized.at(s.name).scale_inv.shape(), fp8_scale_shape(s.shape));
  }
  EXPECT_EQ(q.quantized.size(), linear);
  EXPECT_GT(linear, 20u);

  // Dequantized: every weight within E4M3's half ulp (2^-4 relative) of the F32 initial value,
  // or, below E4M3's normal range, half its smallest subnormal (2^-10) times the block's scale.
  CheckpointReadOptions f32_read;
  f32_read.cast = ReadCast::kToF32;
  const LoadedCheckpoint d = read_checkpoint(path("ckpt"), f32_read);
  ASSERT_EQ(d.tensors.size(), f32.size());
  for (size_t i = 0; i < f32.size(); ++i) {
    SCOPED_TRACE(f32[i].first);
    const Tensor &want = f32[i].second, &got = d.tensors[i].second;
    ASSERT_EQ(got.dtype(), DType::kF32);
    ASSERT_EQ(got.shape(), want.shape());
    float amax = 0;
    for (int64_t k = 0; k < want.numel(); ++k)
      amax = std::max(amax, std::fabs(want.data_as<float>()[k]));
    const bool fp8 = specs[i].kind == TensorKind::kLinear;
    for (int64_t k = 0; k < want.numel(); ++k) {
      const double w = want.data_as<float>()[k], g = got.data_as<float>()[k];
      // Non-FP8 tensors went through BF16 (2^-8 relative); amax / 448 bounds every block's scale.
      const double bound =
          fp8 ? 0x1p-4 * std::fabs(w) + 0x1p-10 * amax / 448 : 0x1p-8 * std::fabs(w);
      ASSERT_LE(std::fabs(w - g), bound * (1 + 1e-6)) << k;
    }
  }
}

TEST_F(InitCli, ErrorsAreOneLineAndLeaveOutDirUntouched) {
  const std::string cfg = path("config.json"), out = path("out");
  nlohmann::json bad = model_config_to_json(tiny_config());
  bad["n_group"] = 3;  // 8 experts do not split into 3 groups
  std::ofstream(path("bad.json")) << bad.dump();
  std::ofstream(path("garbage.json")) << "{ not json";
  std::ofstream(path("afile")) << "x";

  expect_failure(path("missing.json") + " " + out, "cannot open the model config");
  expect_failure(path("garbage.json") + " " + out, "not valid JSON");
  expect_failure(path("bad.json") + " " + out, "must be a multiple of n_group (3)");
  expect_failure(cfg + " " + out + " --format f16", "bad value 'f16' for --format");
  expect_failure(cfg + " " + out + " --seed -1", "bad value '-1' for --seed");
  expect_failure(cfg + " " + out + " --seed 12x", "bad value '12x' for --seed");
  expect_failure(cfg + " " + out + " --seed 18446744073709551616", "for --seed");
  expect_failure(cfg + " " + out + " --shard-bytes 0", "bad value '0' for --shard-bytes");
  expect_failure(cfg + " " + out + " --frobnicate", "unknown flag --frobnicate");
  expect_failure(cfg, "expected 2 arguments");
  EXPECT_FALSE(fs::exists(out));
  expect_failure(cfg + " " + path("afile/out"), "is not a directory");
  expect_failure(cfg + " " + path("afile"), "exists and is not a directory");
  EXPECT_EQ(slurp(path("afile")), "x");

  // An existing checkpoint is kept, unless --force; other files in OUT_DIR survive either way.
  ASSERT_EQ(run(cfg + " " + out + " --seed 1").code, 0);
  std::ofstream(path("out/README.md")) << "notes";
  // A .safetensors file that is not part of the checkpoint (its help says it is kept).
  std::ofstream(path("out/adapter.safetensors")) << "not ours";
  const std::string before = slurp(path("out/model.safetensors"));
  expect_failure(cfg + " " + out + " --seed 2", "already holds a checkpoint (config.json)");
  expect_failure(path("bad.json") + " " + out + " --force", "multiple of n_group");
  EXPECT_EQ(slurp(path("out/model.safetensors")), before);
  const RunResult r = run(cfg + " " + out + "/ --seed 2 --force");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(path("out/README.md")), "notes");
  EXPECT_EQ(slurp(path("out/adapter.safetensors")), "not ours");
  // A sharded checkpoint over it: the old model.safetensors goes (it was the checkpoint), the
  // stranger stays.
  ASSERT_EQ(run(cfg + " " + out + " --seed 2 --force --shard-bytes 20000").code, 0);
  EXPECT_FALSE(fs::exists(path("out/model.safetensors")));
  EXPECT_TRUE(fs::exists(path("out/model.safetensors.index.json")));
  EXPECT_EQ(slurp(path("out/adapter.safetensors")), "not ours");
  // Sizes that do not fit are one clear error, and nothing is written.
  nlohmann::json huge = model_config_to_json(tiny_config());
  huge["vocab_size"] = int64_t{1} << 62;
  std::ofstream(path("huge.json")) << huge.dump();
  expect_failure(path("huge.json") + " " + path("huge"), "vocab_size must be <= 2147483647");
  EXPECT_FALSE(fs::exists(path("huge")));
  huge = model_config_to_json(tiny_config());
  huge["n_routed_experts"] = int64_t{1} << 30;
  huge["n_group"] = 1;
  huge["topk_group"] = 1;
  std::ofstream(path("huge.json")) << huge.dump();
  expect_failure(path("huge.json") + " " + path("huge"), "GiB of host memory");
  EXPECT_FALSE(fs::exists(path("huge")));
  expect_equal_params(init_parameters(tiny_config(), 2), read_checkpoint(out).tensors);
}

// `octet init` never deletes or replaces a file it did not write (issue 13): a file in OUT_DIR
// named like a shard of the new checkpoint is refused without --force, a user's file with ".tmp."
// in its name survives a --force over an old checkpoint, and a directory beside OUT_DIR named like
// the staging directory of the writing process (OUT_DIR.tmp.<pid>) is left alone.
TEST_F(InitCli, NeverDeletesOrReplacesAFileItDidNotWrite) {
  const std::string cfg = path("config.json"), out = path("out");
  fs::create_directories(path("shards"));
  std::ofstream(path("shards/model-00001-of-00002.safetensors")) << "a stranger's shard";
  expect_failure(cfg + " " + path("shards") + " --shard-bytes 20000",
                 "already holds model-00001-of-00002.safetensors (a checkpoint shard's name)");
  EXPECT_EQ(slurp(path("shards/model-00001-of-00002.safetensors")), "a stranger's shard");
  EXPECT_FALSE(fs::exists(path("shards/config.json")));

  fs::create_directories(out);
  std::ofstream(path("out/notes.tmp.txt")) << "mine";
  ASSERT_EQ(run(cfg + " " + out + " --seed 1 --shard-bytes 20000").code, 0);
  ASSERT_TRUE(fs::exists(path("out/model.safetensors.index.json")));
  EXPECT_EQ(slurp(path("out/notes.tmp.txt")), "mine");

  // --force over that checkpoint, from a child whose pid is known before it starts: the
  // lookalike staging directory is planted first.
  int gate[2];
  ASSERT_EQ(::pipe(gate), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(gate[1]);
    char c = 0;
    if (::read(gate[0], &c, 1) != 1) ::_exit(126);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, STDOUT_FILENO);
    ::execl(OCTET_CLI_PATH, "octet", "init", cfg.c_str(), out.c_str(), "--seed", "2", "--force",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(gate[0]);
  const std::string lookalike = out + ".tmp." + std::to_string(pid);
  fs::create_directories(lookalike);
  std::ofstream(lookalike + "/mine") << "not octet's";
  ASSERT_EQ(::write(gate[1], "x", 1), 1);
  ::close(gate[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(slurp(lookalike + "/mine"), "not octet's")
      << "init removed a directory of someone else";
  EXPECT_EQ(slurp(path("out/notes.tmp.txt")), "mine") << "init dropped a file it did not write";
  expect_equal_params(init_parameters(tiny_config(), 2), read_checkpoint(out).tensors);
}

TEST_F(InitCli, HelpDescribesFlagsAndDefaults) {
  const RunResult r = run("--help");
  EXPECT_EQ(r.code, 0);
  for (const char* s :
       {"usage: octet init CONFIG_JSON OUT_DIR", "--seed", "(default 0)", "--format", "f32", "bf16",
        "fp8", "--shard-bytes", "--force", "initializer_range"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " in:\n" << r.out;
}

}  // namespace
}  // namespace octet
