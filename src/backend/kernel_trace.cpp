// CUPTI's kernel activity records, with libcupti loaded at run time (kernel_trace.h).
#include "backend/kernel_trace.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <type_traits>

#include "backend/backend.h"
#include "core/check.h"

#if OCTET_WITH_CUDA && __has_include(<cupti_activity.h>)
#define OCTET_KERNEL_TRACE 1
#include <cupti_activity.h>
#include <dlfcn.h>
#else
#define OCTET_KERNEL_TRACE 0
#endif

namespace octet {

#if OCTET_KERNEL_TRACE
namespace {

// The CUPTI entry points the trace uses, from libcupti.
struct Cupti {
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc,
                                    CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
};

const Cupti& cupti() {
  static const Cupti c = [] {
    void* lib = nullptr;
    for (const char* name : {"libcupti.so.13", "libcupti.so.12", "libcupti.so"})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) != nullptr) break;
    OCTET_CHECK(lib != nullptr,
                "kernel trace: cannot load libcupti (CUDA's extras/CUPTI/lib64): put its directory "
                "on LD_LIBRARY_PATH");
    Cupti f;
    auto get = [&](auto& fn, const char* sym) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, sym));
      OCTET_CHECK(fn != nullptr, "kernel trace: libcupti has no ", sym);
    };
    get(f.register_callbacks, "cuptiActivityRegisterCallbacks");
    get(f.enable, "cuptiActivityEnable");
    get(f.disable, "cuptiActivityDisable");
    get(f.flush_all, "cuptiActivityFlushAll");
    get(f.next_record, "cuptiActivityGetNextRecord");
    return f;
  }();
  return c;
}

std::mutex g_mu;
std::vector<KernelSpan>* g_spans = nullptr;  // the trace being recorded

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cupti().next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (g_spans == nullptr) continue;
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      g_spans->push_back(
          {k->name != nullptr ? k->name : "?", k->start, k->end, k->streamId, k->graphNodeId});
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      // A memset (a node of its own in a graph): named by its size, so that the timeline shows
      // what stands between two kernels.
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      g_spans->push_back({"[memset " + std::to_string(m->bytes) + " B]", m->start, m->end,
                          m->streamId, m->graphNodeId});
    }
  }
  std::free(buffer);
}

void check(CUptiResult r, const char* what) {
  OCTET_CHECK(r == CUPTI_SUCCESS, "kernel trace: ", what, " failed (CUPTI error ",
              static_cast<int>(r), ")");
}

}  // namespace

