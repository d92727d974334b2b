#include "train/progress.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "core/check.h"

namespace octet::train {
namespace {

// Erase to the end of the line (ECMA-48 EL): a shorter bar must not leave the tail of a longer one.
constexpr std::string_view kEraseLine = "\x1b[K";

double steady_seconds() {
  using Clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

template <typename... Args>
std::string format(const char* fmt, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return format("%llds", static_cast<long long>(s));
  if (s < 3600)
    return format("%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  if (s < 86400)
    return format("%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  return format("%lldd%02lldh", static_cast<long long>(s / 86400),
                static_cast<long long>(s % 86400 / 3600));
}

std::string format_rate(double per_s) {
  if (!std::isfinite(per_s)) return "?";
  if (per_s < 1e3) return format("%.0f", per_s);
  if (per_s < 1e6) return format("%.1fk", per_s / 1e3);
  if (per_s < 1e9) return format("%.2fM", per_s / 1e6);
  return format("%.2fG", per_s / 1e9);
}

std::string format_bytes(int64_t bytes) {
  if (bytes < 1024) return format("%lld B", static_cast<long long>(bytes));
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  return format("%.1f %s", v, units[u]);
}

Progress::Progress(std::ostream& out, ProgressStyle style, ProgressOptions options)
    : out_(out), style_(style), options_(std::move(options)) {
  OCTET_CHECK(options_.log_every > 0, "progress: log_every must be positive, got ",
              options_.log_every);
  OCTET_CHECK(options_.bar_width > 0, "progress: bar_width must be positive, got ",
              options_.bar_width);
  if (!options_.clock) options_.clock = steady_seconds;
  start_s_ = options_.clock();
}

Progress::~Progress() {
  if (!bar_.empty()) out_ << '\n' << std::flush;
}

double Progress::elapsed_s() const {
  return options_.clock() - start_s_;
}

// Seconds per step measured from the end of the first step on, so that neither the time before it
// (loading data, building the model) nor its own warm-up counts; until a second step ends, the
// first step's own time is all there is to go by.
double Progress::eta_s(const StepMetrics& m, double now) const {
  if (options_.total_steps <= 0) return -1;
  const int64_t left = std::max<int64_t>(0, options_.total_steps - m.step);
  const int64_t done = m.step - first_update_step_;
  const double per_step =
      done > 0 ? (now - first_update_s_) / static_cast<double>(done) : m.step_ms / 1000.0;
  return per_step * static_cast<double>(left);
}

std::string Progress::bar_line(const StepMetrics& m, double eta) const {
  std::string line = "step " + std::to_string(m.step);
  if (options_.total_steps > 0) {
    const double frac = std::clamp(
        static_cast<double>(m.step) / static_cast<double>(options_.total_steps), 0.0, 1.0);
    const int filled = static_cast<int>(frac * options_.bar_width);
    // Appended piecewise: GCC 12 warns falsely (-Wrestrict, PR 105651) on "literal" + string&&.
    line += '/';
    line += std::to_string(options_.total_steps);
    line += " [";
    line.append(filled, '#').append(options_.bar_width - filled, '.') += ']';
  }
  line += format(" loss %.3f | %s tok/s", m.loss, format_rate(m.tokens_per_s).c_str());
  if (eta >= 0) line += " | ETA " + format_duration(eta);
  return line;
}

std::string Progress::plain_line(const StepMetrics& m, double eta) const {
  std::string line = "step " + std::to_string(m.step);
  if (options_.total_steps > 0)
    line += format("/%lld", static_cast<long long>(options_.total_steps));
  line += format(" loss %.4f lr %.1e grad_norm %.3f tok/s %.0f", m.loss, m.lr, m.grad_norm,
                 m.tokens_per_s);
  if (eta >= 0) line += " ETA " + format_duration(eta);
  return line;
}

void Progress::draw_bar(const std::string& line) {
  out_ << '\r' << line << kEraseLine << std::flush;
  bar_ = line;
}

void Progress::clear_bar() {
  if (!bar_.empty()) out_ << '\r' << kEraseLine;
}

void Progress::update(const StepMetrics& m) {
  const double now = options_.clock();
  const bool first = first_update_s_ < 0;
  if (first) {
    first_update_s_ = now;
    first_update_step_ = m.step;
  }
  StepMetrics kept = m;
  kept.sites.clear();
  history_.push_back(std::move(kept));

  const double eta = eta_s(m, now);
  const bool last = options_.total_steps > 0 && m.step >= options_.total_steps;
  if (style_ == ProgressStyle::kBar) {
    if (first || last || now - last_draw_s_ >= options_.min_redraw_s) {
      draw_bar(bar_line(m, eta));
      last_draw_s_ = now;
    }
  } else if (first || last || m.step % options_.log_every == 0) {
    out_ << plain_line(m, eta) << '\n' << std::flush;
  }

  if (m.skipped)
    message("step " + std::to_string(m.step) + ": skipped" +
            (m.skip_reason.empty() ? "" : " (" + m.skip_reason + ")"));
  if (m.val_loss)
    message(format("step %lld: val loss %.4f", static_cast<long long>(m.step), *m.val_loss));
}

void Progress::message(const std::string& text) {
  clear_bar();
  out_ << text << '\n';
  if (!bar_.empty()) out_ << bar_ << kEraseLine;
  out_ << std::flush;
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (!bar_.empty()) out_ << '\n';
  bar_.clear();

  const MetricsSummary s = summary();
  const double wall = elapsed_s();
  std::string steps = std::to_string(s.last_step);
  if (options_.total_steps > 0)
    steps += format("/%lld", static_cast<long long>(options_.total_steps));
  if (options_.start_step > 0)
    steps += format(" (%lld run here, resumed after step %lld)", static_cast<long long>(s.records),
                    static_cast<long long>(options_.start_step));
  out_ << "summary\n";
  out_ << "  steps             " << steps << "\n";
  if (s.final_window > 0)
    out_ << format("  final train loss  %.4f (mean of the last %lld step%s)\n", s.final_train_loss,
                   static_cast<long long>(s.final_window), s.final_window == 1 ? "" : "s");
  else
    out_ << "  final train loss  n/a (no finite loss)\n";
  if (s.final_val_loss)
    out_ << format("  final val loss    %.4f\n", *s.final_val_loss);
  else
    out_ << "  final val loss    n/a (no evaluation)\n";
  out_ << "  tokens/s          " << format_rate(s.mean_tokens_per_s)
       << format(" (mean, first %lld steps excluded as warm-up)\n",
                 static_cast<long long>(s.warmup_records));
  out_ << "  peak memory       " << format_bytes(s.peak_mem_bytes) << "\n";
  out_ << "  wall time         " << format_duration(wall) << "\n";
  out_ << "  skipped steps     " << s.skipped << "\n" << std::flush;
}

}  // namespace octet::train
