// `octet compare` end to end on run directories written here by hand: the table's numbers
// (final losses, relative error against the first run, warm-up-free tokens/s, peak memory, the
// recipe from config.toml), one-line errors for missing or empty runs, and the PNG that
// scripts/plot_compare.py draws (skipped where no python with matplotlib is at hand).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "cli_fixture.h"

namespace octet {
namespace {

namespace fs = std::filesystem;

using RunResult = test::CliResult;
using test::slurp;

// One metrics.jsonl record in the trainer's format, written without the library on purpose.
std::string record(int step, double loss, double tok_s, long long mem, double val = NAN) {
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "{\"step\":%d,\"loss\":%.17g,\"lr\":0.0003,\"grad_norm\":0.5,\"tokens_per_s\":%.17g,"
      "\"step_ms\":20.0,\"peak_mem_bytes\":%lld,\"skipped\":false",
      step, loss, tok_s, mem);
  std::string s = buf;
  if (!std::isnan(val)) {
    std::snprintf(buf, sizeof buf, ",\"val_loss\":%.17g", val);
    s += buf;
  }
  return s + "}\n";
}

double loss_at(int step) {
  return 6.0 / (1.0 + 0.02 * step) + 0.01 * std::sin(step);
}

class CompareCliTest : public test::CliFixture {
 protected:
  RunResult run(const std::string& args) const { return run_octet("compare " + args); }