KernelTrace::KernelTrace(Context& ctx) : ctx_(ctx) {
  OCTET_CHECK(ctx.device == Device::kCuda, "kernel trace: needs a CUDA device (this run is on ",
              device_name(ctx.device), ")");
  const Cupti& c = cupti();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    OCTET_CHECK(g_spans == nullptr, "kernel trace: another trace is recording");
  }
  ctx_.be().synchronize();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_spans = &spans_;
  }
  running_ = true;
  check(c.register_callbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(c.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  check(c.enable(CUPTI_ACTIVITY_KIND_MEMSET), "cuptiActivityEnable");
}

KernelTrace::~KernelTrace() {
  if (!running_) return;
  try {
    finish();
  } catch (...) {  // a failed stop while unwinding: the trace is lost, nothing else is
    std::lock_guard<std::mutex> lock(g_mu);
    g_spans = nullptr;
  }
}

std::vector<KernelSpan> KernelTrace::finish() {
  OCTET_CHECK(running_, "kernel trace: finished twice");
  running_ = false;
  const Cupti& c = cupti();
  ctx_.be().synchronize();
  check(c.flush_all(1), "cuptiActivityFlushAll");  // 1: CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
  check(c.disable(CUPTI_ACTIVITY_KIND_MEMSET), "cuptiActivityDisable");
  check(c.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable");
  std::vector<KernelSpan> spans;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_spans = nullptr;
    spans.swap(spans_);
  }
  std::sort(spans.begin(), spans.end(),
            [](const KernelSpan& a, const KernelSpan& b) { return a.start_ns < b.start_ns; });
  return spans;
}
#else
KernelTrace::KernelTrace(Context& ctx) : ctx_(ctx) {
  OCTET_THROW("kernel trace: this build has no CUDA with CUPTI headers");
}
KernelTrace::~KernelTrace() = default;
std::vector<KernelSpan> KernelTrace::finish() {
  OCTET_THROW("kernel trace: this build has no CUDA with CUPTI headers");
}
#endif

std::vector<KernelSpan> trace_kernels(Context& ctx, const std::function<void()>& body) {
  KernelTrace trace(ctx);
  body();
  return trace.finish();
}

TraceSummary summarize(const std::vector<KernelSpan>& spans) {
  TraceSummary s;
  s.kernels = static_cast<int64_t>(spans.size());
  if (spans.empty()) return s;
  uint64_t busy = 0, sum = 0, cur_start = spans[0].start_ns, cur_end = spans[0].end_ns;
  uint64_t first = spans[0].start_ns, last = spans[0].end_ns;
  for (const KernelSpan& k : spans) {  // by start time
    sum += k.end_ns - k.start_ns;
    last = std::max(last, k.end_ns);
    if (k.start_ns > cur_end) {
      busy += cur_end - cur_start;
      cur_start = k.start_ns;
      cur_end = k.end_ns;
    } else {
      cur_end = std::max(cur_end, k.end_ns);
    }
  }
  busy += cur_end - cur_start;
  s.span_ms = static_cast<double>(last - first) * 1e-6;
  s.busy_ms = static_cast<double>(busy) * 1e-6;
  s.sum_ms = static_cast<double>(sum) * 1e-6;
  return s;
}

std::vector<TraceGap> largest_gaps(const std::vector<KernelSpan>& spans, double min_us, size_t n) {
  std::vector<TraceGap> gaps;
  if (spans.empty()) return gaps;
  const uint64_t t0 = spans[0].start_ns;
  size_t last = 0;                             // the span that ends latest so far
  for (size_t i = 1; i < spans.size(); ++i) {  // by start time
    const KernelSpan& k = spans[i];
    if (k.start_ns > spans[last].end_ns) {
      const double us = static_cast<double>(k.start_ns - spans[last].end_ns) * 1e-3;
      if (us > min_us)
        gaps.push_back(
            {static_cast<double>(spans[last].end_ns - t0) * 1e-3, us, spans[last].name, k.name});
    }
    if (k.end_ns > spans[last].end_ns) last = i;
  }
  std::sort(gaps.begin(), gaps.end(),
            [](const TraceGap& a, const TraceGap& b) { return a.length_us > b.length_us; });
  if (gaps.size() > n) gaps.resize(n);
  return gaps;
}

void write_trace_csv(const std::string& path, const std::vector<KernelSpan>& spans) {
  std::ofstream f(path);
  OCTET_CHECK(f.good(), path, ": cannot write the kernel trace");
  f << "start_us,end_us,dur_us,stream,graph_node,name\n";
  const uint64_t t0 = spans.empty() ? 0 : spans[0].start_ns;
  char line[96];
  for (const KernelSpan& k : spans) {
    std::snprintf(line, sizeof line, "%.3f,%.3f,%.3f,%u,%llu,",
                  static_cast<double>(k.start_ns - t0) * 1e-3,
                  static_cast<double>(k.end_ns - t0) * 1e-3,
                  static_cast<double>(k.end_ns - k.start_ns) * 1e-3, k.stream,
                  static_cast<unsigned long long>(k.graph_node));
    f << line << '"' << k.name << "\"\n";
  }
  OCTET_CHECK(f.good(), path, ": writing the kernel trace failed");
}

}  // namespace octet
