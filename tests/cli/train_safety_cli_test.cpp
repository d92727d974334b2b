// `octet train` never damages another run, a file it did not write, or itself (issue 13): run
// directories are owned and locked, a resume continues a run where it lives with its own config,
// sizes fail fast, signals end a run with a checkpoint, and a run that went nowhere exits non-zero.
// Each test reproduces one defect found on an earlier main.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli_fixture.h"
#include "train/metrics.h"
#include "train/run_dir.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using test::slurp;

// A model small enough that a CPU step takes milliseconds.
const char* const kTiny =
    " --set device=cpu --set batch_size=2 --set seq_len=16 --set log_every=1 --set eval.every=0"
    " --set optim.warmup_steps=0 --set sites_every=0 --set model.hidden_size=32"
    " --set model.intermediate_size=64 --set model.moe_intermediate_size=16"
    " --set model.num_attention_heads=2 --set model.q_lora_rank=16 --set model.kv_lora_rank=16"
    " --set model.qk_nope_head_dim=16 --set model.qk_rope_head_dim=16 --set model.v_head_dim=16"
    " --set model.max_position_embeddings=32";

class TrainSafetyCli : public test::CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    std::ostringstream s;
    for (int i = 0; i < 300; ++i)
      s << "The quick brown fox " << i % 7 << " jumps over the lazy dog number " << i % 13
        << ". Pack my box with five dozen liquor jugs.\n";
    std::ofstream(path("corpus.txt")) << s.str();
  }

  // `octet train` of the tiny model on the test corpus into run directory `run`, plus `extra`.
  test::CliResult train(const std::string& run, const std::string& extra) const {
    return run_octet("train" + std::string(kTiny) + " --set 'data.text=\"" + path("corpus.txt") +
                     "\"' --cache-dir '" + path("cache") + "' --set run_dir='" + path(run) + "' " +
                     extra);
  }
  test::CliResult resume(const std::string& what, const std::string& extra) const {
    return run_octet("train --resume '" + path(what) + "' --cache-dir '" + path("cache") + "' " +
                     extra);
  }
  std::string latest(const std::string& run) const {
    std::ifstream in(path(run) + "/checkpoints/latest");
    std::string name;
    in >> name;
    return name;
  }
  // Every file under `dir`, with its contents, to compare a directory before and after.
  std::string snapshot(const std::string& dir) const {
    std::ostringstream s;
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(path(dir)))
      if (e.is_regular_file() && e.path().filename() != ".lock") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) s << f.string() << "\n" << slurp(f) << "\n";
    return s.str();
  }
};

TEST_F(TrainSafetyCli, ANewRunIntoADirectoryHoldingARunIsRefusedAndTheOldRunKept) {
  ASSERT_EQ(train("run", "--set steps=4 --set checkpoint_every=2").code, 0);
  const std::string before = snapshot("run");
  const test::CliResult r = train("run", "--set steps=2 --set seed=7");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("already holds run"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--resume"), std::string::npos) << r.err;
  EXPECT_EQ(snapshot("run"), before) << "a refused run changed the directory";
}

// --trace: a request the run cannot honour fails before anything is written.
TEST_F(TrainSafetyCli, AKernelTraceItCannotTakeFailsBeforeTheRunStarts) {
  const struct {
    const char* extra;
    const char* error;
  } cases[] = {
      {"--set steps=4 --trace t.csv", "needs a CUDA device"},
      {"--set steps=4 --trace-steps 1:2", "give --trace too"},
      {"--set steps=4 --trace t.csv --trace-steps 2", "give FIRST:LAST"},
      {"--set steps=4 --trace t.csv --trace-steps x:2", "FIRST is not a number"},
      {"--set steps=4 --trace t.csv --trace-steps 2:y", "LAST is not a number"},
  };
  for (const auto& c : cases) {
    const test::CliResult e = train("run", c.extra);
    EXPECT_NE(e.code, 0) << c.extra;
    EXPECT_NE(e.err.find(c.error), std::string::npos) << c.extra << ": " << e.err;
    EXPECT_FALSE(fs::exists(path("run"))) << c.extra << ": the refused run wrote its directory";
  }
}

TEST_F(TrainSafetyCli, OverwriteRemovesTheOldRunWholeAndKeepsOtherFiles) {
  ASSERT_EQ(train("run", "--set steps=4 --set checkpoint_every=1 --set keep_checkpoints=0").code,
            0);
  const std::string old_id = train::run_id_of(path("run"));
  std::ofstream(path("run/notes.txt")) << "mine";
  const test::CliResult r = train("run", "--set steps=2 --set checkpoint_every=1 --overwrite");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("removed the previous run"), std::string::npos) << r.out;
  EXPECT_NE(train::run_id_of(path("run")), old_id);
  EXPECT_EQ(train::read_metrics(path("run/metrics.jsonl")).size(), 2u);
  EXPECT_TRUE(fs::exists(path("run/checkpoints/step_00000002")));
  EXPECT_FALSE(fs::exists(path("run/checkpoints/step_00000003"))) << "the old run's checkpoint";
  EXPECT_FALSE(fs::exists(path("run/checkpoints/step_00000004"))) << "the old run's checkpoint";
  EXPECT_EQ(latest("run"), "step_00000002");
  EXPECT_EQ(slurp(path("run/notes.txt")), "mine");
}

