#include "train/metrics.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "io/atomic_file.h"

namespace octet::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
// Insertion order is kept when writing, so that a person reading the file with `tail` sees the step
// and the loss first.
using ojson = nlohmann::ordered_json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

ojson number(double v) {
  if (std::isfinite(v)) return v;
  if (std::isnan(v)) return "nan";
  return v > 0 ? "inf" : "-inf";
}

ojson numbers(const std::vector<double>& v) {
  ojson a = ojson::array();
  for (double x : v) a.push_back(number(x));
  return a;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// A number as written by number() (or by another tool that prefers null for non-finite values).
double read_number(const json& v, const std::string& where, const std::string& field) {
  if (v.is_number()) return v.get<double>();
  if (v.is_null()) return kNaN;
  if (v.is_string()) {
    const std::string s = lower(v.get<std::string>());
    if (s == "nan" || s == "-nan") return kNaN;
    if (s == "inf" || s == "+inf" || s == "infinity") return kInf;
    if (s == "-inf" || s == "-infinity") return -kInf;
  }
  OCTET_THROW(where, ": field '", field, "': expected a number, \"nan\", \"inf\" or \"-inf\", got ",
              v.dump());
}

int64_t read_int(const json& v, const std::string& where, const std::string& field) {
  OCTET_CHECK(v.is_number_integer(), where, ": field '", field, "': expected an integer, got ",
              v.dump());
  return v.get<int64_t>();
}

std::optional<double> read_optional(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return std::nullopt;
  return read_number(*it, where, key);
}

double read_or(const json& obj, const char* key, double fallback, const std::string& where) {
  return read_optional(obj, key, where).value_or(fallback);
}

SiteStats read_site(const json& v, const std::string& where, const std::string& name) {
  OCTET_CHECK(v.is_object(), where, ": field 'sites.", name, "': expected an object, got ",
              v.dump());
  const std::string w = where + ": site '" + name + "'";
  SiteStats s;
  s.amax = read_or(v, "amax", 0.0, w);
  s.saturated_share = read_or(v, "saturated_share", 0.0, w);
  s.underflow_share = read_or(v, "underflow_share", 0.0, w);
  return s;
}

std::string metrics_path(const std::string& run_dir) {
  return (fs::path(run_dir) / "metrics.jsonl").string();
}

void ensure_dir(const std::string& run_dir) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  OCTET_CHECK(fs::is_directory(run_dir), run_dir, ": cannot create the run directory",
              ec ? ": " + ec.message() : "");
}

}  // namespace

std::string to_json_line(const StepMetrics& m) {
  ojson j;
  j["step"] = m.step;
  j["loss"] = number(m.loss);
  j["lr"] = number(m.lr);
  j["grad_norm"] = number(m.grad_norm);
  j["tokens_per_s"] = number(m.tokens_per_s);
  j["step_ms"] = number(m.step_ms);
  j["peak_mem_bytes"] = m.peak_mem_bytes;
  j["skipped"] = m.skipped;
  if (m.skipped) j["skip_reason"] = m.skip_reason;
  if (!m.mtp_loss.empty()) j["mtp_loss"] = numbers(m.mtp_loss);
  if (m.router_imbalance) j["router_imbalance"] = number(*m.router_imbalance);
  if (m.val_loss) j["val_loss"] = number(*m.val_loss);
  if (m.shadow_bf16_loss) j["shadow_bf16_loss"] = number(*m.shadow_bf16_loss);
  if (m.shadow_gap) j["shadow_gap"] = number(*m.shadow_gap);
  if (!m.config_changes.empty()) j["config_changes"] = m.config_changes;
  if (m.master_bytes) j["master_bytes"] = *m.master_bytes;
  if (m.moment_bytes) j["moment_bytes"] = *m.moment_bytes;
  if (!m.moe_casts.empty()) {
    ojson casts = ojson::object();
    for (const auto& [kind, n] : m.moe_casts) casts[kind] = number(n);
    j["moe_casts"] = std::move(casts);
  }
  if (!m.sites.empty()) {
    ojson sites = ojson::object();
    for (const auto& [name, s] : m.sites) {
      sites[name] = {{"amax", number(s.amax)},
                     {"saturated_share", number(s.saturated_share)},
                     {"underflow_share", number(s.underflow_share)}};
    }
    j["sites"] = std::move(sites);
  }
  return j.dump();
}

