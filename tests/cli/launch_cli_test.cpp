// `octet train --nproc N` and launched ranks (torchrun-style variables) from the command line, on a
// machine without GPUs: one rank trains through the spawner; several ranks fail on every rank with
// one clear line and a non-zero status instead of hanging; malformed launch variables are refused.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>

#include "backend/backend.h"
#include "cli_fixture.h"
#include "dist/nccl_comm.h"
#include "train/metrics.h"

namespace octet {
namespace {

const char* const kTiny =
    " --set device=cpu --set batch_size=2 --set seq_len=16 --set log_every=1 --set eval.every=0"
    " --set steps=2 --set optim.warmup_steps=0 --set sites_every=0 --set model.hidden_size=32"
    " --set model.intermediate_size=64 --set model.moe_intermediate_size=16"
    " --set model.num_attention_heads=2 --set model.q_lora_rank=16 --set model.kv_lora_rank=16"
    " --set model.qk_nope_head_dim=16 --set model.qk_rope_head_dim=16 --set model.v_head_dim=16"
    " --set model.max_position_embeddings=32";

class LaunchCli : public test::CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    std::ostringstream s;
    for (int i = 0; i < 200; ++i)
      s << "The quick brown fox " << i % 7 << " jumps over the lazy dog number " << i % 13 << ".\n";
    std::ofstream(path("corpus.txt")) << s.str();
  }
  void TearDown() override {
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})
      ::unsetenv(v);
    CliFixture::TearDown();
  }
  test::CliResult train(const std::string& run, const std::string& extra) const {
    return run_octet("train" + std::string(kTiny) + " --set 'data.text=\"" + path("corpus.txt") +
                     "\"' --cache-dir '" + path("cache") + "' --set run_dir='" + path(run) + "' " +
                     extra);
  }
};

TEST_F(LaunchCli, OneRankTrainsThroughTheSpawner) {
  const test::CliResult r = train("one", "--nproc 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("trained 2 steps"), std::string::npos) << r.out;
  EXPECT_EQ(train::read_metrics(path("one") + "/metrics.jsonl").size(), 2u);
}

TEST_F(LaunchCli, SeveralRanksWithoutGpusFailOnEveryRank) {
  if (nccl_built() && cuda_device_count() >= 2) GTEST_SKIP() << "GPUs present";
  const test::CliResult r = train("two", "--nproc 2");
  EXPECT_EQ(r.code, 1);
  const std::string why = nccl_built() ? "GPU(s); start at most one rank per GPU"
                                       : "several ranks need NCCL, and this build has none";
  // The first rank to fail reports why; the launcher then stops the other one (SIGTERM), which
  // may or may not have got as far as its own error line.
  EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("; stopping the other ranks"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with status 1"), std::string::npos) << r.err;
}

TEST_F(LaunchCli, BadLaunchesAreRefused) {
  test::CliResult r = train("x", "--nproc 0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--nproc 0: expected 1 to 1024 ranks"), std::string::npos) << r.err;
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  r = train("x", "");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("MASTER_ADDR is not set"), std::string::npos) << r.err;
  r = train("x", "--nproc 2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--nproc starts its own ranks"), std::string::npos) << r.err;
  ::setenv("RANK", "2", 1);
  r = train("x", "");
  EXPECT_NE(r.err.find("RANK=2 is not below WORLD_SIZE=2"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace octet
