// metrics.jsonl (every field round trips, non-finite values survive JSON, torn last lines, resumed
// runs), the run summary, and the progress display in both styles with a fake clock.
#include "train/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "train/progress.h"

namespace octet::train {
namespace {

namespace fs = std::filesystem;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A record with every field set to distinct, non-round values.
StepMetrics full_record(int64_t step) {
  StepMetrics m;
  m.step = step;
  m.loss = 3.4120117 + step;
  m.lr = 3.0e-4;
  m.grad_norm = 0.8125;
  m.tokens_per_s = 52311.5;
  m.step_ms = 78.25;
  m.peak_mem_bytes = 12345678901;
  m.mtp_loss = {3.5, 3.75};
  m.router_imbalance = 1.375;
  m.skipped = true;
  m.skip_reason = "non-finite grad norm";
  m.val_loss = 3.3;
  m.shadow_bf16_loss = 3.41;
  m.shadow_gap = 0.0021;
  m.sites["layers.0.mlp.experts.fc1.input"] = {448.5, 1e-5, 0.003};
  m.sites["layers.0.self_attn.o_proj.dgrad"] = {12.25, 0.0, 0.25};
  m.moe_casts = {
      {"quantize", 2.0}, {"fused_quantize", 2.0}, {"dequantize", 0.0}, {"fp8_transpose", 4.0}};
  return m;
}

StepMetrics minimal_record(int64_t step, double loss) {
  StepMetrics m;
  m.step = step;
  m.loss = loss;
  m.lr = 1e-3;
  m.grad_norm = 1.5;
  m.tokens_per_s = 1000.0 + step;
  m.step_ms = 10;
  m.peak_mem_bytes = 1000 * step;
  return m;
}

void expect_same(const StepMetrics& a, const StepMetrics& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.lr, b.lr);
  EXPECT_EQ(a.grad_norm, b.grad_norm);
  EXPECT_EQ(a.tokens_per_s, b.tokens_per_s);
  EXPECT_EQ(a.step_ms, b.step_ms);
  EXPECT_EQ(a.peak_mem_bytes, b.peak_mem_bytes);
  EXPECT_EQ(a.mtp_loss, b.mtp_loss);
  EXPECT_EQ(a.router_imbalance, b.router_imbalance);
  EXPECT_EQ(a.skipped, b.skipped);
  EXPECT_EQ(a.skip_reason, b.skip_reason);
  EXPECT_EQ(a.val_loss, b.val_loss);
  EXPECT_EQ(a.shadow_bf16_loss, b.shadow_bf16_loss);
  EXPECT_EQ(a.shadow_gap, b.shadow_gap);
  EXPECT_EQ(a.moe_casts, b.moe_casts);
  ASSERT_EQ(a.sites.size(), b.sites.size());
  for (const auto& [name, s] : a.sites) {
    ASSERT_TRUE(b.sites.count(name)) << name;
    EXPECT_EQ(s.amax, b.sites.at(name).amax) << name;
    EXPECT_EQ(s.saturated_share, b.sites.at(name).saturated_share) << name;
    EXPECT_EQ(s.underflow_share, b.sites.at(name).underflow_share) << name;
  }
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("octet_metrics_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string metrics() const { return (dir_ / "metrics.jsonl").string(); }
  void write_raw(const std::string& text) const {
    fs::create_directories(dir_);
    std::ofstream(metrics(), std::ios::binary) << text;
  }

  fs::path dir_;
};

TEST_F(MetricsTest, EveryFieldRoundTripsThroughTheFile) {
  auto w = MetricsWriter::fresh(dir_.string());  // also creates the run directory
  const StepMetrics a = full_record(1), b = minimal_record(2, 2.5);
  w.write(a);
  w.write(b);
  const auto records = read_metrics(metrics());
  ASSERT_EQ(records.size(), 2u);
  expect_same(records[0], a);
  expect_same(records[1], b);
}

TEST_F(MetricsTest, WritesExactlyTheDocumentedKeys) {
  const auto full = nlohmann::json::parse(to_json_line(full_record(7)));
  std::vector<std::string> keys;
  for (const auto& [k, v] : full.items()) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "grad_norm", "loss", "lr", "moe_casts", "mtp_loss", "peak_mem_bytes",
                      "router_imbalance", "shadow_bf16_loss", "shadow_gap", "sites", "skip_reason",
                      "skipped", "step", "step_ms", "tokens_per_s", "val_loss"}));
  const auto& site = full["sites"]["layers.0.mlp.experts.fc1.input"];
  EXPECT_EQ(site.size(), 3u);
  EXPECT_EQ(site["amax"], 448.5);
  EXPECT_EQ(site["saturated_share"], 1e-5);
  EXPECT_EQ(site["underflow_share"], 0.003);
  EXPECT_EQ(full["mtp_loss"], nlohmann::json::array({3.5, 3.75}));
  EXPECT_EQ(full["moe_casts"]["quantize"], 2.0);
  EXPECT_EQ(full["moe_casts"]["fp8_transpose"], 4.0);
  EXPECT_EQ(full["step"], 7);
  EXPECT_EQ(full["skipped"], true);

  // Optional keys are absent, not null, when they do not apply.
  const std::string line = to_json_line(minimal_record(3, 2.0));
  EXPECT_EQ(line.rfind("{\"step\":3,\"loss\":2.0,", 0), 0u) << line;  // step and loss first
  keys.clear();
  const auto minimal = nlohmann::json::parse(line);  // named: items() refers into it
  for (const auto& [k, v] : minimal.items()) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"grad_norm", "loss", "lr", "peak_mem_bytes", "skipped",
                                            "step", "step_ms", "tokens_per_s"}));
}