StepMetrics parse_metrics_line(const std::string& line, const std::string& where) {
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  OCTET_CHECK(!j.is_discarded(), where, ": not valid JSON");
  OCTET_CHECK(j.is_object(), where, ": expected a JSON object, got ", j.type_name());
  for (const char* key : {"step", "loss"})
    OCTET_CHECK(j.contains(key), where, ": missing field '", key, "'");
  StepMetrics m;
  m.step = read_int(j["step"], where, "step");
  m.loss = read_number(j["loss"], where, "loss");
  m.lr = read_or(j, "lr", 0.0, where);
  m.grad_norm = read_or(j, "grad_norm", 0.0, where);
  m.tokens_per_s = read_or(j, "tokens_per_s", 0.0, where);
  m.step_ms = read_or(j, "step_ms", 0.0, where);
  if (j.contains("peak_mem_bytes"))
    m.peak_mem_bytes = read_int(j["peak_mem_bytes"], where, "peak_mem_bytes");
  if (j.contains("skipped")) {
    OCTET_CHECK(j["skipped"].is_boolean(), where, ": field 'skipped': expected true or false, got ",
                j["skipped"].dump());
    m.skipped = j["skipped"].get<bool>();
  }
  if (j.contains("skip_reason")) {
    OCTET_CHECK(j["skip_reason"].is_string(), where, ": field 'skip_reason': expected a string");
    m.skip_reason = j["skip_reason"].get<std::string>();
  }
  if (j.contains("mtp_loss")) {
    const json& a = j["mtp_loss"];
    // A single number is accepted for writers that only know one MTP depth.
    if (a.is_array()) {
      for (size_t d = 0; d < a.size(); ++d)
        m.mtp_loss.push_back(read_number(a[d], where, "mtp_loss[" + std::to_string(d) + "]"));
    } else {
      m.mtp_loss.push_back(read_number(a, where, "mtp_loss"));
    }
  }
  m.router_imbalance = read_optional(j, "router_imbalance", where);
  m.val_loss = read_optional(j, "val_loss", where);
  m.shadow_bf16_loss = read_optional(j, "shadow_bf16_loss", where);
  m.shadow_gap = read_optional(j, "shadow_gap", where);
  for (auto [key, field] : {std::pair{"master_bytes", &StepMetrics::master_bytes},
                            std::pair{"moment_bytes", &StepMetrics::moment_bytes}})
    if (j.contains(key)) m.*field = read_int(j[key], where, key);
  if (j.contains("config_changes")) {
    const json& a = j["config_changes"];
    OCTET_CHECK(a.is_array(), where, ": field 'config_changes': expected an array of strings");
    for (const json& c : a) {
      OCTET_CHECK(c.is_string(), where, ": field 'config_changes': expected an array of strings");
      m.config_changes.push_back(c.get<std::string>());
    }
  }
  if (j.contains("moe_casts")) {
    OCTET_CHECK(j["moe_casts"].is_object(), where, ": field 'moe_casts': expected an object, got ",
                j["moe_casts"].dump());
    for (const auto& [kind, n] : j["moe_casts"].items())
      m.moe_casts[kind] = read_number(n, where, "moe_casts." + kind);
  }
  if (j.contains("sites")) {
    OCTET_CHECK(j["sites"].is_object(), where, ": field 'sites': expected an object, got ",
                j["sites"].dump());
    for (const auto& [name, v] : j["sites"].items()) m.sites[name] = read_site(v, where, name);
  }
  return m;
}

