// Run directories (train/run_dir.h): the lock, what counts as a run, claiming and replacing one,
// and the clean-up of checkpoint writes that died.
#include "train/run_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/check.h"

namespace octet::train {
namespace {

namespace fs = std::filesystem;

class RunDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("octet_run_dir_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string p(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(RunDir, TheLockIsExclusiveAndReleasedWithItsHolder) {
  {
    const RunDirLock a = lock_run_dir(p("run"));
    EXPECT_TRUE(a.held());
    try {
      lock_run_dir(p("run"));  // another open file description: flock conflicts
      ADD_FAILURE() << "locked twice";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("pid " + std::to_string(::getpid())), std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(lock_run_dir(p("run")).held()) << "not released";
}

TEST_F(RunDir, ARunIsRecognisedByItsFilesAndClaimedOnce) {
  fs::create_directories(p("run"));
  EXPECT_FALSE(holds_run(p("run")));
  std::ofstream(p("run/notes.txt")) << "a stranger's file does not make a run";
  EXPECT_FALSE(holds_run(p("run")));
  const std::string id = start_new_run(p("run"), RunStart::kRefuseExisting);
  EXPECT_EQ(id.size(), 16u);
  EXPECT_EQ(run_id_of(p("run")), id);
  EXPECT_TRUE(holds_run(p("run")));
  EXPECT_THROW(start_new_run(p("run"), RunStart::kRefuseExisting), Error);
  // A run from before run.json: recognised by its metrics.
  fs::create_directories(p("old"));
  std::ofstream(p("old/metrics.jsonl")) << "";
  EXPECT_TRUE(holds_run(p("old")));
  EXPECT_EQ(run_id_of(p("old")), "");
  EXPECT_EQ(ensure_run_record(p("old")).size(), 16u);

  fs::create_directories(p("run/checkpoints/step_00000001"));
  std::ofstream(p("run/config.toml")) << "steps = 1\n";
  std::string removed;
  const std::string id2 = start_new_run(p("run"), RunStart::kOverwrite, &removed);
  EXPECT_NE(id2, id);
  EXPECT_NE(removed.find("checkpoints"), std::string::npos) << removed;
  EXPECT_FALSE(fs::exists(p("run/checkpoints")));
  EXPECT_FALSE(fs::exists(p("run/config.toml")));
  EXPECT_TRUE(fs::exists(p("run/notes.txt")));
}

TEST_F(RunDir, StaleStagingIsRemovedAndCheckpointsKept) {
  for (const char* d :
       {"checkpoints/step_00000002", "checkpoints/step_00000004.partial",
        "checkpoints/step_00000004.partial.tmp.123", "checkpoints/step_00000002.tmp.9"})
    fs::create_directories(p("run/") + d);
  std::ofstream(p("run/checkpoints/latest")) << "step_00000002\n";
  EXPECT_EQ(remove_stale_checkpoint_staging(p("run/checkpoints")), 3);
  EXPECT_TRUE(fs::exists(p("run/checkpoints/step_00000002")));
  EXPECT_TRUE(fs::exists(p("run/checkpoints/latest")));
  EXPECT_EQ(remove_stale_checkpoint_staging(p("nothing")), 0);
}

TEST_F(RunDir, PathsOfRunsAndTheirCheckpoints) {
  EXPECT_EQ(run_dir_of_checkpoint("runs/x/checkpoints/step_00000003"), "runs/x");
  EXPECT_EQ(run_dir_of_checkpoint("runs/x/checkpoints/step_00000003/"), "runs/x");
  EXPECT_EQ(run_dir_of_checkpoint("checkpoints/step_1"), ".");
  EXPECT_EQ(run_dir_of_checkpoint(p("loose_checkpoint")), "");
  EXPECT_EQ(first_free_run_dir(p("runs/default")), p("runs/default"));
  fs::create_directories(p("runs/default"));
  start_new_run(p("runs/default"), RunStart::kRefuseExisting);
  EXPECT_EQ(first_free_run_dir(p("runs/default")), p("runs/default-2"));
}

}  // namespace
}  // namespace octet::train
