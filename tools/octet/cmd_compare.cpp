// `octet compare`: what FP8 cost against a baseline, from the metrics.jsonl of finished (or
// running) training runs. The table answers "did it converge the same, how much faster, how much
// memory"; --out draws the curves with scripts/plot_compare.py (matplotlib), which reads the same
// files.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "core/check.h"
#include "train/metrics.h"
#include "train/progress.h"

extern char** environ;

namespace octet::cli {
namespace {

namespace fs = std::filesystem;

struct Run {
  std::string label;   // the directory as the user wrote it
  std::string recipe;  // from config.toml; "-" when unknown
  train::MetricsSummary summary;
};

// The trainer saves the resolved config as TOML with the recipe as a top-level string key. Only
// that key is needed here, so this reads `recipe = "..."` before the first [table] rather than
// parsing TOML.
std::string read_recipe(const fs::path& run_dir) {
  std::ifstream in(run_dir / "config.toml");
  std::string line;
  while (in && std::getline(in, line)) {
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    if (line[start] == '[') break;  // the end of the top-level keys
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = line.substr(start, eq - start);
    key.erase(key.find_last_not_of(" \t") + 1);
    if (key != "recipe" && key != "\"recipe\"") continue;
    const size_t q0 = line.find_first_of("\"'", eq);
    const size_t q1 = q0 == std::string::npos ? q0 : line.find(line[q0], q0 + 1);
    if (q1 != std::string::npos) return line.substr(q0 + 1, q1 - q0 - 1);
  }
  return "-";
}

Run load_run(const std::string& arg) {
  std::string label = arg;
  while (label.size() > 1 && label.back() == '/') label.pop_back();
  const fs::path dir(label);
  std::error_code ec;
  OCTET_CHECK(fs::exists(dir, ec), label, ": no such run directory");
  OCTET_CHECK(fs::is_directory(dir, ec), label, ": not a directory (expected a run directory)");
  const fs::path metrics = dir / "metrics.jsonl";
  OCTET_CHECK(fs::exists(metrics, ec), metrics.string(),
              ": no such file (is this a training run directory?)");
  const std::vector<train::StepMetrics> records = train::read_metrics(metrics.string());
  OCTET_CHECK(!records.empty(), metrics.string(), ": no metrics records");
  return {label, read_recipe(dir), train::summarize_metrics(records)};
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// |L - L0| / L0 in percent on the validation loss when both runs have one, else the train loss.
std::string relative_error(const Run& run, const Run& ref) {
  const bool val = run.summary.final_val_loss && ref.summary.final_val_loss;
  const double l = val ? *run.summary.final_val_loss : run.summary.final_train_loss;
  const double l0 = val ? *ref.summary.final_val_loss : ref.summary.final_train_loss;
  if (!std::isfinite(l) || !std::isfinite(l0) || l0 == 0) return "n/a";
  return fixed(100.0 * std::fabs(l - l0) / std::fabs(l0), 3) + "% (" + (val ? "val" : "train") +
         ")";
}

void print_table(const std::vector<Run>& runs) {
  std::vector<std::vector<std::string>> table = {{"run", "recipe", "steps", "skipped", "train loss",
                                                  "val loss", "rel err", "tok/s", "peak mem"}};
  for (size_t i = 0; i < runs.size(); ++i) {
    const train::MetricsSummary& s = runs[i].summary;
    table.push_back(
        {runs[i].label, runs[i].recipe, std::to_string(s.last_step), std::to_string(s.skipped),
         fixed(s.final_train_loss, 4), s.final_val_loss ? fixed(*s.final_val_loss, 4) : "-",
         i == 0 ? "(reference)" : relative_error(runs[i], runs[0]),
         train::format_rate(s.mean_tokens_per_s), train::format_bytes(s.peak_mem_bytes)});
  }
  std::vector<size_t> width(table.front().size(), 0);
  for (const auto& row : table)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  constexpr size_t kTextColumns = 2;  // run and recipe left-aligned, numbers right-aligned
  for (const auto& row : table) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      line += (c ? "  " : "") + (c < kTextColumns ? row[c] + pad : pad + row[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  }
  std::printf(
      "\ntrain loss: mean over the last 10%% of the steps that were not skipped (at least the "
      "last)\nval loss: the last evaluation\n"
      "rel err: |L - L0| / L0 against the first run, on val loss where both runs have one, else "
      "train loss\n(DeepSeek-V3 kept FP8 within 0.25%% of BF16)\n"
      "tok/s: mean per step, the first min(%lld, steps/2) steps left out as warm-up\n",
      static_cast<long long>(train::kMaxWarmupRecords));
}

// The script ships in <repo>/scripts and the binary is built in <repo>/<build dir>.
fs::path find_plot_script() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  OCTET_CHECK(!ec, "cannot locate the octet executable (/proc/self/exe): ", ec.message());
  for (const char* rel : {"../scripts/plot_compare.py", "../../scripts/plot_compare.py"}) {
    fs::path p = (exe.parent_path() / rel).lexically_normal();
    if (fs::is_regular_file(p, ec)) return p;
  }
  OCTET_THROW("cannot find scripts/plot_compare.py next to ", exe.parent_path().string(),
              "/.. (it ships with the source tree)");
}

std::string last_line_of(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

// Runs the plot script with the project's venv python (scripts/setup.sh puts matplotlib there),
// else python3 from PATH. Only the last line of its output is reported, so that a failure still
// reads as the one error line the CLI promises.
void plot(const fs::path& script, const std::vector<std::string>& run_dirs,
          const std::string& out) {
  std::error_code ec;
  const fs::path venv = script.parent_path().parent_path() / ".venv" / "bin" / "python";
  const std::string python = fs::exists(venv, ec) ? venv.string() : "python3";
  std::vector<std::string> args = {python, script.string(), "--out", out};
  args.insert(args.end(), run_dirs.begin(), run_dirs.end());
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  // The child's output comes back through a pipe: no log file, so nothing in a shared temporary
  // directory that a planted link could redirect.
  int fds[2];
  OCTET_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "cannot create a pipe: ", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, python.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (err != 0) ::close(fds[0]);
  OCTET_CHECK(err == 0, "cannot run ", python, ": ", std::strerror(err));
  std::string output;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n > 0) output.append(buf, static_cast<size_t>(n));
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const std::string last = last_line_of(output);
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  OCTET_CHECK(ok, "plotting failed (", python, " ", script.filename().string(),
              WIFEXITED(status) ? ", exit status " + std::to_string(WEXITSTATUS(status))
                                : std::string(", killed by a signal"),
              "): ", last.empty() ? "no output" : last);
  OCTET_CHECK(fs::is_regular_file(out, ec) && fs::file_size(out, ec) > 0, out,
              ": the plot script reported success but wrote no file");
  std::printf("\nwrote %s\n", out.c_str());
}

int run_compare(const std::vector<std::string>& argv) {
  const Args args(argv, {"out"}, {"force"});
  args.expect_positional(1, 64, "octet compare RUN_DIR... [--out FILE.png] (see --help)");
  const std::optional<std::string> out = args.get("out");
  fs::path script;
  if (out) {  // checked before any output, so that a bad --out fails alone
    OCTET_CHECK(!out->empty(), "--out needs a file name");
    const fs::path parent = fs::absolute(*out).parent_path();
    std::error_code ec;
    OCTET_CHECK(fs::is_directory(parent, ec), *out, ": directory ", parent.string(),
                " does not exist");
    for (const std::string& dir : args.positional()) {
      refuse_output_over_input((fs::path(dir) / "metrics.jsonl").string(), *out);
      refuse_output_over_input((fs::path(dir) / "config.toml").string(), *out);
    }
    refuse_existing_output(*out, existing_output(args));
    script = find_plot_script();
  }
  std::vector<Run> runs;
  for (const auto& dir : args.positional()) runs.push_back(load_run(dir));
  print_table(runs);
  if (out) plot(script, args.positional(), *out);
  return 0;
}

}  // namespace

Command compare_command() {
  return {"compare", "compare training runs: final losses, relative error, speed, memory, plots",
          "usage: octet compare RUN_DIR... [--out FILE.png [--force]]\n\n"
          "Reads RUN_DIR/metrics.jsonl of each run (and the recipe from RUN_DIR/config.toml when\n"
          "present) and prints one row per run: the last step, skipped steps, the final train\n"
          "loss (mean over the last 10% of the steps), the last validation loss, the relative\n"
          "loss error |L - L0| / L0 against the first run (on val loss where both runs have one),\n"
          "the mean tokens/s after the warm-up steps and the peak memory. Put the baseline\n"
          "(usually the bf16 run) first.\n\n"
          "flags:\n"
          "  --out FILE.png  also draw loss curves, relative loss error against the first run\n"
          "                  (with DeepSeek-V3's 0.25% bound) and tokens/s over the steps, with\n"
          "                  scripts/plot_compare.py (matplotlib: run scripts/setup.sh once)\n"
          "  --force         replace FILE.png when it exists (default: refuse)",
          run_compare};
}

}  // namespace octet::cli
