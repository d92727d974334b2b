// `octet compare`: what FP8 cost against a baseline, from the metrics.jsonl of finished (or
// running) training runs. The first table answers "did it converge the same, how much faster, how
// much memory"; the relative-error tables answer "by how much, at every evaluation, and is that
// more than a second seed of the baseline moves" (issue 17: DeepSeek-V3's 0.25% bound needs a
// comparison that resolves it); --out draws the curves with scripts/plot_compare.py (matplotlib),
// which reads the same files.
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
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "core/check.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/train_config.h"

extern char** environ;

namespace octet::cli {
namespace {

namespace fs = std::filesystem;

struct Run {
  std::string label;   // the directory as the user wrote it
  std::string recipe;  // from config.toml; "-" when unknown
  // From config.toml when it parses as this octet's training config: the warm-up and the seed.
  std::optional<int64_t> warmup_steps, seed;
  std::vector<train::StepMetrics> records;
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

// The warm-up and seed of a run's saved config; nothing when the file is missing or was written
// by a version of octet whose keys this one does not take (the recipe still comes from
// read_recipe then).
void read_config(const fs::path& run_dir, Run& run) {
  std::ifstream f(run_dir / "config.toml");
  if (!f) return;
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  try {
    const train::TrainConfig c =
        train::parse_train_config(text, (run_dir / "config.toml").string());
    run.warmup_steps = c.optim.warmup_steps;
    run.seed = c.seed;
  } catch (const std::exception&) {
  }
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
  Run run{label, read_recipe(dir), {}, {}, train::read_metrics(metrics.string()), {}};
  OCTET_CHECK(!run.records.empty(), metrics.string(), ": no metrics records");
  run.summary = train::summarize_metrics(run.records);
  read_config(dir, run);
  return run;
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::vector<std::pair<int64_t, double>> val_losses(const Run& run, int64_t end) {
  std::vector<std::pair<int64_t, double>> v;
  for (const auto& m : run.records)
    if (m.val_loss && m.step <= end) v.emplace_back(m.step, *m.val_loss);
  return v;
}

// Mean loss of the applied steps with a finite loss in [first, end].
double window_mean(const Run& run, int64_t first, int64_t end) {
  double sum = 0;
  int64_t n = 0;
  for (const auto& m : run.records)
    if (m.step >= first && m.step <= end && !m.skipped && std::isfinite(m.loss)) {
      sum += m.loss;
      ++n;
    }
  return n > 0 ? sum / static_cast<double>(n) : std::nan("");
}

// The first step of the last 10% of `end` steps (at least the last step).
int64_t tail_window_first(int64_t end) {
  return end - std::max<int64_t>(1, end / 10) + 1;
}

// |L - L0| / L0 in percent over the steps both runs reached: on the last validation loss when both
// runs evaluated at that step, else on the mean train loss of the last 10% of those steps.
std::string relative_error(const Run& run, const Run& ref) {
  const int64_t end = std::min(run.summary.last_step, ref.summary.last_step);
  const auto v = val_losses(run, end);
  const auto v0 = val_losses(ref, end);
  const bool val = !v.empty() && !v0.empty() && v.back().first == v0.back().first;
  const int64_t first = tail_window_first(end);
  const double l = val ? v.back().second : window_mean(run, first, end);
  const double l0 = val ? v0.back().second : window_mean(ref, first, end);
  if (!std::isfinite(l) || !std::isfinite(l0) || l0 == 0) return "n/a";
  return fixed(100.0 * std::fabs(l - l0) / std::fabs(l0), 3) + "% (" + (val ? "val" : "train") +
         ")";
}

// Columns padded to their widest cell: the first `text_columns` left-aligned, the rest (numbers)
// right-aligned.
void print_rows(const std::vector<std::vector<std::string>>& table, size_t text_columns) {
  std::vector<size_t> width(table.front().size(), 0);
  for (const auto& row : table)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (const auto& row : table) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      line += (c ? "  " : "") + (c < text_columns ? row[c] + pad : pad + row[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  }
}

void print_table(const std::vector<Run>& runs) {
  std::vector<std::vector<std::string>> table = {{"run", "recipe", "steps", "skipped", "train loss",
                                                  "val loss", "rel err", "tok/s", "peak mem"}};
  for (size_t i = 0; i < runs.size(); ++i) {
    const train::MetricsSummary& s = runs[i].summary;
    table.push_back({printable(runs[i].label), runs[i].recipe, std::to_string(s.last_step),
                     std::to_string(s.skipped), fixed(s.final_train_loss, 4),
                     s.final_val_loss ? fixed(*s.final_val_loss, 4) : "-",
                     i == 0 ? "(reference)" : relative_error(runs[i], runs[0]),
                     train::format_rate(s.mean_tokens_per_s),
                     train::format_bytes(s.peak_mem_bytes)});
  }
  print_rows(table, 2);  // run and recipe left-aligned, numbers right-aligned
  std::printf(
      "\ntrain loss: mean over the last 10%% of the steps that were not skipped (at least the "
      "last)\nval loss: the last evaluation\n"
      "rel err: |L - L0| / L0 against the first run, on val loss where both runs have one, else "
      "train loss\n(DeepSeek-V3 kept FP8 within 0.25%% of BF16)\n"
      "tok/s: mean per step, the first min(%lld, steps/2) steps left out as warm-up\n",
      static_cast<long long>(train::kMaxWarmupRecords));
}

// ---------------------------------------------------------------------------------------------
// Relative error against the first run, at every evaluation, and the seed band.

// DeepSeek-V3 report: FP8 training stayed within 0.25% relative loss error of BF16.
constexpr double kDeepSeekV3BoundPercent = 0.25;

// Signed relative error in percent, (l - l0) / l0: negative when the run's loss is lower.
double rel_percent(double l, double l0) {
  if (!std::isfinite(l) || !std::isfinite(l0) || l0 == 0) return std::nan("");
  return 100.0 * (l - l0) / std::fabs(l0);
}

std::string signed_percent(double v) {
  if (!std::isfinite(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%+.3f%%", v);
  return buf;
}

std::string steps_text(const std::vector<int64_t>& steps) {
  constexpr size_t kShown = 6;
  std::string s;
  for (size_t i = 0; i < std::min(steps.size(), kShown); ++i)
    s += (i ? ", " : "") + std::to_string(steps[i]);
  if (steps.size() > kShown) s += ", ... (" + std::to_string(steps.size()) + " in all)";
  return steps.empty() ? "no steps" : s;
}

struct ValPoint {
  int64_t step = 0;
  double ref = 0, loss = 0, err = 0;  // err: rel_percent(loss, ref)
};

// One run against the reference, over the steps both have reached.
struct Comparison {
  int64_t end = 0;            // the last step both runs have
  std::vector<ValPoint> val;  // every evaluation at or before `end`
  int64_t window_first = 0;   // the train-loss window: steps [window_first, end]
  double train_ref = 0, train_loss = 0, train_err = 0;
  std::optional<ValPoint> worst;  // the largest |err| after the warm-up
};

std::vector<int64_t> record_steps(const Run& run, int64_t first, int64_t end) {
  std::vector<int64_t> steps;
  for (const auto& m : run.records)
    if (m.step >= first && m.step <= end) steps.push_back(m.step);
  return steps;
}

// Throws naming both runs and the first step where their lists part when `a` and `b` differ.
void require_same_steps(const std::vector<int64_t>& a, const Run& run,
                        const std::vector<int64_t>& b, const Run& ref, const std::string& what,
                        const std::string& setting) {
  if (a == b) return;
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const std::string at_a = i < a.size() ? "step " + std::to_string(a[i]) : "nothing";
  const std::string at_b = i < b.size() ? "step " + std::to_string(b[i]) : "nothing";
  OCTET_THROW(printable(run.label), ": ", what, " at steps ", steps_text(a), " but ",
              printable(ref.label), " at ", steps_text(b), " (first difference: ", at_a,
              " against ", at_b, "); compare runs with the same ", setting);
}

// Fills in the train-loss error of a comparison over the last 10% of its common steps.
Comparison with_train_error(const Run& run, const Run& ref, Comparison c) {
  c.window_first = tail_window_first(c.end);
  require_same_steps(record_steps(run, c.window_first, c.end), run,
                     record_steps(ref, c.window_first, c.end), ref,
                     "train-loss records in the last 10% of the steps", "steps and resumes");
  c.train_loss = window_mean(run, c.window_first, c.end);
  c.train_ref = window_mean(ref, c.window_first, c.end);
  c.train_err = rel_percent(c.train_loss, c.train_ref);
  return c;
}

Comparison compare(const Run& run, const Run& ref, int64_t warmup) {
  Comparison c;
  c.end = std::min(run.summary.last_step, ref.summary.last_step);
  const auto val = val_losses(run, c.end);
  const auto val_ref = val_losses(ref, c.end);
  auto steps_of = [](const auto& v) {
    std::vector<int64_t> s;
    s.reserve(v.size());
    for (const auto& [step, loss] : v) s.push_back(step);
    return s;
  };
  // A run without evaluations (eval.every = 0) is compared on the train loss alone; two runs that
  // both evaluated must have done so at the same steps.
  if (!val.empty() && !val_ref.empty())
    require_same_steps(steps_of(val), run, steps_of(val_ref), ref, "validation",
                       "eval.every and steps");
  else
    return with_train_error(run, ref, c);
  for (size_t i = 0; i < val.size(); ++i) {
    const ValPoint p{val[i].first, val_ref[i].second, val[i].second,
                     rel_percent(val[i].second, val_ref[i].second)};
    c.val.push_back(p);
    if (p.step > warmup && std::isfinite(p.err) &&
        (!c.worst || std::fabs(p.err) > std::fabs(c.worst->err)))
      c.worst = p;
  }
  return with_train_error(run, ref, c);
}

// Inside the seed band: the run's error is no larger than the second seed's, both at the last
// evaluation and at the worst evaluation after the warm-up (on the train loss when there is no
// validation). A single second seed is a small sample of the seed-to-seed spread, so "outside"
// means "larger than one reseeding moved the baseline", not a significance test.
std::string band_verdict(const Comparison& c, const Comparison& band) {
  if (!c.val.empty() && !band.val.empty()) {
    const bool last = std::fabs(c.val.back().err) <= std::fabs(band.val.back().err);
    const bool worst =
        !c.worst || (band.worst && std::fabs(c.worst->err) <= std::fabs(band.worst->err));
    return last && worst ? "inside" : "outside";
  }
  if (!std::isfinite(c.train_err) || !std::isfinite(band.train_err)) return "n/a";
  return std::fabs(c.train_err) <= std::fabs(band.train_err) ? "inside" : "outside";
}

void print_relative_errors(const std::vector<Run>& runs, const std::optional<Run>& band_run,
                           int64_t warmup, const std::string& warmup_source) {
  const Run& ref = runs[0];
  std::vector<const Run*> others;
  for (size_t i = 1; i < runs.size(); ++i) others.push_back(&runs[i]);
  if (band_run) others.push_back(&*band_run);
  std::vector<Comparison> cmp;
  cmp.reserve(others.size());
  for (const Run* r : others) cmp.push_back(compare(*r, ref, warmup));
  const std::optional<Comparison> band =
      band_run ? std::optional<Comparison>(cmp.back()) : std::nullopt;

  std::printf("\nrelative loss error (L - L0) / L0 against %s; warm-up: steps 1-%lld (%s)\n",
              printable(ref.label).c_str(), static_cast<long long>(warmup), warmup_source.c_str());
  if (band_run)
    std::printf("seed band: %s (%s%s) against %s\n", printable(band_run->label).c_str(),
                band_run->recipe.c_str(),
                band_run->seed ? (", seed " + std::to_string(*band_run->seed)).c_str() : "",
                printable(ref.label).c_str());

  bool any_val = false;
  for (const auto& c : cmp) any_val = any_val || !c.val.empty();
  if (any_val) {
    std::printf("\nvalidation loss at each evaluation%s\n",
                band ? " (* : outside the seed band at that evaluation)" : "");
    std::vector<std::vector<std::string>> t = {{"step", "val loss (ref)"}};
    for (const Run* r : others)
      t[0].push_back(printable(r->label) + (band_run && r == &*band_run ? " (band)" : ""));
    size_t rows = 0;
    for (const auto& c : cmp) rows = std::max(rows, c.val.size());
    for (size_t i = 0; i < rows; ++i) {
      const Comparison* longest = &cmp.front();
      for (const auto& c : cmp)
        if (c.val.size() > longest->val.size()) longest = &c;
      std::vector<std::string> row = {std::to_string(longest->val[i].step),
                                      fixed(longest->val[i].ref, 4)};
      for (size_t k = 0; k < cmp.size(); ++k) {
        if (i >= cmp[k].val.size()) {
          row.emplace_back("-");
          continue;
        }
        const double e = cmp[k].val[i].err;
        const bool outside = band && i < band->val.size() && k + 1 < cmp.size() &&
                             std::fabs(e) > std::fabs(band->val[i].err);
        row.push_back(signed_percent(e) + (outside ? "*" : ""));
      }
      t.push_back(row);
    }
    print_rows(t, 0);
  }

  std::printf("\n");
  std::vector<std::vector<std::string>> t = {{"run", "recipe", "up to step", "last val err",
                                              "max |val err| after warm-up", "train err",
                                              "within 0.25%", "seed band"}};
  for (size_t k = 0; k < cmp.size(); ++k) {
    const Comparison& c = cmp[k];
    const bool is_band = band_run && k + 1 == cmp.size();
    const double last = c.val.empty() ? c.train_err : c.val.back().err;
    std::string within = "n/a";
    if (std::isfinite(last)) {
      const double worst = c.worst ? std::fabs(c.worst->err) : std::fabs(last);
      within = std::fabs(last) <= kDeepSeekV3BoundPercent
                   ? (worst <= kDeepSeekV3BoundPercent ? "yes" : "at the end")
                   : "no";
    }
    t.push_back({printable(others[k]->label), others[k]->recipe, std::to_string(c.end),
                 c.val.empty() ? "-" : signed_percent(c.val.back().err),
                 c.worst ? fixed(std::fabs(c.worst->err), 3) + "% (step " +
                               std::to_string(c.worst->step) + ")"
                         : "-",
                 signed_percent(c.train_err), within,
                 is_band ? "(the band)"
                 : band  ? band_verdict(c, *band)
                         : "-"});
  }
  print_rows(t, 2);
  std::printf(
      "\nlast val err: at the last evaluation both runs reached; max |val err|: the largest over the "
      "evaluations after the warm-up\ntrain err: on the mean train loss of steps %lld-%lld (the "
      "last 10%% of the steps both runs reached)\nwithin 0.25%%: DeepSeek-V3's bound for FP8 "
      "against BF16, on the last val err (train err without validation); \"at the end\": the last "
      "is within, an earlier one was not\n",
      static_cast<long long>(cmp.front().window_first), static_cast<long long>(cmp.front().end));
  if (band)
    std::printf(
        "seed band: inside when |last val err| and max |val err| are no larger than the second "
        "seed's (on train err without validation)\n");
  else
    std::printf("seed band: give a second seed of the reference recipe with --seed-band RUN_DIR\n");
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
          const std::optional<std::string>& band_dir, int64_t warmup, const std::string& out) {
  std::error_code ec;
  const fs::path venv = script.parent_path().parent_path() / ".venv" / "bin" / "python";
  const std::string python = fs::exists(venv, ec) ? venv.string() : "python3";
  std::vector<std::string> args = {python, script.string(), "--out",
                                   out,    "--after",       std::to_string(warmup)};
  if (band_dir) args.insert(args.end(), {"--seed-band", *band_dir});
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
  const Args args(argv, {"out", "seed-band", "after"}, {"force"});
  args.expect_positional(
      1, 64, "octet compare RUN_DIR... [--seed-band RUN_DIR] [--out FILE.png] (see --help)");
  const std::optional<std::string> out = args.get("out");
  const std::optional<std::string> band_dir = args.get("seed-band");
  std::optional<int64_t> after;
  if (args.has("after")) {
    after = args.get_int("after", 0);
    OCTET_CHECK(*after >= 0, "--after must be a step count >= 0, got ", *after);
  }
  fs::path script;
  if (out) {  // checked before any output, so that a bad --out fails alone
    OCTET_CHECK(!out->empty(), "--out needs a file name");
    const fs::path parent = fs::absolute(*out).parent_path();
    std::error_code ec;
    OCTET_CHECK(fs::is_directory(parent, ec), *out, ": directory ", parent.string(),
                " does not exist");
    std::vector<std::string> inputs = args.positional();
    if (band_dir) inputs.push_back(*band_dir);
    for (const std::string& dir : inputs) {
      refuse_output_over_input((fs::path(dir) / "metrics.jsonl").string(), *out);
      refuse_output_over_input((fs::path(dir) / "config.toml").string(), *out);
    }
    refuse_existing_output(*out, existing_output(args));
    script = find_plot_script();
  }
  std::vector<Run> runs;
  for (const auto& dir : args.positional()) runs.push_back(load_run(dir));
  std::optional<Run> band;
  if (band_dir) band = load_run(*band_dir);
  // The warm-up that the maximum leaves out: --after, else the reference run's own.
  const int64_t warmup = after ? *after : runs[0].warmup_steps.value_or(0);
  const std::string warmup_source = after ? "--after"
                                    : runs[0].warmup_steps
                                        ? "optim.warmup_steps of " + printable(runs[0].label)
                                        : "no config.toml to read it from; set it with --after";
  print_table(runs);
  if (runs.size() > 1 || band) print_relative_errors(runs, band, warmup, warmup_source);
  if (out) plot(script, args.positional(), band_dir, warmup, *out);
  return 0;
}

}  // namespace

Command compare_command() {
  return {
      "compare", "compare training runs: final losses, relative error, speed, memory, plots",
      "usage: octet compare RUN_DIR... [--seed-band RUN_DIR] [--after STEPS]\n"
      "                     [--out FILE.png [--force]]\n\n"
      "Reads RUN_DIR/metrics.jsonl of each run (and the recipe, warm-up and seed from\n"
      "RUN_DIR/config.toml when present). Put the baseline (usually the bf16 run) first.\n\n"
      "The first table has one row per run: the last step, skipped steps, the final train\n"
      "loss (mean over the last 10% of the steps), the last validation loss, |L - L0| / L0\n"
      "against the first run, the mean tokens/s after the warm-up steps and the peak memory.\n\n"
      "With two runs or more, the relative error (L - L0) / L0 of each run against the first,\n"
      "over the steps both have reached: of the validation loss at every evaluation (the runs\n"
      "must evaluate at the same steps), and of the train loss averaged over the last 10% of\n"
      "those steps (the runs must log the same steps there); then per run the last and the\n"
      "largest |error| after the warm-up, whether it is within DeepSeek-V3's 0.25%, and\n"
      "whether it stays inside the seed band.\n\n"
      "flags:\n"
      "  --seed-band RUN_DIR  a second seed of the reference recipe: its error against the\n"
      "                  first run is the band; a run is inside when its last and largest\n"
      "                  |val error| are no larger than the band's\n"
      "  --after STEPS   the warm-up that the largest error leaves out (default: the first\n"
      "                  run's optim.warmup_steps)\n"
      "  --out FILE.png  also draw loss curves, the relative error against the first run\n"
      "                  with the 0.25% line and the seed band, and tokens/s, with\n"
      "                  scripts/plot_compare.py (matplotlib: run scripts/setup.sh once)\n"
      "  --force         replace FILE.png when it exists (default: refuse)",
      run_compare};
}

}  // namespace octet::cli
