// Progress of a training run for a person watching it: step, loss, tokens/s and ETA.
//
// kBar (a terminal) redraws one line in place:
//   step 120/2000 [#####.....] loss 3.412 | 52.3k tok/s | ETA 4m12s
// kLines (a log file, a pipe, CI) prints a plain line every `log_every` steps, which greps and
// diffs well:
//   step 120/2000 loss 3.4120 lr 3.0e-04 grad_norm 0.812 tok/s 52300 ETA 4m12s
// Messages (skipped steps, validation losses, anything the caller adds) go on their own lines,
// above the bar; finish() prints a summary block. The caller picks the style (tools/ asks isatty)
// and the stream, so this file reads no environment and touches no file descriptor.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "train/metrics.h"

namespace octet::train {

enum class ProgressStyle : uint8_t {
  kBar,    // one line redrawn with '\r' (a terminal)
  kLines,  // plain lines every log_every steps
};

struct ProgressOptions {
  int64_t total_steps = 0;  // the step the run ends at; 0 when unknown (no bar, no ETA)
  int64_t start_step = 0;   // the last step done before this process started (resumed runs)
  int64_t log_every = 10;   // kLines: a line every this many steps, plus the first and the last
  int bar_width = 20;       // kBar: characters between the brackets
  // kBar: redraw at most this often, so that millisecond steps do not flood a slow terminal.
  double min_redraw_s = 0.1;
  // Monotonic seconds; steady_clock when empty. Tests pass a fake one to get exact ETAs.
  std::function<double()> clock;
};

class Progress {
 public:
  Progress(std::ostream& out, ProgressStyle style, ProgressOptions options = {});
  // Ends an unfinished bar with a newline, so that an error printed after it starts a line.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // After every step. Skipped steps and validation losses also become messages.
  void update(const StepMetrics& m);
  // One line above the bar (kBar) or in the stream (kLines).
  void message(const std::string& text);
  // Closes the bar and prints the summary block. Idempotent.
  void finish();

  MetricsSummary summary() const { return summarize_metrics(history_); }
  double elapsed_s() const;

 private:
  std::string bar_line(const StepMetrics& m, double eta_s) const;
  std::string plain_line(const StepMetrics& m, double eta_s) const;
  double eta_s(const StepMetrics& m, double now) const;
  void draw_bar(const std::string& line);
  void clear_bar();

  std::ostream& out_;
  ProgressStyle style_;
  ProgressOptions options_;
  double start_s_ = 0;
  double first_update_s_ = -1;  // clock at the first update; the ETA's rate is measured from it
  int64_t first_update_step_ = 0;
  double last_draw_s_ = -1;
  std::string bar_;  // the bar as last drawn; empty when none is on screen
  bool finished_ = false;
  std::vector<StepMetrics> history_;  // without `sites`: only what the summary needs
};

// "12s", "4m12s", "2h05m", "3d04h"; "?" for a negative or non-finite value.
std::string format_duration(double seconds);
// Tokens per second: "523", "52.3k", "1.25M".
std::string format_rate(double per_s);
// "512 B", "1.5 KiB", "12.3 GiB".
std::string format_bytes(int64_t bytes);

}  // namespace octet::train
