// The trainer end to end on the CPU, at a tiny size: a run of 2N steps and a run of N steps resumed
// for N more give bit-identical losses; checkpoints keep the last K; a non-finite loss skips the
// step and training goes on; bad inputs fail before any work.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>
#include <utility>

#include "test_util.h"
#include "tiny_model.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace octet::train {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  return test::fresh_temp_dir("trainer", name);
}

std::string write_corpus(const std::string& dir) {
  return test::write_pangram_corpus(dir, 400);
}

TrainConfig tiny(const std::string& run_dir, const std::string& corpus, const std::string& recipe) {
  TrainConfig c;
  for (const char* kv :
       {"steps=6", "checkpoint_every=3", "keep_checkpoints=2", "batch_size=2", "seq_len=16",
        "log_every=1", "eval.every=3", "eval.batches=1", "optim.warmup_steps=2", "device=cpu"})
    apply_set(c, kv);
  for (const char* kv : test::kTinyTrainModelKeys) apply_set(c, kv);
  apply_set(c, "recipe=" + recipe);
  apply_set(c, "run_dir=" + run_dir);
  apply_set(c, "data.text=\"" + corpus + "\"");
  c.validate();
  return c;
}

RunOptions quiet(const std::string& cache) {
  RunOptions o;
  o.cache_dir = cache;
  return o;
}

std::vector<double> losses(const std::string& run_dir) {
  std::vector<double> out;
  for (const StepMetrics& m : read_metrics(run_dir + "/metrics.jsonl")) out.push_back(m.loss);
  return out;
}

class TrainerResume : public ::testing::TestWithParam<const char*> {};