TEST_F(MetricsTest, NonFiniteValuesAreWrittenAsStringsAndReadBack) {
  StepMetrics m = full_record(5);
  m.loss = kNaN;
  m.grad_norm = kInf;
  m.val_loss = -kInf;
  m.mtp_loss = {kNaN, 2.0};
  m.sites["layers.0.mlp.experts.fc1.input"].amax = kInf;
  const std::string line = to_json_line(m);
  // Valid JSON (no bare NaN / Infinity tokens).
  ASSERT_FALSE(nlohmann::json::parse(line, nullptr, false).is_discarded()) << line;
  EXPECT_NE(line.find("\"loss\":\"nan\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"grad_norm\":\"inf\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"val_loss\":\"-inf\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"mtp_loss\":[\"nan\",2.0]"), std::string::npos) << line;

  const StepMetrics r = parse_metrics_line(line, "test");
  EXPECT_TRUE(std::isnan(r.loss));
  EXPECT_EQ(r.grad_norm, kInf);
  EXPECT_EQ(r.val_loss, -kInf);
  EXPECT_TRUE(std::isnan(r.mtp_loss[0]));
  EXPECT_EQ(r.mtp_loss[1], 2.0);
  EXPECT_EQ(r.sites.at("layers.0.mlp.experts.fc1.input").amax, kInf);
}

TEST_F(MetricsTest, ReadsNullAsNaNAndASingleMtpLoss) {
  const StepMetrics r = parse_metrics_line(
      R"({"step": 4, "loss": null, "grad_norm": "Infinity", "mtp_loss": 2.5, "extra": [1]})", "t");
  EXPECT_EQ(r.step, 4);
  EXPECT_TRUE(std::isnan(r.loss));
  EXPECT_EQ(r.grad_norm, kInf);
  EXPECT_EQ(r.mtp_loss, std::vector<double>{2.5});
  EXPECT_FALSE(r.val_loss.has_value());
  EXPECT_FALSE(r.skipped);
}

TEST_F(MetricsTest, ParseErrorsNameTheLineAndTheField) {
  auto message = [](const std::string& line) {
    try {
      parse_metrics_line(line, "run/metrics.jsonl:3");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("{\"loss\": 1}"), "run/metrics.jsonl:3: missing field 'step'");
  EXPECT_NE(message("{\"step\": 1, \"loss\": \"abc\"}").find("field 'loss'"), std::string::npos);
  EXPECT_NE(message("{\"step\": 1.5, \"loss\": 1}").find("field 'step': expected an integer"),
            std::string::npos);
  EXPECT_EQ(message("[1, 2]"), "run/metrics.jsonl:3: expected a JSON object, got array");
  EXPECT_EQ(message("{\"step\": 1,"), "run/metrics.jsonl:3: not valid JSON");
  EXPECT_NE(message("{\"step\": 1, \"loss\": 1, \"sites\": {\"a\": {\"amax\": true}}}")
                .find("site 'a': field 'amax'"),
            std::string::npos);
}

TEST_F(MetricsTest, ReaderDropsATornLastLine) {
  std::string text;
  for (int s = 1; s <= 3; ++s) text += to_json_line(minimal_record(s, 4.0 - s)) + "\n";
  const std::string fourth = to_json_line(minimal_record(4, 0.5));
  write_raw(text + fourth.substr(0, fourth.size() / 2));  // a crash in the middle of a write
  const auto records = read_metrics(metrics());
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[2].step, 3);
  EXPECT_EQ(records[2].loss, 1.0);
}