TEST_F(TrainSafetyCli, ASecondProcessOnTheSameRunDirectoryFailsAtOnce) {
  const train::RunDirLock held = train::lock_run_dir(path("run"));  // "another process"
  const auto t0 = std::chrono::steady_clock::now();
  const test::CliResult r = train("run", "--set steps=2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("in use by another octet process (pid " + std::to_string(::getpid())),
            std::string::npos)
      << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20)) << "it waited";
  EXPECT_FALSE(fs::exists(path("run/config.toml")));
  EXPECT_FALSE(fs::exists(path("run/run.json")));
}

TEST_F(TrainSafetyCli, ResumeContinuesInTheRunsOwnDirectoryWithItsConfig) {
  ASSERT_EQ(train("run", "--set steps=2 --set seed=11").code, 0);
  // From another working directory, with no run_dir: nothing goes to runs/default there.
  fs::create_directories(path("elsewhere"));
  const std::string cmd =
      "train --resume '" + path("run") + "' --cache-dir '" + path("cache") + "' --set steps=3";
  const std::string cwd = fs::current_path();
  fs::current_path(path("elsewhere"));
  const test::CliResult ok = run_octet(cmd);
  fs::current_path(cwd);
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_FALSE(fs::exists(path("elsewhere/runs"))) << "the resume wrote into runs/default";
  EXPECT_EQ(train::read_metrics(path("run/metrics.jsonl")).size(), 3u);
  EXPECT_EQ(latest("run"), "step_00000003");
  // Its own config: the seed came from run/config.toml, not the built-in default.
  EXPECT_NE(slurp(path("run/config.toml")).find("seed = 11"), std::string::npos);
  // A run_dir other than the run's own is refused.
  const test::CliResult moved = resume("run", "--set steps=4 --set run_dir=" + path("other"));
  EXPECT_EQ(moved.code, 1);
  EXPECT_NE(moved.err.find("continues there"), std::string::npos) << moved.err;
  EXPECT_FALSE(fs::exists(path("other")));
}

TEST_F(TrainSafetyCli, AResumeThatChangesWhatARunComputesIsRefusedUnlessAsked) {
  ASSERT_EQ(train("run", "--set steps=2 --set recipe=bf16").code, 0);
  const std::string before = snapshot("run");
  const test::CliResult r = resume("run", "--set steps=3 --set recipe=deepseek");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("recipe (\"bf16\" -> \"deepseek\")"), std::string::npos) << r.err;
  EXPECT_EQ(snapshot("run"), before);
  const test::CliResult ok =
      resume("run", "--set steps=3 --set recipe=deepseek --allow-config-change");
  ASSERT_EQ(ok.code, 0) << ok.err;
  const auto records = train::read_metrics(path("run/metrics.jsonl"));
  ASSERT_EQ(records.size(), 3u);
  ASSERT_EQ(records[2].config_changes.size(), 2u);
  EXPECT_EQ(records[2].config_changes[0], "steps: 2 -> 3");
  EXPECT_EQ(records[2].config_changes[1], "recipe: \"bf16\" -> \"deepseek\"");
}

TEST_F(TrainSafetyCli, AFailedResumeChangesNothingOnDisk) {
  ASSERT_EQ(train("run", "--set steps=2").code, 0);
  const std::string before = snapshot("run");
  // Another model shape: refused without the flag, and fails to load with it.
  EXPECT_EQ(resume("run", "--set steps=3 --set model.hidden_size=64").code, 1);
  const test::CliResult r =
      resume("run", "--set steps=3 --set model.hidden_size=64 --allow-config-change");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("expected"), std::string::npos) << r.err;
  EXPECT_EQ(snapshot("run"), before) << "a failed resume rewrote the run";
}

TEST_F(TrainSafetyCli, AResumeOfAFinishedRunIsAnError) {
  ASSERT_EQ(train("run", "--set steps=2").code, 0);
  const test::CliResult r = resume("run", "");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("already finished"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("final loss 0"), std::string::npos) << r.out;
}