  void expect_failure(const std::string& args, const std::string& fragment) const {
    const RunResult r = run(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("octet compare: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos)
        << "missing '" << fragment << "' in: " << r.err;
  }

  // A 100-step run: loss_at(step) * factor, val every 50 steps, the first 10 steps slow (warm-up).
  void write_run(const std::string& name, const std::string& recipe, double factor, double tok_s,
                 long long mem, bool val = true) const {
    fs::create_directories(dir_ / name);
    if (!recipe.empty())
      std::ofstream(dir_ / name / "config.toml")
          << "# resolved config\nseed = 1\nrecipe = \"" << recipe << "\"  # the preset\n\n"
          << "[model]\nrecipe = \"not-this-one\"\n";
    std::ofstream m(dir_ / name / "metrics.jsonl");
    for (int s = 1; s <= 100; ++s)
      m << record(s, loss_at(s) * factor, s <= 10 ? 1.0 : tok_s, mem * s / 100,
                  val && s % 50 == 0 ? 1.1 * loss_at(s) * factor : NAN);
  }

  // A run of `steps` steps whose losses are the reference's (loss_at) times factor(step), with
  // a validation loss every `val_every` steps and at the last, and a config.toml that this
  // octet parses (recipe, seed, optim.warmup_steps) unless `warmup` < 0.
  void write_scaled(const std::string& name, const std::string& recipe,
                    const std::function<double(int)>& factor, int steps = 100, int val_every = 10,
                    int warmup = -1, int seed = 1234) const {
    fs::create_directories(dir_ / name);
    if (warmup >= 0)
      std::ofstream(dir_ / name / "config.toml")
          << "recipe = \"" << recipe << "\"\nseed = " << seed
          << "\n\n[optim]\nwarmup_steps = " << warmup << "\n";
    std::ofstream m(dir_ / name / "metrics.jsonl");
    for (int s = 1; s <= steps; ++s)
      m << record(s, loss_at(s) * factor(s), 1000, 1 << 20,
                  s % val_every == 0 || s == steps ? 1.1 * loss_at(s) * factor(s) : NAN);
  }

  // The lines of the output from the one that starts with `first` up to the next blank line.
  static std::string section(const std::string& out, const std::string& first) {
    const size_t a = out.find("\n" + first);
    if (a == std::string::npos) return "";
    const size_t b = out.find("\n\n", a + 1);
    return out.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
  }

  // The table row of one run, split on whitespace: in the first table, or with `last` in the
  // last table that has one (the relative-error summary).
  static std::vector<std::string> row(const std::string& out, const std::string& run,
                                      bool last = false) {
    std::istringstream in(out);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    if (last) std::reverse(lines.begin(), lines.end());
    for (const std::string& line : lines) {
      if (line.rfind(run + " ", 0) != 0) continue;
      std::vector<std::string> cells;
      std::istringstream words(line);
      for (std::string w; words >> w;) cells.push_back(w);
      return cells;
    }
    return {};
  }
};

TEST_F(CompareCliTest, TableShowsLossesRelativeErrorSpeedAndMemory) {
  write_run("bf16", "bf16", 1.0, 40000, 4LL << 30);
  write_run("fp8", "deepseek", 1.002, 52300, 3LL << 30);
  const RunResult r = run(path("bf16") + " " + path("fp8") + "/");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");

  double tail = 0;  // mean of the last 10% (10 steps) of the reference run
  for (int s = 91; s <= 100; ++s) tail += loss_at(s) / 10;
  char expected_loss[32];
  std::snprintf(expected_loss, sizeof expected_loss, "%.4f", tail);
  char expected_val[32];
  std::snprintf(expected_val, sizeof expected_val, "%.4f", 1.1 * loss_at(100));

  const auto ref = row(r.out, path("bf16"));
  // run, recipe, steps, skipped, train loss, val loss, rel err, tok/s, peak mem (2 words)
  ASSERT_EQ(ref.size(), 10u) << r.out;
  EXPECT_EQ(ref[1], "bf16");
  EXPECT_EQ(ref[2], "100");
  EXPECT_EQ(ref[3], "0");
  EXPECT_EQ(ref[4], expected_loss);
  EXPECT_EQ(ref[5], expected_val);
  EXPECT_EQ(ref[6], "(reference)");
  EXPECT_EQ(ref[7], "40.0k");  // the slow first 10 steps are warm-up
  EXPECT_EQ(ref[8] + " " + ref[9], "4.0 GiB");

  const auto fp8 = row(r.out, path("fp8"));  // the trailing '/' is dropped from the label
  ASSERT_EQ(fp8.size(), 11u) << r.out;       // rel err is "0.200% (val)"
  EXPECT_EQ(fp8[1], "deepseek");
  EXPECT_EQ(fp8[6] + " " + fp8[7], "0.200% (val)");
  EXPECT_EQ(fp8[8], "52.3k");
  EXPECT_EQ(fp8[9] + " " + fp8[10], "3.0 GiB");

  // The header says how each number is made.
  EXPECT_NE(r.out.find("mean over the last 10% of the steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("warm-up"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0.25%"), std::string::npos) << r.out;
  // No plot unless --out.
  for (const auto& e : fs::directory_iterator(dir_)) EXPECT_NE(e.path().extension(), ".png");
}

TEST_F(CompareCliTest, RelativeErrorFallsBackToTrainLoss) {
  write_run("a", "", 1.0, 1000, 1 << 20);
  write_run("b", "", 1.01, 1000, 1 << 20, /*val=*/false);
  const RunResult r = run(path("a") + " " + path("b"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto b = row(r.out, path("b"));
  ASSERT_EQ(b.size(), 11u) << r.out;
  EXPECT_EQ(b[1], "-");  // no config.toml: recipe unknown
  EXPECT_EQ(b[5], "-");  // no val loss
  EXPECT_EQ(b[6] + " " + b[7], "1.000% (train)");
}

TEST_F(CompareCliTest, ToleratesATornLastLineAndNonFiniteLosses) {
  fs::create_directories(dir_ / "r");
  std::ofstream(dir_ / "r" / "metrics.jsonl")
      << record(1, 5.0, 10, 100) << "{\"step\":2,\"loss\":\"nan\",\"skipped\":true}\n"
      << record(3, 4.0, 10, 100) << "{\"step\":4,\"loss\":3.";
  const RunResult r = run(path("r"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto cells = row(r.out, path("r"));
  ASSERT_EQ(cells.size(), 10u) << r.out;
  EXPECT_EQ(cells[2], "3");       // the torn step 4 is not counted
  EXPECT_EQ(cells[3], "1");       // skipped
  EXPECT_EQ(cells[4], "4.0000");  // the nan loss of the skipped step is left out
}

TEST_F(CompareCliTest, MissingOrEmptyRunsAreOneClearError) {
  expect_failure(path("nope"), path("nope") + ": no such run directory");
  std::ofstream(dir_ / "file") << "x";
  expect_failure(path("file"), path("file") + ": not a directory");
  fs::create_directories(dir_ / "empty");
  write_run("good", "bf16", 1.0, 1000, 1 << 20);
  expect_failure(path("good") + " " + path("empty"),
                 path("empty") + "/metrics.jsonl: no such file");
  std::ofstream(dir_ / "empty" / "metrics.jsonl") << "\n";
  expect_failure(path("empty"), path("empty") + "/metrics.jsonl: no metrics records");
  std::ofstream(dir_ / "empty" / "metrics.jsonl") << "{oops\n" << record(1, 2.0, 1, 1);
  expect_failure(path("empty"), path("empty") + "/metrics.jsonl:1: not valid JSON");
  expect_failure("", "expected 1 to 64 arguments");
  expect_failure(path("good") + " --out " + path("no/such/dir/x.png"), "does not exist");
  expect_failure(path("good") + " --bogus", "unknown flag --bogus");
}

// The relative-error tables: (L - L0) / L0 at every evaluation, signed, the band's column, the
// '*' of an evaluation outside the band, and per run the last error, the largest after the
// warm-up, the train-loss error, the 0.25% verdict and the seed band's.
TEST_F(CompareCliTest, RelativeErrorAtEveryEvaluationAgainstTheSeedBand) {
  write_scaled(
      "bf16", "bf16", [](int) { return 1.0; }, 100, 10, 20);
  write_scaled(
      "close", "deepseek", [](int s) { return s == 70 ? 1.0015 : 1.001; }, 100, 10, 20);
  write_scaled(
      "far", "fp8-tensor-delayed", [](int) { return 1.004; }, 100, 10, 20);
  write_scaled(
      "seed2", "bf16", [](int) { return 0.998; }, 100, 10, 20, 2);
  const RunResult r =
      run(path("bf16") + " " + path("close") + " " + path("far") + " --seed-band " + path("seed2"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("warm-up: steps 1-20 (optim.warmup_steps of " + path("bf16") + ")"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("seed band: " + path("seed2") + " (bf16, seed 2)"), std::string::npos)
      << r.out;

  // One row per evaluation: step, the reference's val loss, then each run and the band.
  const std::string evals = section(r.out, "validation loss at each evaluation");
  ASSERT_FALSE(evals.empty()) << r.out;
  char ref50[32];
  std::snprintf(ref50, sizeof ref50, "%.4f", 1.1 * loss_at(50));
  std::istringstream lines(evals);
  int rows = 0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::vector<std::string> cells;
    for (std::string w; words >> w;) cells.push_back(w);
    if (cells.empty() || cells[0].find_first_not_of("0123456789") != std::string::npos) continue;
    ++rows;
    ASSERT_EQ(cells.size(), 5u) << line;
    EXPECT_EQ(cells[2], cells[0] == "70" ? "+0.150%" : "+0.100%") << line;  // inside the band
    EXPECT_EQ(cells[3], "+0.400%*") << line;  // outside it at every evaluation
    EXPECT_EQ(cells[4], "-0.200%") << line;   // the band itself
    if (cells[0] == "50") EXPECT_EQ(cells[1], ref50) << line;
  }
  EXPECT_EQ(rows, 10) << evals;  // steps 10, 20, ..., 100

  const auto close = row(r.out, path("close"), true);
  // run, recipe, up to step, last val err, max |val err| (3 words), train err, within, band
  ASSERT_EQ(close.size(), 10u) << r.out;
  EXPECT_EQ(close[1], "deepseek");
  EXPECT_EQ(close[2], "100");
  EXPECT_EQ(close[3], "+0.100%");
  EXPECT_EQ(close[4] + " " + close[5] + " " + close[6], "0.150% (step 70)");
  EXPECT_EQ(close[7], "+0.100%");  // the mean train loss of steps 91-100
  EXPECT_EQ(close[8], "yes");
  EXPECT_EQ(close[9], "inside");
  const auto far = row(r.out, path("far"), true);
  ASSERT_EQ(far.size(), 10u) << r.out;
  EXPECT_EQ(far[3], "+0.400%");
  EXPECT_EQ(far[8], "no");
  EXPECT_EQ(far[9], "outside");
  const auto band = row(r.out, path("seed2"), true);
  ASSERT_EQ(band.size(), 11u) << r.out;  // "(the band)" is two words
  EXPECT_EQ(band[3], "-0.200%");
  EXPECT_EQ(band[9] + " " + band[10], "(the band)");
  EXPECT_NE(r.out.find("steps 91-100"), std::string::npos) << r.out;
}

// The largest error leaves the warm-up out (the reference's optim.warmup_steps, or --after); a
// run that was outside 0.25% after the warm-up but ends within it reads "at the end".
TEST_F(CompareCliTest, LargestErrorAfterTheWarmUp) {
  write_scaled(
      "ref", "bf16", [](int) { return 1.0; }, 100, 10, 20);
  write_scaled(
      "run", "deepseek", [](int s) { return s <= 10   ? 1.05
                                            : s == 30 ? 1.003
                                                      : 1.001; }, 100, 10,
      20);
  RunResult r = run(path("ref") + " " + path("run"));
  ASSERT_EQ(r.code, 0) << r.err;
  auto cells = row(r.out, path("run"), true);
  ASSERT_EQ(cells.size(), 12u) << r.out;  // "at the end" is three words; no band: "-"
  EXPECT_EQ(cells[4] + " " + cells[5] + " " + cells[6], "0.300% (step 30)");
  EXPECT_EQ(cells[7], "+0.100%");
  EXPECT_EQ(cells[8] + " " + cells[9] + " " + cells[10], "at the end");
  EXPECT_EQ(cells[11], "-");
  EXPECT_NE(r.out.find("--seed-band RUN_DIR"), std::string::npos) << r.out;

  r = run(path("ref") + " " + path("run") + " --after 0");
  ASSERT_EQ(r.code, 0) << r.err;
  cells = row(r.out, path("run"), true);
  ASSERT_GE(cells.size(), 7u) << r.out;
  EXPECT_EQ(cells[4] + " " + cells[5] + " " + cells[6], "5.000% (step 10)");
  EXPECT_NE(r.out.find("warm-up: steps 1-0 (--after)"), std::string::npos) << r.out;
}

// A run still going is compared over the steps both runs have.
TEST_F(CompareCliTest, ShorterRunIsComparedUpToItsLastStep) {
  write_scaled(
      "ref", "bf16", [](int) { return 1.0; }, 100, 10, 20);
  write_scaled(
      "part", "deepseek", [](int) { return 1.002; }, 60, 10, 20);
  const RunResult r = run(path("ref") + " " + path("part"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(row(r.out, path("part"))[6] + " " + row(r.out, path("part"))[7], "0.200% (val)")
      << r.out;  // the first table too: at step 60, not against the reference's step 100
  const auto cells = row(r.out, path("part"), true);
  ASSERT_EQ(cells.size(), 10u) << r.out;
  EXPECT_EQ(cells[2], "60");
  EXPECT_EQ(cells[3], "+0.200%");
  EXPECT_EQ(cells[7], "+0.200%");
  EXPECT_NE(r.out.find("steps 55-60"), std::string::npos) << r.out;
}

TEST_F(CompareCliTest, MismatchedStepsAreOneClearError) {
  write_scaled(
      "ref", "bf16", [](int) { return 1.0; }, 100, 10, 20);
  write_scaled(
      "every25", "deepseek", [](int) { return 1.0; }, 100, 25, 20);
  expect_failure(path("ref") + " " + path("every25"),
                 path("every25") + ": validation at steps 25, 50, 75, 100 but " + path("ref") +
                     " at 10, 20, 30, 40, 50, 60, ... (10 in all) (first difference: step 25 "
                     "against step 10); compare runs with the same eval.every and steps");
  // The band is held to the same rule.
  expect_failure(path("ref") + " --seed-band " + path("every25"), "validation at steps 25");
  // A run that logged fewer steps in the train-loss window.
  fs::create_directories(dir_ / "gap");
  {
    std::ofstream m(dir_ / "gap" / "metrics.jsonl");
    for (int s = 1; s <= 100; ++s)
      if (s != 95) m << record(s, loss_at(s), 1000, 1, s % 10 == 0 ? 1.1 * loss_at(s) : NAN);
  }
  expect_failure(path("ref") + " " + path("gap"),
                 "train-loss records in the last 10% of the steps at steps 91, 92, 93, 94, 96");
  expect_failure(path("ref") + " --seed-band " + path("nope"), path("nope") + ": no such run");
  expect_failure(path("ref") + " " + path("gap") + " --after -3", "--after must be a step count");
}

TEST_F(CompareCliTest, HelpNamesTheFlags) {
  const RunResult r = run("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("usage: octet compare RUN_DIR... [--seed-band RUN_DIR] [--after STEPS]"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[--out FILE.png [--force]]"), std::string::npos) << r.out;
}

// The python that `octet compare` runs: the project venv beside the build directory, else python3.
bool have_matplotlib() {
  const fs::path venv = fs::path(OCTET_CLI_PATH).parent_path() / ".." / ".venv" / "bin" / "python";
  const std::string python = fs::exists(venv) ? venv.string() : "python3";
  const std::string cmd = "'" + python + "' -c 'import matplotlib' >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST_F(CompareCliTest, OutWritesAPng) {
  if (!have_matplotlib()) GTEST_SKIP() << "no python with matplotlib (scripts/setup.sh makes one)";
  write_run("bf16", "bf16", 1.0, 40000, 4LL << 30);
  write_run("fp8", "deepseek", 1.002, 52300, 3LL << 30);
  write_run("fp8-flow", "fp8-flow", 0.999, 61000, 3LL << 30, /*val=*/false);
  write_run("bf16-seed2", "bf16", 0.998, 40000, 4LL << 30);
  const std::string png = path("cmp.png");
  const RunResult r = run(path("bf16") + " " + path("fp8") + " " + path("fp8-flow") +
                          " --seed-band " + path("bf16-seed2") + " --out " + png);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + png), std::string::npos) << r.out;
  const std::string bytes = slurp(png);
  ASSERT_GT(bytes.size(), 10000u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  // The script's output comes back through a pipe, not a file in the temporary directory (where a
  // planted link could redirect it): a TMPDIR that does not exist changes nothing.
  ::setenv("TMPDIR", path("no_such_tmp").c_str(), 1);
  const RunResult no_tmp = run(path("bf16") + " --out " + path("cmp2.png"));
  ::unsetenv("TMPDIR");
  EXPECT_EQ(no_tmp.code, 0) << no_tmp.err;
  EXPECT_FALSE(fs::exists(path("no_such_tmp")));
  // A failure inside the script is still one error line, with the script's reason.
  fs::create_directories(dir_ / "a_dir.png");
  expect_failure(path("bf16") + " --out " + path("a_dir.png"), "already exists; pass --force");
  expect_failure(path("bf16") + " --out " + path("a_dir.png") + " --force", "plotting failed (");
  expect_failure(path("bf16") + " --out " + path("a_dir.png") + " --force", "Is a directory");
  // The plot never replaces a run's own files.
  expect_failure(path("bf16") + " --out " + path("bf16/metrics.jsonl") + " --force",
                 "writing it would destroy the input");
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
}

}  // namespace
}  // namespace octet