TEST_F(MetricsTest, ReaderRejectsABadLineBeforeTheLast) {
  write_raw(to_json_line(minimal_record(1, 2.0)) + "\n{garbage\n\n" +
            to_json_line(minimal_record(2, 1.0)) + "\n");
  try {
    read_metrics(metrics());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), metrics() + ":2: not valid JSON");
  }
}

TEST_F(MetricsTest, ReaderNamesAMissingFile) {
  try {
    read_metrics(metrics());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), metrics() + ": no such file");
  }
}

TEST_F(MetricsTest, WriterFlushesEveryLine) {
  auto w = MetricsWriter::fresh(dir_.string());
  w.write(minimal_record(1, 2.0));
  // Read while the writer is still open: a crash after write() must not lose the record.
  EXPECT_EQ(read_metrics(metrics()).size(), 1u);
  w.write(minimal_record(2, 1.0));
  EXPECT_EQ(read_metrics(metrics()).size(), 2u);
  EXPECT_EQ(w.path(), metrics());
}

TEST_F(MetricsTest, FreshRunReplacesAnOldFile) {
  write_raw(to_json_line(minimal_record(9, 2.0)) + "\n");
  auto w = MetricsWriter::fresh(dir_.string());
  EXPECT_TRUE(read_metrics(metrics()).empty());
  w.write(minimal_record(1, 3.0));
  const auto records = read_metrics(metrics());
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].step, 1);
}

TEST_F(MetricsTest, ResumeDropsTheStepsAfterTheCheckpointAndAppends) {
  std::string text;
  for (int s = 1; s <= 10; ++s) text += to_json_line(minimal_record(s, 10.0 - s)) + "\n";
  // A line from a newer writer with a key this version does not know is kept as written.
  const std::string newer = R"({"step":11,"loss":0.5,"future_key":[1,2]})";
  text.insert(text.find("{\"step\":6,"), R"({"step":5,"loss":5.0,"future_key":[1,2]})"
                                         "\n");
  write_raw(text + newer + "\n" + "{\"step\":12,\"lo");  // and a torn line at the end
  {
    auto w = MetricsWriter::resume(dir_.string(), 6);
    for (int s = 7; s <= 8; ++s) w.write(minimal_record(s, 100.0 + s));
  }
  const auto records = read_metrics(metrics());
  std::vector<int64_t> steps;
  for (const auto& r : records) steps.push_back(r.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 5, 6, 7, 8}));
  EXPECT_EQ(records.back().loss, 108.0);  // the redone steps, not the old ones
  EXPECT_NE(slurp(metrics()).find(R"({"step":5,"loss":5.0,"future_key":[1,2]})"),
            std::string::npos);
  EXPECT_EQ(slurp(metrics()).back(), '\n');
}

TEST_F(MetricsTest, ResumeWithoutAFileStartsOne) {
  {
    auto w = MetricsWriter::resume(dir_.string(), 100);
    w.write(minimal_record(101, 1.0));
  }
  const auto records = read_metrics(metrics());
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].step, 101);
}

TEST_F(MetricsTest, WriterNamesAnUnwritableRunDirectory) {
  write_raw("");
  const fs::path file = dir_ / "a_file";
  std::ofstream(file) << "x";
  try {
    MetricsWriter::fresh((file / "run").string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((file / "run").string()), std::string::npos) << e.what();
  }
}

