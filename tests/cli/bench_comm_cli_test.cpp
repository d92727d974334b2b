// `octet bench comm` from the command line: a run on in-process ranks (the CPU backend) at world
// sizes 1 and 2 on the baseline configuration's hidden size and experts with few tokens, the byte
// counts it reports, the refusals of bad arguments and of launched ranks without CUDA; and, where
// a GPU and NCCL are present, one rank on the GPU through the --nproc spawner.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <sstream>

#include "backend/backend.h"
#include "cli_fixture.h"
#include "dist/nccl_comm.h"

namespace octet {
namespace {

const std::string kBaseline =
    (std::filesystem::path(OCTET_SOURCE_DIR) / "configs/baseline-h100.toml").string();

class BenchCommCli : public test::CliFixture {
 protected:
  void TearDown() override {
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})
      ::unsetenv(v);
    CliFixture::TearDown();
  }
  test::CliResult bench(const std::string& extra) const {
    return run_octet("bench comm '" + kBaseline + "' " + extra);
  }
};

// The table row whose first cell starts with `op`, split into its cells.
std::vector<std::string> row(const std::string& out, const std::string& op) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| " + op, 0) != 0) continue;
    std::vector<std::string> cells;
    std::istringstream l(line.substr(1));
    for (std::string c; std::getline(l, c, '|');) {
      const size_t a = c.find_first_not_of(' '), b = c.find_last_not_of(' ');
      cells.push_back(a == std::string::npos ? "" : c.substr(a, b - a + 1));
    }
    return cells;
  }
  return {};
}

TEST_F(BenchCommCli, RunsOnInProcessRanks) {
  for (const int world : {1, 2}) {
    const test::CliResult r = bench("--device cpu --nproc " + std::to_string(world) +
                                    " --tokens 256 --runs 2 --warmup 1 --bucket-mb 0.25");
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string ranks = std::to_string(world) + (world == 1 ? " rank:" : " ranks:");
    EXPECT_NE(r.out.find("comm on cpu (in-process), " + ranks), std::string::npos) << r.out;
    // 256 tokens x top-4 rows a rank; FP8 payload 1024 B + 8 scales x 4 B a row; BF16 back.
    const auto dispatch = row(r.out, "dispatch: payload + scales");
    ASSERT_EQ(dispatch.size(), 6u) << r.out;
    EXPECT_EQ(dispatch[1], "1.03");  // 256 x 4 x 1056 B
    EXPECT_GT(std::stod(dispatch[3]), 0.0);
    // Over the ranks the combine returns what the dispatch sent: 256 x 4 x 2048 B on average.
    EXPECT_EQ(row(r.out, "combine: BF16")[1], "2.00");
    EXPECT_EQ(row(r.out, "in-process all-to-all, equal blocks, the combine's")[1], "2.00");
    const auto rs = row(r.out, "reduce-scatter, one bucket");
    ASSERT_EQ(rs.size(), 6u) << r.out;
    EXPECT_EQ(rs[1], "0.25");
    // busbw = algbw x (n - 1) / n: 0 alone.
    if (world == 1) EXPECT_EQ(std::stod(rs[4]), 0.0);
    if (world == 2) EXPECT_NEAR(std::stod(rs[4]), std::stod(rs[3]) / 2, 0.06) << r.out;
    EXPECT_NE(r.out.find("x 7 MoE layers"), std::string::npos) << r.out;
  }
}

TEST_F(BenchCommCli, RefusesBadArguments) {
  const struct {
    std::string args, why;
  } cases[] = {
      {"--nproc 0", "--nproc 0: expected 1 to 1024"},
      {"--runs x", "bad value 'x' for --runs"},
      {"--warmup -1", "--warmup -1: expected 0 to"},
      {"--tokens 0", "--tokens 0: expected 1 to"},
      {"--bucket-mb 0", "bad value '0' for --bucket-mb"},
      {"--bucket-mb 1x", "bad value '1x' for --bucket-mb"},
      {"--device tpu", "bad value 'tpu' for --device"},
      {"--frob", "unknown flag --frob"},
      {"--set model.n_routed_experts=0", "model.n_routed_experts"},
      {"--set", "--set needs a key=value argument"},
      // 32 experts do not divide over 3 ranks: every rank fails naming it.
      {"--device cpu --nproc 3 --tokens 16 --runs 1",
       "32 routed experts do not divide over 3 ranks"},
  };
  for (const auto& c : cases) {
    const test::CliResult r = bench(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.err.find(c.why), std::string::npos) << c.args << ": " << r.err;
  }
  const test::CliResult missing = run_octet("bench comm '" + path("none.toml") + "'");
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.err.find("cannot open the training config"), std::string::npos);
  if (!nccl_built()) {
    const test::CliResult r = bench("--device cuda");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find("needs NCCL, and this build has none"), std::string::npos) << r.err;
  }
}

TEST_F(BenchCommCli, LaunchedRanksNeedCuda) {
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "29999", 1);
  const test::CliResult r = bench("--device cpu --tokens 16");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("rank 1 of 2 (torchrun): launched ranks need CUDA and NCCL"),
            std::string::npos)
      << r.err;
}

TEST_F(BenchCommCli, HelpNamesTheFlags) {
  const test::CliResult r = run_octet("bench comm --help");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* f : {"--nproc", "--device", "--runs", "--tokens", "--bucket-mb", "--set"})
    EXPECT_NE(r.out.find(f), std::string::npos) << f;
  EXPECT_NE(run_octet("bench --help").out.find("comm"), std::string::npos);
}

// On a machine with a GPU and NCCL: world size 1 through the spawner (RANK=0 WORLD_SIZE=1).
TEST_F(BenchCommCli, OneGpuRankThroughTheSpawner) {
  if (!nccl_built() || cuda_device_count() < 1) GTEST_SKIP() << "needs a GPU and NCCL";
  const test::CliResult r = bench("--nproc 1 --runs 3 --warmup 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("comm on cuda (nccl), 1 rank:"), std::string::npos) << r.out;
  const auto dispatch = row(r.out, "dispatch: payload + scales");
  ASSERT_EQ(dispatch.size(), 6u) << r.out;
  EXPECT_EQ(dispatch[1], "66.00");  // 16,384 tokens x 4 x 1056 B
}

}  // namespace
}  // namespace octet