TEST_P(TrainerResume, ResumedRunIsBitIdentical) {
  const std::string dir = temp_dir(std::string("resume_") + GetParam());
  const std::string corpus = write_corpus(dir);
  std::ostringstream log;
  TrainConfig full = tiny(dir + "/full", corpus, GetParam());
  run_training(full, quiet(dir + "/cache"), log);

  TrainConfig half = tiny(dir + "/half", corpus, GetParam());
  apply_set(half, "steps=3");
  run_training(half, quiet(dir + "/cache"), log);
  TrainConfig rest = tiny(dir + "/half", corpus, GetParam());
  RunOptions o = quiet(dir + "/cache");
  o.resume_from = dir + "/half";
  run_training(rest, o, log);

  const std::vector<double> a = losses(dir + "/full"), b = losses(dir + "/half");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(&a[i], &b[i], sizeof(double)), 0)
        << "step " << i + 1 << ": " << a[i] << " vs " << b[i];
  EXPECT_LT(a.back(), a.front()) << "the loss did not fall";
  // keep_checkpoints = 2: steps 3 and 6 remain, and latest names 6.
  EXPECT_TRUE(fs::exists(dir + "/full/checkpoints/step_00000006/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir + "/full/checkpoints/step_00000003/optimizer.safetensors"));
  std::ifstream latest(dir + "/full/checkpoints/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_00000006");
  fs::remove_all(dir);
}

// metrics.jsonl carries the routed path's casts per MoE layer and forward + backward, as counted
// in the ops: fp8-flow's two explicit quantizations (x and dy) and deepseek's five; both run the
// fused SwiGLU quantization twice (forward, and the backward's recomputation, model/moe.h), the
// forward's pass writing gu's FP8 copy too (moe_swiglu_input fp8), and fp8-flow's dSwiGLU quantizes
// its output in the same kernel.
TEST(Trainer, MetricsCountTheMoeCasts) {
  const std::string dir = temp_dir("casts");
  const std::string corpus = write_corpus(dir);
  std::ostringstream log;
  for (const auto& [recipe, quantize, fused] :
       {std::tuple{"fp8-flow", 2.0, 4.0}, std::tuple{"deepseek", 5.0, 3.0}}) {
    TrainConfig c = tiny(dir + "/" + recipe, corpus, recipe);
    apply_set(c, "steps=2");
    apply_set(c, "grad_accum=2");
    run_training(c, quiet(dir + "/cache"), log);
    const std::vector<StepMetrics> m = read_metrics(dir + "/" + recipe + "/metrics.jsonl");
    ASSERT_EQ(m.size(), 2u);
    for (const StepMetrics& s : m) {
      EXPECT_EQ(s.moe_casts.at("quantize"), quantize) << recipe;
      EXPECT_EQ(s.moe_casts.at("fused_quantize"), fused) << recipe;
      EXPECT_EQ(s.moe_casts.at("dequantize"), 0.0) << recipe;
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Recipes, TrainerResume,
                         ::testing::Values("bf16", "deepseek", "fp8-tensor-delayed", "fp8-flow"));

// optim.fused_prepare (the optimizer writes the next step's GEMM weights) gives the bits of a
// separate preparation: the same losses and gradient norms, including across a spike rollback
// (which reloads the weights), with the BF16 copies only (fused_prepare_fp8 = false) and with the
// FP8 128x128 blocks written by the same pass (the default), which a resume may switch. Width 128
// so the stacked experts' down projection is fused too.
TEST(Trainer, FusedWeightPreparationIsBitIdentical) {
  EXPECT_TRUE(TrainConfig{}.optim.fused_prepare);
  EXPECT_TRUE(TrainConfig{}.optim.fused_prepare_fp8);
  // The same bits either way, so a resume may switch them (a run saved with the old default).
  EXPECT_TRUE(resume_may_change("optim.fused_prepare"));
  EXPECT_TRUE(resume_may_change("optim.fused_prepare_fp8"));
  const std::string dir = temp_dir("fused");
  const std::string corpus = write_corpus(dir);
  for (const char* recipe : {"deepseek", "fp8-flow", "bf16"}) {
    std::vector<std::vector<StepMetrics>> runs;
    // (fused_prepare, fused_prepare_fp8): separate, BF16 copies only, the default.
    for (const auto& [fused, fp8] :
         {std::pair{"false", "false"}, std::pair{"true", "false"}, std::pair{"true", "true"}}) {
      TrainConfig c = tiny(dir + "/" + recipe + fused + fp8, corpus, recipe);
      apply_set(c, "model.hidden_size=128");
      apply_set(c, std::string("optim.fused_prepare=") + fused);
      apply_set(c, std::string("optim.fused_prepare_fp8=") + fp8);
      apply_set(c, "safety.spike_window=2");
      apply_set(c, "safety.spike_threshold=0.0001");
      apply_set(c, "safety.spike_action=\"rollback\"");
      c.validate();
      std::ostringstream log;
      run_training(c, quiet(dir + "/cache"), log);
      runs.push_back(read_metrics(c.run_dir + "/metrics.jsonl"));
    }
    for (size_t r = 1; r < runs.size(); ++r) {
      ASSERT_EQ(runs[0].size(), runs[r].size()) << recipe;
      for (size_t k = 0; k < runs[0].size(); ++k) {
        EXPECT_EQ(runs[0][k].loss, runs[r][k].loss) << recipe << " run " << r << " step " << k;
        EXPECT_EQ(runs[0][k].grad_norm, runs[r][k].grad_norm)
            << recipe << " run " << r << " step " << k;
      }
    }
  }
  fs::remove_all(dir);
}

// The recipe's overrides are part of the run: written into every checkpoint's config.json
// (octet_recipe_overrides, what `octet eval` reads), kept by a resume, and a resume that would
// change them is refused.
TEST(Trainer, RecipeOverridesTravelWithTheRunAndItsCheckpoints) {
  const std::string dir = temp_dir("overrides");
  const std::string corpus = write_corpus(dir);
  std::ostringstream log;
  const std::vector<std::string> overrides = {"gemm.attn.out=bf16", "attn_out_input=bf16"};
  TrainConfig c = tiny(dir + "/run", corpus, "deepseek");
  apply_set(c, R"(recipe_overrides=["gemm.attn.out=bf16", "attn_out_input=bf16"])");
  apply_set(c, "steps=3");
  c.validate();
  run_training(c, quiet(dir + "/cache"), log);
  const ModelConfig saved = read_model_config(dir + "/run/checkpoints/step_00000003/config.json");
  EXPECT_EQ(saved.recipe, (RecipeSpec{"deepseek", overrides}));
  EXPECT_EQ(resolve_recipe(saved.recipe).at(GemmSite::kAttnOut).precision, GemmPrecision::kBf16);

  TrainConfig rest = c;
  apply_set(rest, "steps=4");
  RunOptions o = quiet(dir + "/cache");
  o.resume_from = dir + "/run";
  TrainConfig other = rest;
  apply_set(other, "recipe_overrides=gemm.attn.out=bf16");
  EXPECT_THROW(run_training(other, o, log), Error);
  run_training(rest, o, log);
  EXPECT_EQ(losses(dir + "/run").size(), 4u);
  EXPECT_EQ(read_model_config(dir + "/run/checkpoints/step_00000004/config.json").recipe,
            (RecipeSpec{"deepseek", overrides}));
  fs::remove_all(dir);
}

TEST(Trainer, NonFiniteLossSkipsTheStepAndGoesOn) {
  const std::string dir = temp_dir("nan");
  const std::string corpus = write_corpus(dir);
  TrainConfig c = tiny(dir + "/run", corpus, "bf16");
  // An absurd rate blows the weights up after the first update; later steps are non-finite.
  apply_set(c, "optim.lr=1e30");
  apply_set(c, "optim.grad_clip=0");
  apply_set(c, "optim.weight_decay=0");
  std::ostringstream log;
  const RunResult r = run_training(c, quiet(dir + "/cache"), log);
  EXPECT_EQ(r.steps_done, 6);
  EXPECT_GT(r.skipped_steps, 0);
  EXPECT_EQ(r.end, RunEnd::kDiverged) << "the last loss is not finite";
  bool logged = false;
  for (const StepMetrics& m : read_metrics(dir + "/run/metrics.jsonl"))
    if (m.skipped) logged = !m.skip_reason.empty();
  EXPECT_TRUE(logged);
  EXPECT_NE(log.str().find("update skipped"), std::string::npos) << log.str();
  fs::remove_all(dir);
}

// checkpoint_every = -1 (a benchmark): the run trains and writes no checkpoint, not even the last.
TEST(Trainer, CheckpointsOffWritesNone) {
  const std::string dir = temp_dir("nockpt");
  const std::string corpus = write_corpus(dir);
  TrainConfig c = tiny(dir + "/run", corpus, "bf16");
  apply_set(c, "checkpoint_every=-1");
  c.validate();
  std::ostringstream log;
  const RunResult r = run_training(c, quiet(dir + "/cache"), log);
  EXPECT_EQ(r.steps_done, 6);
  EXPECT_EQ(losses(dir + "/run").size(), 6u);
  EXPECT_FALSE(fs::exists(dir + "/run/checkpoints") && !fs::is_empty(dir + "/run/checkpoints"))
      << log.str();
  TrainConfig bad = c;
  bad.checkpoint_every = -2;
  EXPECT_THROW(bad.validate(), Error);
  fs::remove_all(dir);
}

TEST(Trainer, BadInputsFailBeforeAnyWork) {
  const std::string dir = temp_dir("bad");
  const std::string corpus = write_corpus(dir);
  std::ostringstream log;
  TrainConfig missing = tiny(dir + "/run", dir + "/no_such_file.txt", "bf16");
  EXPECT_THROW(run_training(missing, quiet(dir + "/cache"), log), Error);
  EXPECT_FALSE(fs::exists(dir + "/run/metrics.jsonl"));
  TrainConfig unwritable = tiny("/proc/octet_cannot_write_here", corpus, "bf16");
  try {
    run_training(unwritable, quiet(dir + "/cache"), log);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run_dir"), std::string::npos) << e.what();
  }
  RunOptions bad_resume = quiet(dir + "/cache");
  bad_resume.resume_from = dir;  // a directory without checkpoints
  EXPECT_THROW(run_training(tiny(dir + "/run2", corpus, "bf16"), bad_resume, log), Error);
  fs::remove_all(dir);
}

// Paper cuts of a first trial run: a text too small for the validation split trains without
// validation, and steps below optim.warmup_steps shorten the warm-up; each says so in a note.
TEST(Trainer, ShortTrialRunsTrainWithNotes) {
  const std::string dir = temp_dir("short");
  std::ofstream(dir + "/small.txt") << "A small text of a few hundred bytes, far under the twenty "
                                       "kilobytes that the default validation split of five "
                                       "percent needs for one batch of validation. It still "
                                       "trains: the run says why it skips validation.\n";
  TrainConfig c = tiny(dir + "/run", dir + "/small.txt", "bf16");
  apply_set(c, "steps=3");
  apply_set(c, "optim.warmup_steps=20");
  c.validate();
  std::ostringstream log;
  const RunResult r = run_training(c, quiet(dir + "/cache"), log);
  EXPECT_EQ(r.steps_done, 3);
  EXPECT_TRUE(std::isnan(r.final_val_loss));
  EXPECT_NE(log.str().find("note: the validation data has"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("training without validation"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("warm-up is shortened to all 3 steps"), std::string::npos) << log.str();
  fs::remove_all(dir);
}

// A constant, far too high rate makes the loss jump around; with a short window and a low
// threshold some steps are spikes. The losses are deterministic, so the outcome is too.
TrainConfig spiky(const std::string& run_dir, const std::string& corpus, const char* action) {
  TrainConfig c = tiny(run_dir, corpus, "bf16");
  for (const char* kv :
       {"steps=10", "optim.warmup_steps=0", "optim.lr=1.0", "optim.schedule=constant",
        "safety.spike_window=3", "safety.spike_threshold=1", "checkpoint_every=2", "eval.every=0"})
    apply_set(c, kv);
  apply_set(c, std::string("safety.spike_action=") + action);
  c.validate();
  return c;
}

TEST(Trainer, LossSpikesAreSkippedOrRolledBack) {
  const std::string dir = temp_dir("spike");
  const std::string corpus = write_corpus(dir);
  std::ostringstream skip_log, rollback_log;
  const RunResult r =
      run_training(spiky(dir + "/skip", corpus, "skip"), quiet(dir + "/cache"), skip_log);
  EXPECT_GT(r.skipped_steps, 0) << skip_log.str();
  int spikes = 0;
  for (const StepMetrics& m : read_metrics(dir + "/skip/metrics.jsonl"))
    spikes += m.skipped && m.skip_reason == "loss spike";
  EXPECT_GT(spikes, 0);
  run_training(spiky(dir + "/rollback", corpus, "rollback"), quiet(dir + "/cache"), rollback_log);
  EXPECT_NE(rollback_log.str().find("rolled back to"), std::string::npos) << rollback_log.str();
  const std::vector<StepMetrics> records = read_metrics(dir + "/rollback/metrics.jsonl");
  ASSERT_EQ(records.size(), 10u) << "one record per step, the re-run steps replacing the old ones";
  for (size_t i = 0; i < records.size(); ++i)
    EXPECT_EQ(records[i].step, static_cast<int64_t>(i + 1));
  fs::remove_all(dir);
}

// The lines of `log` that report a rollback.
std::vector<std::string> rollback_lines(const std::string& log) {
  std::vector<std::string> out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.find("rolled back to") != std::string::npos) out.push_back(line);
  return out;
}

// A spike soon after a resume from an earlier checkpoint rolls back to that checkpoint, not to
// the one `latest` names: that one is of the stretch the resume abandoned (issue 13: a rollback
// loaded the weights of a later step, and the run reported more steps than it ran).
TEST(Trainer, ASpikeAfterAResumeRollsBackWithinTheResumedStretch) {
  const std::string dir = temp_dir("spike_resume");
  const std::string corpus = write_corpus(dir);
  TrainConfig c = spiky(dir + "/run", corpus, "rollback");
  apply_set(c, "keep_checkpoints=0");
  std::ostringstream first;
  run_training(c, quiet(dir + "/cache"), first);
  ASSERT_FALSE(rollback_lines(first.str()).empty()) << "no spike to test with:\n" << first.str();
  ASSERT_TRUE(fs::exists(dir + "/run/checkpoints/step_00000010"));

  // Back to step 2, writing no checkpoint before the end: the resumed run repeats the first one
  // bit for bit up to its first spike, which must roll back to step 2 (latest names step 10).
  TrainConfig again = c;
  apply_set(again, "checkpoint_every=0");
  RunOptions o = quiet(dir + "/cache");
  o.resume_from = dir + "/run/checkpoints/step_00000002";
  std::ostringstream second;
  const RunResult r = run_training(again, o, second);
  const std::vector<std::string> rollbacks = rollback_lines(second.str());
  ASSERT_FALSE(rollbacks.empty()) << second.str();
  for (const std::string& line : rollbacks)
    EXPECT_NE(line.find("step_00000002"), std::string::npos) << line;
  EXPECT_EQ(r.steps_done, 10);
  const std::vector<StepMetrics> records = read_metrics(dir + "/run/metrics.jsonl");
  ASSERT_EQ(records.size(), 10u);
  for (size_t i = 0; i < records.size(); ++i)
    EXPECT_EQ(records[i].step, static_cast<int64_t>(i + 1));
  fs::remove_all(dir);
}

// A stop asked for before the first step (a signal during start-up) still leaves a run that
// --resume continues: the state the run starts from is written as step 0, and the resumed run's
// losses are an uninterrupted run's, bit for bit. (It used to write no checkpoint, and say
// "continue with --resume" for a run that --resume refused.)
TEST(Trainer, AStopBeforeTheFirstStepLeavesARunThatResumes) {
  const std::string dir = temp_dir("early_stop");
  const std::string corpus = write_corpus(dir);
  std::ostringstream log;
  const TrainConfig c = tiny(dir + "/run", corpus, "bf16");
  const std::atomic<int> stop{15};
  RunOptions o = quiet(dir + "/cache");
  o.stop = &stop;
  const RunResult r = run_training(c, o, log);
  EXPECT_EQ(r.end, RunEnd::kInterrupted);
  EXPECT_EQ(r.steps_done, 0);
  EXPECT_EQ(r.last_checkpoint, dir + "/run/checkpoints/step_00000000");
  RunOptions again = quiet(dir + "/cache");
  again.resume_from = dir + "/run";
  EXPECT_EQ(run_training(c, again, log).end, RunEnd::kCompleted);
  run_training(tiny(dir + "/full", corpus, "bf16"), quiet(dir + "/cache"), log);
  const std::vector<double> a = losses(dir + "/full"), b = losses(dir + "/run");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(&a[i], &b[i], sizeof(double)), 0) << "step " << i + 1;
  fs::remove_all(dir);
}

TEST(Trainer, ShadowBf16LogsTheLossGap) {
  const std::string dir = temp_dir("shadow");
  const std::string corpus = write_corpus(dir);
  TrainConfig c = tiny(dir + "/run", corpus, "deepseek");
  apply_set(c, "safety.shadow_bf16=2");
  std::ostringstream log;
  run_training(c, quiet(dir + "/cache"), log);
  int shadows = 0;
  for (const StepMetrics& m : read_metrics(dir + "/run/metrics.jsonl")) {
    EXPECT_EQ(m.shadow_bf16_loss.has_value(), m.step % 2 == 0) << "step " << m.step;
    if (!m.shadow_bf16_loss) continue;
    ++shadows;
    ASSERT_TRUE(m.shadow_gap.has_value());
    EXPECT_LT(std::fabs(*m.shadow_gap), 0.05) << "step " << m.step;  // FP8 vs BF16, same weights
    EXPECT_NE(*m.shadow_gap, 0.0) << "the shadow ran in the FP8 recipe?";
  }
  EXPECT_EQ(shadows, 3);
  // Logging steps carry the per-site numerics of the FP8 sites.
  const StepMetrics first = read_metrics(dir + "/run/metrics.jsonl").front();
  ASSERT_TRUE(first.sites.count("attn.q_down.x")) << "no site statistics on a logging step";
  EXPECT_GT(first.sites.at("attn.q_down.x").amax, 0.0);
  fs::remove_all(dir);
}

// Gradient accumulation: two micro-batches of one sequence make the same step as one batch of two
// (the sampler hands out the same windows in the same order); only the order of the FP32 sums in
// the weight gradients differs.
TEST(Trainer, GradientAccumulationMatchesOneLargerBatch) {
  const std::string dir = temp_dir("accum");
  const std::string corpus = write_corpus(dir);
  std::ostringstream log;
  TrainConfig big = tiny(dir + "/big", corpus, "bf16");
  TrainConfig accum = tiny(dir + "/accum", corpus, "bf16");
  apply_set(accum, "batch_size=1");
  apply_set(accum, "grad_accum=2");
  run_training(big, quiet(dir + "/cache"), log);
  run_training(accum, quiet(dir + "/cache"), log);
  const std::vector<double> a = losses(dir + "/big"), b = losses(dir + "/accum");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-3 * a[i]) << "step " << i + 1;
  // AdamW and clipping do not see a wrong gradient scale; the recorded norm (before clipping) does.
  const auto ma = read_metrics(dir + "/big/metrics.jsonl"),
             mb = read_metrics(dir + "/accum/metrics.jsonl");
  for (size_t i = 0; i < ma.size(); ++i)
    EXPECT_NEAR(ma[i].grad_norm, mb[i].grad_norm, 2e-3 * ma[i].grad_norm) << "step " << i + 1;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace octet::train