TEST_F(TrainSafetyCli, PruningAndLatestOnlySeeThisStretchOfTheRun) {
  ASSERT_EQ(train("run", "--set steps=6 --set checkpoint_every=3 --set keep_checkpoints=0").code,
            0);
  // Back to step 3, keeping one checkpoint: step 6 (of the abandoned stretch) sorts last, and
  // used to make pruning delete the new checkpoints, leaving `latest` naming a missing one.
  const test::CliResult r =
      resume("run/checkpoints/step_00000003",
             "--set steps=5 --set checkpoint_every=1 --set keep_checkpoints=1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(latest("run"), "step_00000005");
  EXPECT_TRUE(fs::exists(path("run/checkpoints/step_00000005/trainer_state.json")));
  EXPECT_FALSE(fs::exists(path("run/checkpoints/step_00000004")));
  EXPECT_FALSE(fs::exists(path("run/checkpoints/step_00000003")));
}

TEST_F(TrainSafetyCli, StaleCheckpointStagingOfDeadProcessesIsRemovedAtStart) {
  ASSERT_EQ(train("run", "--set steps=2").code, 0);
  for (const char* d : {"step_00000009.partial", "step_00000009.partial.tmp.99999"}) {
    fs::create_directories(path("run/checkpoints/") + d);
    std::ofstream(path("run/checkpoints/") + d + "/model.safetensors") << "half written";
  }
  const test::CliResult r = resume("run", "--set steps=3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("removed 2 unfinished checkpoint write(s)"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(path("run/checkpoints/step_00000009.partial")));
  EXPECT_FALSE(fs::exists(path("run/checkpoints/step_00000009.partial.tmp.99999")));
}

TEST_F(TrainSafetyCli, SigtermFinishesTheStepWritesACheckpointAndExitsNonZero) {
  const std::string args = std::string("exec '") + OCTET_CLI_PATH + "' train" + kTiny +
                           " --set 'data.text=\"" + path("corpus.txt") + "\"' --cache-dir '" +
                           path("cache") + "' --set run_dir='" + path("run") +
                           "' --set steps=100000 --set checkpoint_every=0 >'" + path("out.txt") +
                           "' 2>'" + path("err.txt") + "'";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", args.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Wait for a few steps, then ask it to stop.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(path("run/metrics.jsonl")) &&
        train::read_metrics(path("run/metrics.jsonl")).size() >= 3)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by the signal instead of stopping cleanly";
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  const auto records = train::read_metrics(path("run/metrics.jsonl"));
  ASSERT_GE(records.size(), 3u);
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(records.back().step));
  EXPECT_EQ(latest("run"), name) << "the checkpoint is not of the last step";
  EXPECT_TRUE(fs::exists(path("run/checkpoints/") + name + "/trainer_state.json"));
  const std::string err = slurp(path("err.txt"));
  EXPECT_NE(err.find("interrupted"), std::string::npos) << err;
  EXPECT_NE(err.find("--resume"), std::string::npos) << err;
  // And the run continues from there.
  const test::CliResult r = resume("run", "--set steps=" + std::to_string(records.back().step + 1));
  EXPECT_EQ(r.code, 0) << r.err;
}

// A second signal ends the run at once. The process is stopped (SIGSTOP) while both signals are
// sent, so that they are two pending signals (two SIGTERMs would merge into one) and both arrive
// before the step can end: SIGINT asks for a stop, SIGTERM then ends the process by its default
// action.
TEST_F(TrainSafetyCli, ASecondSignalEndsTheRunAtOnce) {
  const std::string args = std::string("exec '") + OCTET_CLI_PATH + "' train" + kTiny +
                           " --set 'data.text=\"" + path("corpus.txt") + "\"' --cache-dir '" +
                           path("cache") + "' --set run_dir='" + path("run") +
                           "' --set steps=100000 --set checkpoint_every=0 >'" + path("out.txt") +
                           "' 2>'" + path("err.txt") + "'";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", args.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(path("run/metrics.jsonl")) &&
        !train::read_metrics(path("run/metrics.jsonl")).empty())
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, WUNTRACED), pid);
  ASSERT_TRUE(WIFSTOPPED(status));
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  ASSERT_EQ(::kill(pid, SIGCONT), 0);
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status))
      << "exit status " << WEXITSTATUS(status) << ": the second signal did not end it at once";
  EXPECT_TRUE(WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM) << WTERMSIG(status);
  EXPECT_NE(slurp(path("err.txt")).find("signal again to stop at once"), std::string::npos);
  EXPECT_FALSE(fs::exists(path("run/checkpoints/latest"))) << "it wrote a checkpoint first";
}

