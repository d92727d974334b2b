// The trainer's kernel timeline (step_trace.h).
#include "train/step_trace.h"

#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>
#include <vector>

#include "core/check.h"
#include "train/progress.h"

namespace octet::train {
namespace {

// A kernel's name for the summary: demangled, without its parameter list, at most 70 characters.
std::string short_name(const std::string& mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  std::string s = (status == 0 && d != nullptr) ? d : mangled;
  std::free(d);
  if (const size_t paren = s.find('('); paren != std::string::npos && paren > 0) s.resize(paren);
  if (s.size() > 70) s = s.substr(0, 67) + "...";
  return s;
}

}  // namespace

StepTrace::StepTrace(std::string path, int64_t first, int64_t last, bool writer)
    : path_(std::move(path)), first_(first), last_(last), on_(writer && !path_.empty()) {}

void StepTrace::validate(const std::string& path, int64_t first, int64_t last, Device device,
                         int64_t from, int64_t to) {
  if (path.empty()) return;
  OCTET_CHECK(device == Device::kCuda,
              "--trace: the kernel timeline needs a CUDA device (this run is on ",
              device_name(device), ")");
  OCTET_CHECK(first >= 1 && first <= last, "--trace-steps ", first, ":", last,
              ": give FIRST:LAST with 1 <= FIRST <= LAST");
  OCTET_CHECK(first > from && last <= to, "--trace-steps ", first, ":", last,
              ": this run trains steps ", from + 1, " to ", to);
}

void StepTrace::before_launch(Context& ctx, int64_t number) {
  if (!on_) return;
  if (number == first_ && !trace_) trace_.emplace(ctx);
  if (trace_) launched_ = number;
}

void StepTrace::after_complete(int64_t number, Progress& progress) {
  if (!trace_ || number != last_) return;
  const std::vector<KernelSpan> spans = trace_->finish();
  trace_.reset();
  on_ = false;
  write_trace_csv(path_, spans);
  const TraceSummary s = summarize(spans);
  // The loop launches step N + 1 before it completes step N: the trace holds it too.
  const int64_t steps = launched_ - first_ + 1;
  char head[320];
  std::snprintf(head, sizeof head,
                "kernel trace of steps %lld-%lld: %lld kernels; a step %.3f ms from first start "
                "to last end, %.3f ms with a kernel running (%.1f%% idle), %.3f ms of kernel "
                "time; written to %s",
                static_cast<long long>(first_), static_cast<long long>(launched_),
                static_cast<long long>(s.kernels), s.span_ms / static_cast<double>(steps),
                s.busy_ms / static_cast<double>(steps),
                s.span_ms > 0 ? 100.0 * (s.span_ms - s.busy_ms) / s.span_ms : 0.0,
                s.sum_ms / static_cast<double>(steps), path_.c_str());
  std::ostringstream msg;
  msg << head;
  const std::vector<TraceGap> gaps = largest_gaps(spans, 5.0, 5);
  if (!gaps.empty()) msg << "\n  longest idle gaps:";
  for (const TraceGap& g : gaps) {
    char line[64];
    std::snprintf(line, sizeof line, "\n    %.1f us at %.1f us: ", g.length_us, g.start_us);
    msg << line << short_name(g.before) << " -> " << short_name(g.after);
  }
  progress.message(msg.str());
}

}  // namespace octet::train