TEST_F(MetricsTest, SummaryAveragesTheLastTenthAndSkipsWarmup) {
  std::vector<StepMetrics> records;
  for (int s = 1; s <= 40; ++s) records.push_back(minimal_record(s, 100.0 - s));
  records[39].peak_mem_bytes = 7;  // the peak is a max, not the last value
  records[20].skipped = true;      // left out of the loss mean (39 steps remain)
  records[38].loss = kNaN;         // likewise (38 remain: window 3 = steps 37, 38, 40)
  records[9].val_loss = 3.0;
  records[29].val_loss = 2.0;
  const MetricsSummary s = summarize_metrics(records);
  EXPECT_EQ(s.records, 40);
  EXPECT_EQ(s.last_step, 40);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.final_window, 3);
  EXPECT_DOUBLE_EQ(s.final_train_loss, ((100.0 - 37) + (100.0 - 38) + (100.0 - 40)) / 3);
  EXPECT_EQ(s.final_val_loss, 2.0);
  EXPECT_EQ(s.warmup_records, 10);
  EXPECT_DOUBLE_EQ(s.mean_tokens_per_s, 1000.0 + (11 + 40) / 2.0);  // steps 11..40
  EXPECT_EQ(s.peak_mem_bytes, 39000);

  const MetricsSummary one = summarize_metrics({minimal_record(1, 2.5)});
  EXPECT_EQ(one.final_window, 1);
  EXPECT_EQ(one.final_train_loss, 2.5);
  EXPECT_EQ(one.warmup_records, 0);
  EXPECT_EQ(one.mean_tokens_per_s, 1001.0);
  EXPECT_FALSE(one.final_val_loss.has_value());

  const MetricsSummary none = summarize_metrics({});
  EXPECT_EQ(none.final_window, 0);
  EXPECT_TRUE(std::isnan(none.final_train_loss));
}

// ---- Progress ----

struct FakeClock {
  double now = 1000.0;
  std::function<double()> fn() {
    return [this] { return now; };
  }
};

StepMetrics progress_record(int64_t step) {
  StepMetrics m = minimal_record(step, 3.412);
  m.lr = 3e-4;
  m.grad_norm = 0.8123;
  m.tokens_per_s = 52300;
  m.step_ms = 500;
  return m;
}

TEST(ProgressTest, FormatsDurationsRatesAndBytes) {
  EXPECT_EQ(format_duration(0), "0s");
  EXPECT_EQ(format_duration(59.4), "59s");
  EXPECT_EQ(format_duration(252), "4m12s");
  EXPECT_EQ(format_duration(7500), "2h05m");
  EXPECT_EQ(format_duration(3 * 86400 + 4 * 3600 + 10), "3d04h");
  EXPECT_EQ(format_duration(-1), "?");
  EXPECT_EQ(format_duration(kNaN), "?");
  EXPECT_EQ(format_rate(523.4), "523");
  EXPECT_EQ(format_rate(52300), "52.3k");
  EXPECT_EQ(format_rate(1.25e6), "1.25M");
  EXPECT_EQ(format_rate(kNaN), "?");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(int64_t{12} * 1024 * 1024 * 1024 + 300 * 1024 * 1024), "12.3 GiB");
}

TEST(ProgressTest, PlainLinesEveryLogEveryStepsWithEta) {
  FakeClock clock;
  std::ostringstream out;
  Progress p(out, ProgressStyle::kLines,
             {.total_steps = 100, .log_every = 10, .clock = clock.fn()});
  for (int s = 1; s <= 100; ++s) {
    clock.now += 0.5;
    p.update(progress_record(s));
  }
  std::vector<std::string> lines;
  std::istringstream in(out.str());
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 11u) << out.str();  // steps 1, 10, 20, ..., 100
  EXPECT_EQ(lines[0], "step 1/100 loss 3.4120 lr 3.0e-04 grad_norm 0.812 tok/s 52300 ETA 50s");
  EXPECT_EQ(lines[2], "step 20/100 loss 3.4120 lr 3.0e-04 grad_norm 0.812 tok/s 52300 ETA 40s");
  EXPECT_EQ(lines[10], "step 100/100 loss 3.4120 lr 3.0e-04 grad_norm 0.812 tok/s 52300 ETA 0s");
  EXPECT_EQ(out.str().find('\r'), std::string::npos);
}

TEST(ProgressTest, BarRedrawsOneLine) {
  FakeClock clock;
  std::ostringstream out;
  Progress p(out, ProgressStyle::kBar, {.total_steps = 2000, .bar_width = 10, .clock = clock.fn()});
  p.update(progress_record(999));
  clock.now += 252;  // 1 step in 252 s: 1000 steps left take 252000 s
  p.update(progress_record(1000));
  const std::string s = out.str();
  EXPECT_EQ(s.find('\n'), std::string::npos) << s;
  const std::string last = s.substr(s.rfind('\r'));
  EXPECT_EQ(last, "\rstep 1000/2000 [#####.....] loss 3.412 | 52.3k tok/s | ETA 2d22h\x1b[K");
}