// Records with the text of their lines, which a resumed run writes back unchanged (keys that this
// version does not know included).
static std::vector<std::pair<StepMetrics, std::string>> read_records(const std::string& path) {
  std::error_code ec;
  OCTET_CHECK(fs::exists(path, ec), path, ": no such file");
  OCTET_CHECK(fs::is_regular_file(path, ec), path, ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  OCTET_CHECK(in.is_open(), path, ": cannot open: ", std::strerror(errno));
  std::vector<std::pair<size_t, std::string>> lines;  // (1-based line number, text)
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) lines.emplace_back(n, line);
  }
  std::vector<std::pair<StepMetrics, std::string>> records;
  records.reserve(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string where = path + ":" + std::to_string(lines[i].first);
    if (i + 1 < lines.size()) {
      records.emplace_back(parse_metrics_line(lines[i].second, where), std::move(lines[i].second));
      continue;
    }
    // The last line may have been cut short by a crash in the middle of write(): drop it.
    try {
      records.emplace_back(parse_metrics_line(lines[i].second, where), std::move(lines[i].second));
    } catch (const Error&) {
    }
  }
  return records;
}

std::vector<StepMetrics> read_metrics(const std::string& path) {
  std::vector<StepMetrics> records;
  for (auto& record : read_records(path)) records.push_back(std::move(record.first));
  return records;
}

MetricsWriter::MetricsWriter(std::string path, std::ios::openmode mode) : path_(std::move(path)) {
  out_.open(path_, std::ios::binary | mode);
  OCTET_CHECK(out_.is_open(), path_, ": cannot open for writing: ", std::strerror(errno));
}

MetricsWriter MetricsWriter::fresh(const std::string& run_dir) {
  ensure_dir(run_dir);
  const std::string path = metrics_path(run_dir);
  return MetricsWriter(path, std::ios::out | std::ios::trunc);
}

MetricsWriter MetricsWriter::resume(const std::string& run_dir, int64_t resume_step) {
  ensure_dir(run_dir);
  const std::string path = metrics_path(run_dir);
  if (fs::exists(path)) {
    // Rewritten whole (atomically) rather than truncated in place: a torn last line has to go as
    // well, and a crash during the rewrite must not lose the records that are kept.
    std::string kept;
    for (const auto& [m, line] : read_records(path)) {
      if (m.step <= resume_step) kept += line + "\n";
    }
    io::write_text_file_atomic(path, kept);
  }
  return MetricsWriter(path, std::ios::app);
}

void MetricsWriter::write(const StepMetrics& m) {
  // One write of the whole line, then a flush: a crash loses at most the line being written.
  const std::string line = to_json_line(m) + "\n";
  out_.write(line.data(), static_cast<std::streamsize>(line.size()));
  out_.flush();
  OCTET_CHECK(out_.good(), path_, ": write failed at step ", m.step, ": ", std::strerror(errno));
}

MetricsSummary summarize_metrics(const std::vector<StepMetrics>& records) {
  MetricsSummary s;
  s.records = static_cast<int64_t>(records.size());
  std::vector<double> losses;  // finite losses of applied steps, in order
  for (const StepMetrics& m : records) {
    s.last_step = std::max(s.last_step, m.step);
    s.skipped += m.skipped ? 1 : 0;
    s.peak_mem_bytes = std::max(s.peak_mem_bytes, m.peak_mem_bytes);
    if (m.val_loss) s.final_val_loss = m.val_loss;
    if (!m.skipped && std::isfinite(m.loss)) losses.push_back(m.loss);
  }
  s.final_window = std::max<int64_t>(1, static_cast<int64_t>(losses.size()) / 10);
  if (losses.empty()) {
    s.final_window = 0;
    s.final_train_loss = kNaN;
  } else {
    double sum = 0;
    for (size_t i = losses.size() - s.final_window; i < losses.size(); ++i) sum += losses[i];
    s.final_train_loss = sum / static_cast<double>(s.final_window);
  }
  s.warmup_records = std::min(kMaxWarmupRecords, s.records / 2);
  double sum = 0;
  int64_t n = 0;
  for (size_t i = s.warmup_records; i < records.size(); ++i) {
    if (!std::isfinite(records[i].tokens_per_s)) continue;
    sum += records[i].tokens_per_s;
    ++n;
  }
  s.mean_tokens_per_s = n > 0 ? sum / static_cast<double>(n) : kNaN;
  return s;
}

}  // namespace octet::train
