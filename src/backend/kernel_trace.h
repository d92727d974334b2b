// A kernel timeline of work run on the GPU (`octet bench train-step --trace`, `octet train
// --trace`): every kernel's start and end on the device, also inside CUDA graph replays, which
// Nsight Compute times only one launch at a time and which the GPU machine has no Nsight Systems
// for.
// It reads CUPTI's activity records (kinds CONCURRENT_KERNEL and MEMSET: a memset is a node of its
// own in a graph, and shows as a span named "[memset N B]"), loading libcupti at run time, so
// nothing links it; a build without CUDA, or a machine without libcupti, gets one error saying so.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/context.h"

namespace octet {

struct KernelSpan {
  std::string name;       // as the driver reports it (mangled)
  uint64_t start_ns = 0;  // device timestamps
  uint64_t end_ns = 0;
  uint32_t stream = 0;      // CUPTI's stream id (a graph's kernels report the replay's stream)
  uint64_t graph_node = 0;  // 0 outside graphs
};

// Records from construction (which waits for the device first) to finish() (which waits again):
// the kernels and memsets that ran in between, by start time. One at a time in a process; the
// destructor stops a trace that was not finished.
class KernelTrace {
 public:
  explicit KernelTrace(Context& ctx);
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;
  ~KernelTrace();
  std::vector<KernelSpan> finish();

 private:
  Context& ctx_;
  std::vector<KernelSpan> spans_;
  bool running_ = false;
};

// Runs body (which enqueues work on ctx's stream) inside a KernelTrace.
std::vector<KernelSpan> trace_kernels(Context& ctx, const std::function<void()>& body);

// Over a timeline: from the first start to the last end, the time at least one kernel ran (the
// union of the spans), and the sum of the kernels' own times; sum - busy is time that two or more
// kernels ran together, span - busy the device's idle gaps.
struct TraceSummary {
  double span_ms = 0, busy_ms = 0, sum_ms = 0;
  int64_t kernels = 0;
};
TraceSummary summarize(const std::vector<KernelSpan>& spans);

// The device's idle gaps longer than min_us, longest first (at most n): where the timeline has no
// kernel running, with the kernels that ended before and started after it.
struct TraceGap {
  double start_us = 0;  // from the first start
  double length_us = 0;
  std::string before, after;
};
std::vector<TraceGap> largest_gaps(const std::vector<KernelSpan>& spans, double min_us, size_t n);

// One line per kernel: start_us,end_us,dur_us (start relative to the first), stream, graph node,
// name. Throws naming the path when it cannot be written.
void write_trace_csv(const std::string& path, const std::vector<KernelSpan>& spans);

}  // namespace octet