TEST_F(TrainSafetyCli, ARunWhoseStepsWereAllSkippedOrThatDivergedExitsNonZero) {
  // Weights of 1e30: every loss is non-finite from the first step, so every update is skipped.
  const test::CliResult all =
      train("all", "--set steps=3 --set model.initializer_range=1e30 --set recipe=bf16");
  EXPECT_EQ(all.code, 1) << all.out;
  EXPECT_NE(all.err.find("every one of the 3 steps was skipped"), std::string::npos) << all.err;
  // An absurd rate: the first update applies, then the run diverges and stops after two skips.
  const test::CliResult div = train("div",
                                    "--set steps=50 --set optim.lr=1e30 --set optim.grad_clip=0 "
                                    "--set safety.max_skipped_in_a_row=2 --set recipe=bf16");
  EXPECT_EQ(div.code, 1) << div.out;
  EXPECT_NE(div.err.find("diverged: 2 updates in a row were skipped"), std::string::npos)
      << div.err;
  EXPECT_LT(train::read_metrics(path("div/metrics.jsonl")).size(), 50u);
}

TEST_F(TrainSafetyCli, AbsurdSizesAreOneClearErrorBeforeAnyAllocation) {
  const struct {
    const char* set;
    const char* message;
  } cases[] = {
      {"model.vocab_size=4611686018427387904", "model.vocab_size must be <= 2147483647"},
      {"batch_size=4611686018427387904", "batch_size * seq_len"},
      {"model.n_routed_experts=1099511627776", "model.n_routed_experts must be <="},
      {"batch_size=200000000", "must be <= 2147483647 tokens"},
      {"batch_size=50000000", "of host memory"},
  };
  for (const auto& c : cases) {
    const test::CliResult r = train("run", std::string("--set steps=1 --set ") + c.set);
    EXPECT_EQ(r.code, 1) << c.set;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.set << ": " << r.err;
    EXPECT_FALSE(fs::exists(path("run/run.json"))) << c.set;
  }
  // describe used to print negative parameter counts for these.
  std::ofstream(path("huge.json"))
      << R"({"vocab_size": 4611686018427387904, "hidden_size": 4611686018427387904})";
  const test::CliResult d = run_octet("describe '" + path("huge.json") + "'");
  EXPECT_EQ(d.code, 1);
  EXPECT_NE(d.err.find("must be <= 2147483647"), std::string::npos) << d.err;
  EXPECT_EQ(d.out.find("-"), std::string::npos) << d.out;
  // describe takes the TOML run configs that train takes, with the same numbers as the model's
  // config.json.
  std::ofstream(path("run.toml")) << "recipe = \"bf16\"\nbatch_size = 4\nseq_len = 64\n"
                                  << "[model]\nhidden_size = 96\n";
  const test::CliResult toml = run_octet("describe '" + path("run.toml") + "'");
  EXPECT_EQ(toml.code, 0) << toml.err;
  EXPECT_NE(toml.out.find("bf16"), std::string::npos) << toml.out;
  const test::CliResult print =
      run_octet("train --set model.hidden_size=96 --set recipe=bf16 --print-config");
  ASSERT_EQ(print.code, 0) << print.err;
  std::ofstream(path("printed.toml")) << print.out;
  const test::CliResult printed =
      run_octet("describe '" + path("printed.toml") + "' --tokens 256 --seq-len 64");
  EXPECT_EQ(printed.code, 0) << printed.err;
  EXPECT_EQ(printed.out, toml.out);
  // n_routed_experts = 2^30 fits every field and the parameter bound, but not in memory.
  const test::CliResult big = train("run",
                                    "--set steps=1 --set model.n_routed_experts=1073741824 "
                                    "--set model.n_group=1 --set model.topk_group=1");
  EXPECT_EQ(big.code, 1);
  EXPECT_NE(big.err.find("GiB of host memory"), std::string::npos) << big.err;
}

TEST_F(TrainSafetyCli, ATextFileWithGlobCharactersInItsNameIsReadAsIs) {
  fs::copy_file(path("corpus.txt"), path("notes [v2].txt"));
  const test::CliResult r = run_octet("train" + std::string(kTiny) + " --set 'data.text=\"" +
                                      path("notes [v2].txt") + "\"' --cache-dir '" + path("cache") +
                                      "' --set run_dir='" + path("run") + "' --set steps=1");
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(TrainSafetyCli, ResumeAndOverwriteTogetherAreRefused) {
  const test::CliResult r = run_octet("train --resume x --overwrite");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("give one of them"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace octet
