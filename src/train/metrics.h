// Per-step training metrics: `<run_dir>/metrics.jsonl`, one JSON object per line.
//
// The file is the record of a run that `octet compare` and scripts/plot_compare.py read, so it is
// written for durability over speed: every line is flushed as soon as the step ends, a resumed run
// appends after dropping the records of steps it will redo, and readers accept a torn last line
// (a crash in the middle of a write).
//
// JSON has no NaN or infinity, and a diverging FP8 run is exactly when they appear: non-finite
// values are written as the strings "nan", "inf" and "-inf" (which Python's float() parses), and
// read back from those strings or from null.
//
// Keys of one record (optional ones are absent when they do not apply):
//   step (int), loss, lr, grad_norm, tokens_per_s, step_ms (numbers), peak_mem_bytes (int),
//   skipped (bool), skip_reason (string, only when skipped), mtp_loss (array, one per MTP depth,
//   only with MTP), router_imbalance (max / mean expert load, only with MoE), val_loss (only on
//   eval steps), shadow_bf16_loss and shadow_gap (only on shadow-BF16 steps),
//   sites ({"<site>": {"amax", "saturated_share", "underflow_share"}}, only when collected),
//   config_changes (["key: before -> after", ...], on the first step after a resume that changed
//   the config), master_bytes and moment_bytes (ints: the FP32 masters and the AdamW moments one
//   rank holds, only with ZeRO-1: a data-parallel run).
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace octet::train {

// Numeric health of one quantization site over one step.
struct SiteStats {
  double amax = 0;             // largest |x| seen by the quantizer
  double saturated_share = 0;  // fraction of elements clamped to the format's max
  double underflow_share = 0;  // fraction of non-zero elements that became zero
};

struct StepMetrics {
  int64_t step = 0;  // 1-based: the number of optimizer steps taken after this one
  double loss = 0;   // main next-token loss of the step (mean over its tokens)
  double lr = 0;
  double grad_norm = 0;                    // global L2 norm before clipping
  double tokens_per_s = 0;                 // training tokens of the step / its wall time
  double step_ms = 0;                      // wall time of the step
  int64_t peak_mem_bytes = 0;              // device memory high-water mark so far
  std::vector<double> mtp_loss;            // one per MTP depth; empty without MTP
  std::optional<double> router_imbalance;  // max / mean tokens per expert, over MoE layers
  bool skipped = false;                    // the optimizer update was not applied
  std::string skip_reason;                 // why, when skipped (e.g. "non-finite grad norm")
  std::optional<double> val_loss;          // only on eval steps
  std::optional<double> shadow_bf16_loss;  // loss of the BF16 shadow forward, when run
  std::optional<double> shadow_gap;        // (loss - shadow_bf16_loss) / shadow_bf16_loss
  std::map<std::string, SiteStats> sites;  // per quantization site; empty when not collected
  // The routed path's casts per MoE layer per forward + backward (core/cast_counter.h kinds:
  // quantize, fused_quantize, dequantize, fp8_transpose); empty without MoE layers.
  std::map<std::string, double> moe_casts;
  std::vector<std::string> config_changes;  // "key: before -> after", first step after a resume
  std::optional<int64_t> master_bytes;      // ZeRO-1: FP32 masters per rank (shard + whole ones)
  std::optional<int64_t> moment_bytes;      // ZeRO-1: AdamW moments per rank
};

// One record as its metrics.jsonl line (no trailing newline).
std::string to_json_line(const StepMetrics& m);

// Parses one line; throws octet::Error naming `where` (e.g. "run/metrics.jsonl:12") and the field.
StepMetrics parse_metrics_line(const std::string& line, const std::string& where);

// All records of a metrics.jsonl, in file order. A last line that does not parse is a write cut
// short by a crash and is dropped; any other bad line is an error naming the file and line.
std::vector<StepMetrics> read_metrics(const std::string& path);

// Appends records to `<run_dir>/metrics.jsonl`, one flushed line per write().
class MetricsWriter {
 public:
  // A new run: creates run_dir if needed and starts an empty metrics.jsonl (replacing any).
  static MetricsWriter fresh(const std::string& run_dir);
  // A run resumed from the checkpoint of `resume_step`: keeps the records of steps <= resume_step
  // (those after it will be recomputed) and a missing file is started empty.
  static MetricsWriter resume(const std::string& run_dir, int64_t resume_step);

  void write(const StepMetrics& m);
  const std::string& path() const { return path_; }

 private:
  MetricsWriter(std::string path, std::ios::openmode mode);
  std::string path_;
  std::ofstream out_;
};

// What a run's records add up to, shared by `octet compare` and the end-of-run summary.
struct MetricsSummary {
  int64_t records = 0;
  int64_t last_step = 0;
  int64_t skipped = 0;
  // Mean loss over the last 10% of the steps with a finite loss that were not skipped, at least
  // the last one: a single step's loss is too noisy to compare runs by. NaN when there are none.
  double final_train_loss = 0;
  int64_t final_window = 0;              // how many steps that mean spans
  std::optional<double> final_val_loss;  // the last val_loss recorded
  // Mean over the records after the first `warmup_records` (the first steps pay for allocator
  // growth, kernel autotuning and caches, which says nothing about the steady state).
  double mean_tokens_per_s = 0;
  int64_t warmup_records = 0;
  int64_t peak_mem_bytes = 0;  // max over the records
};

// The first min(kMaxWarmupRecords, n / 2) records count as warm-up in mean_tokens_per_s.
inline constexpr int64_t kMaxWarmupRecords = 10;

MetricsSummary summarize_metrics(const std::vector<StepMetrics>& records);

}  // namespace octet::train