TEST(ProgressTest, BarIsThrottledButShowsTheLastStep) {
  FakeClock clock;
  std::ostringstream out;
  Progress p(out, ProgressStyle::kBar, {.total_steps = 50, .clock = clock.fn()});
  for (int s = 1; s <= 50; ++s) {
    clock.now += 0.01;  // 100 steps/s: a redraw every 10 steps at the default 0.1 s
    p.update(progress_record(s));
  }
  const std::string s = out.str();
  const auto draws = std::count(s.begin(), s.end(), '\r');
  EXPECT_GE(draws, 5);
  EXPECT_LE(draws, 7);
  EXPECT_NE(s.find("step 50/50 [####################]"), std::string::npos) << s;
}

TEST(ProgressTest, MessagesGoAboveTheBar) {
  FakeClock clock;
  std::ostringstream out;
  Progress p(out, ProgressStyle::kBar, {.total_steps = 10, .clock = clock.fn()});
  StepMetrics m = progress_record(1);
  p.update(m);
  out.str("");
  m.step = 2;
  m.skipped = true;
  m.skip_reason = "non-finite grad norm";
  m.val_loss = 3.25;
  clock.now += 1;
  p.update(m);
  const std::string s = out.str();
  EXPECT_NE(s.find("\r\x1b[Kstep 2: skipped (non-finite grad norm)\n"), std::string::npos) << s;
  EXPECT_NE(s.find("\r\x1b[Kstep 2: val loss 3.2500\n"), std::string::npos) << s;
  // The bar comes back after each message, so the screen always ends with it.
  EXPECT_EQ(s.substr(s.rfind('\n') + 1).find("step 2/10 ["), 0u) << s;
  out.str("");
  p.message("checkpoint saved");
  EXPECT_EQ(out.str().rfind("\r\x1b[Kcheckpoint saved\nstep 2/10 [", 0), 0u) << out.str();
}

TEST(ProgressTest, PlainMessagesAreLines) {
  std::ostringstream out;
  Progress p(out, ProgressStyle::kLines, {.total_steps = 10, .log_every = 5});
  StepMetrics m = progress_record(3);
  m.val_loss = 2.5;
  p.update(m);
  p.message("hello");
  EXPECT_EQ(out.str(),
            "step 3/10 loss 3.4120 lr 3.0e-04 grad_norm 0.812 tok/s 52300 ETA 4s\n"
            "step 3: val loss 2.5000\nhello\n");
}

TEST(ProgressTest, FinishPrintsTheSummary) {
  FakeClock clock;
  std::ostringstream out;
  Progress p(out, ProgressStyle::kBar, {.total_steps = 30, .start_step = 10, .clock = clock.fn()});
  for (int s = 11; s <= 30; ++s) {
    clock.now += 3;
    StepMetrics m = progress_record(s);
    m.loss = 40.0 - s;
    m.skipped = s == 15;
    if (s == 30) m.val_loss = 9.5;
    m.peak_mem_bytes = int64_t{3} << 30;
    m.sites["x"] = {1, 0, 0};
    p.update(m);
  }
  p.finish();
  p.finish();  // idempotent
  const std::string s = out.str();
  const std::string summary = s.substr(s.find("summary\n"));
  EXPECT_EQ(summary,
            "summary\n"
            "  steps             30/30 (20 run here, resumed after step 10)\n"
            "  final train loss  10.0000 (mean of the last 1 step)\n"
            "  final val loss    9.5000\n"
            "  tokens/s          52.3k (mean, first 10 steps excluded as warm-up)\n"
            "  peak memory       3.0 GiB\n"
            "  wall time         1m00s\n"
            "  skipped steps     1\n");
  // The bar was ended with a newline before the summary.
  EXPECT_EQ(s[s.find("summary\n") - 1], '\n');
}

TEST(ProgressTest, DestructorEndsAnOpenBar) {
  std::ostringstream out;
  {
    Progress p(out, ProgressStyle::kBar, {.total_steps = 10});
    p.update(progress_record(1));
  }
  EXPECT_EQ(out.str().back(), '\n');
}

}  // namespace
}  // namespace octet::train
