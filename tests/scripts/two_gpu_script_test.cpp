// scripts/two_gpu.sh (issue 18's device call) at the shell level: it parses (bash -n), and it
// refuses cleanly, before touching a GPU, a missing carry directory, a carry without octet or
// without a prepared corpus, and a bad NPROC; its one-GPU mode (NPROC=1) end to end on the CPU
// with a tiny model (TRAIN_SET) and a stand-in nvidia-smi; scripts/two_gpu_compare.py's verdicts on
// made-up metrics (a run within the tolerance passes, one beyond it or with a skipped step fails).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cli_fixture.h"

namespace octet {
namespace {

namespace fs = std::filesystem;

const fs::path kRoot = OCTET_SOURCE_DIR;

class TwoGpuScript : public test::CliFixture {
 protected:
  // `cmd` run through the shell in the repository root.
  test::CliResult shell(const std::string& cmd) const {
    const std::string full = "cd '" + kRoot.string() + "' && " + cmd + " >'" + path("o.txt") +
                             "' 2>'" + path("e.txt") + "'";
    const int status = std::system(full.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, test::slurp(path("o.txt")),
            test::slurp(path("e.txt"))};
  }
};

TEST_F(TwoGpuScript, ParsesAndRefusesWhatIsMissing) {
  EXPECT_EQ(shell("bash -n scripts/two_gpu.sh").code, 0);
  const struct {
    std::string env, why;
  } cases[] = {
      {"CARRY='" + path("none") + "' NPROC=1", "no carry directory"},
      {"CARRY='" + path("carry") + "' NPROC=1", "/octet is missing or not executable"},
      {"CARRY='" + path("full") + "' NPROC=1", "no prepared corpus"},
      {"CARRY='" + path("full") + "' NPROC=3", "NPROC=3: expected 1"},
  };
  fs::create_directories(path("carry"));
  fs::create_directories(path("full"));
  std::ofstream(path("full/octet")) << "#!/bin/sh\nexit 99\n";
  fs::permissions(path("full/octet"), fs::perms::owner_all);
  for (const auto& c : cases) {
    const test::CliResult r = shell(c.env + " OUT='" + path("out") + "' bash scripts/two_gpu.sh");
    EXPECT_EQ(r.code, 2) << c.env << ": " << r.err;
    EXPECT_NE(r.err.find("two_gpu.sh: error: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.why), std::string::npos) << c.env << ": " << r.err;
    EXPECT_FALSE(fs::exists(path("out"))) << "wrote output before refusing";
  }
}

TEST_F(TwoGpuScript, OneGpuModeRunsOnTheCpu) {
  if (shell("command -v python3").code != 0) GTEST_SKIP() << "no python3";
  // A prepared corpus: what `octet train` caches from a text file.
  {
    std::ofstream text(path("corpus.txt"));
    for (int i = 0; i < 300; ++i) text << "The quick brown fox " << i % 7 << " jumps over it.\n";
  }
  const std::string tiny =
      "--set device=cpu --set seq_len=16 --set sites_every=0 --set model.hidden_size=32"
      " --set model.intermediate_size=64 --set model.moe_intermediate_size=16"
      " --set model.num_attention_heads=2 --set model.q_lora_rank=16 --set model.kv_lora_rank=16"
      " --set model.qk_nope_head_dim=16 --set model.qk_rope_head_dim=16 --set model.v_head_dim=16"
      " --set model.max_position_embeddings=32 --set model.num_hidden_layers=2"
      " --set model.vocab_size=512 --set optim.warmup_steps=0";
  ASSERT_EQ(
      run_octet("train '" + (kRoot / "configs/baseline-h100.toml").string() + "' " + tiny +
                " --set batch_size=2 --set steps=1" + " --set 'data.text=\"" + path("corpus.txt") +
                "\"' --cache-dir '" + path("cache") + "' --set run_dir='" + path("prep") + "'")
          .code,
      0);
  fs::path prepared;
  for (const auto& e : fs::directory_iterator(path("cache"))) prepared = e.path();
  ASSERT_FALSE(prepared.empty());
  fs::create_directories(path("carry/data"));
  fs::create_directories(path("bin"));
  fs::copy(prepared, path("carry/data/fortunes-test"));
  fs::copy_file(OCTET_CLI_PATH, path("carry/octet"));
  std::ofstream(path("bin/nvidia-smi")) << "#!/bin/sh\ncase \"$1\" in -L) echo 'GPU 0: none';; "
                                           "*) echo '0, none';; esac\n";
  fs::permissions(path("bin/nvidia-smi"), fs::perms::owner_all);
  const test::CliResult r =
      shell("PATH='" + path("bin") + "':$PATH CARRY='" + path("carry") + "' OUT='" + path("out") +
            "' RUNS='" + path("runs") + "' NPROC=1 STEPS=3 RESUME_STEPS=1 BATCH=2 TRAIN_SET='" +
            tiny + "' BENCH_SET='--device cpu --tokens 64 --warmup 0 --bucket-mb 0.1' " +
            "BENCH_RUNS=1 bash scripts/two_gpu.sh");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (const char* want : {"== ref rc=0", "== ref-eager rc=0", "== bench comm --nproc 1 rc=0",
                           "comm on cpu (in-process), 1 rank:", "NPROC=1 done, 0 part(s) failed"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  EXPECT_NE(r.out.find("ref-eager: "), std::string::npos) << r.out;  // the speed comparison
  EXPECT_EQ(r.out.find("== ep2"), std::string::npos) << "a two-GPU part ran at NPROC=1";
  EXPECT_TRUE(fs::exists(path("out/metrics-ref.jsonl")));
  EXPECT_TRUE(fs::exists(path("out/bench-comm.log")));
}

TEST_F(TwoGpuScript, CompareScriptsVerdicts) {
  if (shell("command -v python3").code != 0) GTEST_SKIP() << "no python3";
  auto write = [&](const std::string& name, double shift, int skipped_step, double tps) {
    std::ofstream f(path(name));
    for (int s = 1; s <= 10; ++s)
      f << "{\"step\": " << s << ", \"loss\": " << 10.0 - 0.1 * s + (s > 3 ? shift : 0.0)
        << ", \"tokens_per_s\": " << tps
        << ", \"step_ms\": 100, \"skipped\": " << (s == skipped_step ? "true" : "false") << "}\n";
  };
  write("ref.jsonl", 0, 0, 1e5);
  write("near.jsonl", 1e-4, 0, 1.9e5);  // 1.1e-5 relative at most
  write("far.jsonl", 0.05, 0, 1.9e5);   // 5.6e-3 relative
  write("skip.jsonl", 0, 5, 1.9e5);
  const std::string py = "python3 scripts/two_gpu_compare.py ";
  const std::string ref = " --ref '" + path("ref.jsonl") + "'";
  const test::CliResult near =
      shell(py + "losses" + ref + " --run near='" + path("near.jsonl") + "'");
  EXPECT_EQ(near.code, 0) << near.out << near.err;
  EXPECT_NE(near.out.find("skipped 0; PASS"), std::string::npos) << near.out;
  EXPECT_EQ(shell(py + "losses" + ref + " --run far='" + path("far.jsonl") + "'").code, 1);
  const test::CliResult skip = shell(py + "losses" + ref + " --run s='" + path("skip.jsonl") + "'");
  EXPECT_EQ(skip.code, 1);
  EXPECT_NE(skip.out.find("skipped 1 [5]; FAIL"), std::string::npos) << skip.out;
  const test::CliResult speed = shell(py + "speed --ref one='" + path("ref.jsonl") +
                                      ":1' --run two='" + path("near.jsonl") + ":2'");
  EXPECT_EQ(speed.code, 0) << speed.err;
  EXPECT_NE(speed.out.find("1.90x one on 2 GPUs (0.95x per GPU)"), std::string::npos) << speed.out;
}

}  // namespace
}  // namespace octet
