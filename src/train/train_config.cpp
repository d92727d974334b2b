// TrainConfig: one table of keys (train_config_keys.h: name, type, comment, accessors) drives
// parsing, --set, to_toml and the unknown-key messages, so a key added once is known everywhere.
#include "train/train_config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <variant>

// Header-only use of toml++ (its default); only this file includes it.
#include <toml++/toml.h>

#include "core/check.h"
#include "train/train_config_keys.h"

namespace octet::train {

ModelConfig default_model_config() {
  // Placeholders until the model is tuned: small enough for a 2-core CPU run of a few minutes.
  ModelConfig m;
  m.vocab_size = 257;  // the byte tokenizer: 256 bytes + end of text
  m.hidden_size = 128;
  m.intermediate_size = 384;
  m.moe_intermediate_size = 128;
  m.num_hidden_layers = 2;
  m.first_k_dense_replace = 1;
  m.num_attention_heads = 4;
  m.max_position_embeddings = 512;
  m.q_lora_rank = 64;
  m.kv_lora_rank = 32;
  m.qk_nope_head_dim = 32;
  m.qk_rope_head_dim = 16;
  m.v_head_dim = 32;
  m.n_routed_experts = 8;
  m.n_shared_experts = 1;
  m.num_experts_per_tok = 2;
  m.n_group = 2;  // must divide n_routed_experts
  m.topk_group = 1;
  m.num_nextn_predict_layers = 1;
  return m;
}

namespace {

using StringList = ConfigStrings;
using Value = ConfigValue;
using Type = ConfigType;
using Key = ConfigKey;

const std::vector<Key>& keys() {
  return config_keys();
}

std::string section_of(const std::string& name) {
  const size_t dot = name.find('.');
  return dot == std::string::npos ? "" : name.substr(0, dot);
}

const Key* find_key(const std::string& name) {
  for (const Key& k : keys())
    if (k.name == name) return &k;
  return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string leaf(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// "unknown key optim.lrr (did you mean optim.lr?); keys of [optim]: lr, min_lr, ..."
[[noreturn]] void unknown_key(const std::string& where, const std::string& name) {
  StringList close;
  for (const Key& k : keys()) {
    const size_t d = std::min(edit_distance(name, k.name), edit_distance(leaf(name), leaf(k.name)));
    const bool prefix = leaf(name).size() >= 3 && leaf(k.name).rfind(leaf(name), 0) == 0;
    if (d <= std::max<size_t>(2, leaf(name).size() / 4) || prefix) close.push_back(k.name);
  }
  const std::string section = section_of(name);
  std::set<std::string> sections;
  std::string valid;
  for (const Key& k : keys()) {
    if (!section_of(k.name).empty()) sections.insert(section_of(k.name));
    if (section_of(k.name) == section)
      valid += (valid.empty() ? "" : ", ") + (section.empty() ? k.name : leaf(k.name));
  }
  std::ostringstream os;
  os << where << ": unknown key " << name;
  if (!close.empty()) {
    os << " (did you mean ";
    for (size_t i = 0; i < close.size() && i < 4; ++i) os << (i ? " or " : "") << close[i];
    os << "?)";
  }
  if (valid.empty()) {
    os << "; sections:";
    for (const auto& s : sections) os << " [" << s << "]";
  } else {
    os << "; keys " << (section.empty() ? "at the top level" : "of [" + section + "]") << ": "
       << valid;
    if (section.empty()) {
      os << "; sections:";
      for (const auto& s : sections) os << " [" << s << "]";
    }
  }
  OCTET_THROW(os.str());
}

const char* type_desc(Type t) {
  switch (t) {
    case Type::kBool:
      return "true or false";
    case Type::kInt:
      return "an integer";
    case Type::kFloat:
      return "a number";
    case Type::kString:
      return "a string";
    default:
      return "an array of strings";
  }
}

std::string node_text(const toml::node& n) {
  std::ostringstream os;
  n.visit([&](const auto& v) { os << v; });
  return os.str();
}

std::string where_of(const std::string& source, const toml::node& n) {
  const auto& b = n.source().begin;
  if (b.line == 0) return source;
  return source + ":" + std::to_string(b.line) + ":" + std::to_string(b.column);
}

// Converts a TOML value to the key's type; the error names the place and the key.
Value to_value(const Key& k, const toml::node& n, const std::string& where) {
  auto fail = [&]() {
    OCTET_THROW(where, ": ", k.name, " must be ", type_desc(k.type), ", got ", n.type(), " ",
                node_text(n));
  };
  switch (k.type) {
    case Type::kBool:
      if (!n.is_boolean()) fail();
      return *n.value<bool>();
    case Type::kInt:
      if (!n.is_integer()) fail();
      return *n.value<int64_t>();
    case Type::kFloat:
      if (!n.is_number()) fail();
      return *n.value<double>();
    case Type::kString: {
      if (!n.is_string()) fail();
      std::string s = *n.value<std::string>();
      if (!k.choices.empty() &&
          std::find(k.choices.begin(), k.choices.end(), s) == k.choices.end()) {
        std::string list;
        for (const auto& c : k.choices) list += (list.empty() ? "" : ", ") + c;
        OCTET_THROW(where, ": ", k.name, " must be one of ", list, "; got '", s, "'");
      }
      return s;
    }
    case Type::kStringList: {
      const toml::array* a = n.as_array();
      if (!a) fail();
      StringList out;
      for (const toml::node& e : *a) {
        if (!e.is_string()) fail();
        out.push_back(*e.value<std::string>());
      }
      return out;
    }
  }
  fail();
  return {};
}

// Sets one key, prefixing errors of the setter (a config.json that fails to read) with the place.
void set_key(TrainConfig& c, const Key& k, const Value& v, const std::string& where) {
  try {
    k.set(c, v);
  } catch (const Error& e) {
    OCTET_THROW(where, ": ", k.name, ": ", e.what());
  }
}

std::string format_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest text that reads back to the same double, so to_toml round-trips exactly.
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20 || u == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04X", u);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string format_value(const Value& v) {
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return format_float(*d);
  if (const auto* s = std::get_if<std::string>(&v)) return quote(*s);
  std::string out = "[";
  const auto& list = std::get<StringList>(v);
  for (size_t i = 0; i < list.size(); ++i) out += (i ? ", " : "") + quote(list[i]);
  return out + "]";
}

// toml++ 3.3 (Debian 12's) reaches __builtin_unreachable, undefined behaviour, when it asks whether
// some non-ASCII code points (U+00A1..U+0499 among them) are whitespace: marzer/tomlplusplus
// issues 190 and 295, found again here by fuzz/fuzz_train_config. It asks only at places where
// TOML allows ASCII alone, and in a multi-line basic string after a backslash. So before toml++
// sees a text: non-ASCII outside strings and comments is refused (TOML 1.0 allows it only there),
// as is non-ASCII right after a backslash (no escape starts so), and the first character after a
// line-ending backslash, when not ASCII, is written as its \U escape, which means the same.
// A quote opens a string only where TOML lets one start (a key at the start of a line, after '.',
// '[' or '{' or ',', a value after '=', '[' or ','): elsewhere (`steps = -"x`) toml++ reads it as
// part of a malformed value, asking about every character up to the value's end, so what follows
// is outside a string here too.
std::string guard_toml_text(std::string_view text, const std::string& source) {
  enum class In : uint8_t { kTop, kComment, kBasic, kMultiBasic, kLiteral, kMultiLiteral };
  In in = In::kTop;
  char prev = '\n';  // the last character outside strings and comments that is not a blank
  std::string out;
  out.reserve(text.size());
  int64_t line = 1, column = 1;
  size_t i = 0;
  auto non_ascii = [&](size_t at) { return static_cast<unsigned char>(text[at]) >= 0x80; };
  auto fail = [&](const char* what) { OCTET_THROW(source, ":", line, ":", column, ": ", what); };
  auto take = [&](size_t n) {  // copies n bytes, counting lines and columns
    for (size_t k = 0; k < n && i < text.size(); ++k, ++i) {
      out += text[i];
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
        ++column;
      }
    }
  };
  auto starts = [&](std::string_view s) { return text.substr(i, s.size()) == s; };
  auto space = [](char c) { return c == ' ' || c == '\t'; };
  if (starts("\xEF\xBB\xBF")) take(3);  // a byte order mark, which toml++ skips
  while (i < text.size()) {
    const char ch = text[i];
    if (in == In::kTop) {
      if (non_ascii(i)) fail("non-ASCII character outside a string or comment");
      const bool string_may_start = std::string_view("\n=[{,.").find(prev) != std::string::npos;
      if (string_may_start && (starts(R"(""")") || starts("'''"))) {
        in = ch == '"' ? In::kMultiBasic : In::kMultiLiteral;
        take(3);
        continue;
      }
      if (ch == '#') in = In::kComment;
      if (ch == '"' && string_may_start) in = In::kBasic;
      if (ch == '\'' && string_may_start) in = In::kLiteral;
      if (ch != ' ' && ch != '\t' && ch != '\r') prev = ch;
      take(1);
    } else if (in == In::kComment) {
      if (ch == '\n') in = In::kTop, prev = '\n';
      take(1);
    } else if (in == In::kBasic || in == In::kLiteral) {
      if (in == In::kBasic && ch == '\\') {
        if (i + 1 < text.size() && non_ascii(i + 1)) fail("non-ASCII character after '\\'");
        take(2);
        continue;
      }
      if (ch == '\n' || ch == (in == In::kBasic ? '"' : '\'')) in = In::kTop, prev = ch;
      take(1);
    } else {
      const std::string_view close = in == In::kMultiBasic ? R"(""")" : "'''";
      if (starts(close)) {
        size_t n = 3;  // up to two more quotes belong to the string
        while (n < 5 && i + n < text.size() && text[i + n] == close[0]) ++n;
        take(n);
        in = In::kTop;
        prev = close[0];
        continue;
      }
      if (in == In::kMultiLiteral || ch != '\\') {
        take(1);
        continue;
      }
      if (i + 1 < text.size() && non_ascii(i + 1)) fail("non-ASCII character after '\\'");
      size_t j = i + 1;
      while (j < text.size() && space(text[j])) ++j;
      if (j >= text.size() || (text[j] != '\n' && text[j] != '\r')) {
        take(2);  // an escape: the backslash and the ASCII character after it
        continue;
      }
      while (j < text.size() && (space(text[j]) || text[j] == '\n' || text[j] == '\r')) ++j;
      take(j - i);  // the line-ending backslash and the whitespace it removes
      if (i >= text.size() || !non_ascii(i)) continue;
      const auto c0 = static_cast<unsigned char>(text[i]);
      const size_t n = c0 >= 0xF0 ? 4 : c0 >= 0xE0 ? 3 : c0 >= 0xC0 ? 2 : 1;
      if (n == 1 || i + n > text.size()) {
        take(1);  // not UTF-8: toml++'s reader refuses it before asking about whitespace
        continue;
      }
      uint32_t cp = c0 & (0x7Fu >> n);
      for (size_t k = 1; k < n; ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3Fu);
      char buf[16];
      std::snprintf(buf, sizeof buf, "\\U%08X", static_cast<unsigned>(cp));
      out += buf;
      i += n;
      ++column;
    }
  }
  return out;
}

}  // namespace

bool operator==(const TrainConfig& a, const TrainConfig& b) {
  // Every key of the table (the model's extra keys as JSON text).
  for (const Key& k : keys())
    if (k.get(a) != k.get(b)) return false;
  return true;
}

TrainConfig parse_train_config(std::string_view text, const std::string& source) {
  toml::table root;
  const std::string guarded = guard_toml_text(text, source);
  try {
    root = toml::parse(guarded, source);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    OCTET_THROW(source, ":", b.line, ":", b.column, ": ", e.description());
  }
  TrainConfig c;
  // init_from, then model.config: the inline model keys apply over them whatever their order.
  if (const toml::node* init = root.get("init_from")) {
    const Key& k = *find_key("init_from");
    set_key(c, k, to_value(k, *init, where_of(source, *init)), where_of(source, *init));
  }
  if (const toml::table* m = root["model"].as_table()) {
    if (const toml::node* path = m->get("config")) {
      const Key& k = *find_key("model.config");
      set_key(c, k, to_value(k, *path, where_of(source, *path)), where_of(source, *path));
    }
  }
  for (const auto& [name, node] : root) {
    const std::string top(name.str());
    const toml::table* section = node.as_table();
    if (!section) {
      const Key* k = find_key(top);
      if (!k) unknown_key(where_of(source, node), top);
      if (top == "init_from") continue;
      set_key(c, *k, to_value(*k, node, where_of(source, node)), where_of(source, node));
      continue;
    }
    if (section->empty()) {
      bool known = false;
      for (const Key& k : keys()) known = known || section_of(k.name) == top;
      if (!known) unknown_key(where_of(source, node), top);
    }
    for (const auto& [sub, value] : *section) {
      const std::string full = top + "." + std::string(sub.str());
      const Key* k = find_key(full);
      if (!k || value.is_table()) unknown_key(where_of(source, value), full);
      if (full == "model.config") continue;
      set_key(c, *k, to_value(*k, value, where_of(source, value)), where_of(source, value));
    }
  }
  return c;
}

void apply_set(TrainConfig& c, std::string_view assignment) {
  const size_t eq = assignment.find('=');
  OCTET_CHECK(eq != std::string_view::npos, "--set ", assignment, ": expected key=value");
  auto trim = [](std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    return std::string(s);
  };
  const std::string name = trim(assignment.substr(0, eq));
  const std::string raw = trim(assignment.substr(eq + 1));
  const std::string where = "--set " + std::string(assignment);
  const Key* k = find_key(name);
  if (!k) unknown_key("--set " + name, name);
  // The value is TOML when it parses as one value; a string key also takes bare text.
  std::optional<toml::table> parsed;
  try {
    parsed = toml::parse(guard_toml_text("v = " + raw, where));
  } catch (const toml::parse_error&) {
  } catch (const Error&) {  // not TOML (guard_toml_text): bare text
  }
  const toml::node* n = parsed && parsed->size() == 1 ? parsed->get("v") : nullptr;
  Value v;
  if (k->type == Type::kString && (!n || !n->is_string())) {
    v = raw;
    if (!k->choices.empty()) {
      toml::value<std::string> s(raw);
      v = to_value(*k, s, where);
    }
  } else if (k->type == Type::kStringList && (!n || !n->is_array())) {
    v = raw.empty() ? StringList{} : StringList{raw};
  } else if (!n) {
    OCTET_THROW(where, ": ", name, " must be ", type_desc(k->type), ", got '", raw, "'");
  } else {
    v = to_value(*k, *n, where);
  }
  set_key(c, *k, v, where);
}

std::string to_toml(const TrainConfig& c) {
  std::ostringstream os;
  std::string section;
  bool first = true;
  auto flush_line = [&](const std::string& body, const char* doc) {
    os << body;
    if (doc && *doc) os << std::string(body.size() < 40 ? 40 - body.size() : 1, ' ') << "# " << doc;
    os << '\n';
  };
  for (const Key& k : keys()) {
    if (!k.emitted) continue;
    const Value v = k.get(c);
    if (k.name == "model.extra" && std::get<std::string>(v).empty()) continue;
    const std::string sec = section_of(k.name);
    if (sec != section || first) {
      if (!sec.empty()) os << (first ? "" : "\n") << '[' << sec << "]\n";
      section = sec;
      first = false;
    }
    flush_line(leaf(k.name) + " = " + format_value(v), k.doc);
  }
  return os.str();
}

std::string default_train_config_toml() {
  return "# octet train: the built-in default configuration. Every key can be overridden with\n"
         "# --set key=value (dotted names: --set optim.lr=1e-3); keys left out keep these values.\n"
         "# The [model] section takes DeepseekV3Config's names, or config = "
         "\"path/config.json\".\n\n" +
         to_toml(TrainConfig{});
}

std::vector<std::string> train_config_keys() {
  std::vector<std::string> out;
  for (const Key& k : keys()) out.push_back(k.name);
  return out;
}

std::vector<ConfigChange> config_changes(const TrainConfig& before, const TrainConfig& after) {
  std::vector<ConfigChange> out;
  for (const Key& k : keys()) {
    if (!k.emitted) continue;
    const std::string a = format_value(k.get(before)), b = format_value(k.get(after));
    if (a != b) out.push_back({k.name, a, b});
  }
  return out;
}

std::string init_checkpoint_dir(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  OCTET_CHECK(fs::is_directory(path, ec), "init_from = \"", path, "\": not a directory");
  if (fs::is_regular_file(fs::path(path) / "config.json", ec)) return path;
  std::ifstream latest(fs::path(path) / "checkpoints" / "latest");
  std::string name;
  OCTET_CHECK(latest >> name, "init_from = \"", path,
              "\": neither a checkpoint (no config.json) nor a run directory (no "
              "checkpoints/latest)");
  std::string dir = (fs::path(path) / "checkpoints" / name).string();
  OCTET_CHECK(fs::is_regular_file(fs::path(dir) / "config.json", ec), "init_from = \"", path,
              "\": checkpoints/latest names ", name, ", which is missing or incomplete");
  return dir;
}

bool resume_may_change(const std::string& key) {
  // The same model and batch: a checkpoint depends neither on the grid (parallel.ep) nor on how
  // attention's backward sums (model.deterministic_attention).
  static const std::set<std::string> safe = {"steps",
                                             "checkpoint_every",
                                             "keep_checkpoints",
                                             "log_every",
                                             "sites_every",
                                             "device",
                                             "eval.every",
                                             "eval.batches",
                                             "optim.fused_prepare",
                                             "optim.fused_prepare_fp8",
                                             "cuda_graphs",
                                             "parallel.ep",
                                             "model.deterministic_attention"};
  return safe.count(key) > 0 || section_of(key) == "safety";
}

LrSchedule TrainConfig::lr_schedule() const {
  LrSchedule s;
  s.kind = optim.schedule;
  s.lr = optim.lr;
  s.min_lr = optim.min_lr;
  // A short trial run (steps below the warm-up) warms up over all of its steps; the trainer says
  // so.
  s.warmup_steps = std::min(optim.warmup_steps, steps);
  s.warmup_init = optim.warmup_init;
  s.total_steps = steps;
  return s;
}

AdamWConfig TrainConfig::adamw() const {
  AdamWConfig a;
  a.lr = static_cast<float>(optim.lr);
  a.beta1 = static_cast<float>(optim.beta1);
  a.beta2 = static_cast<float>(optim.beta2);
  a.eps = static_cast<float>(optim.eps);
  a.weight_decay = static_cast<float>(optim.weight_decay);
  a.grad_clip = static_cast<float>(optim.grad_clip);
  return a;
}

Recipe TrainConfig::resolved_recipe() const {
  return resolve_recipe(model.recipe);
}

namespace {

// The offset of the first byte of `s` that does not start valid UTF-8 (RFC 3629: no overlong
// forms, surrogates or code points above U+10FFFF), or npos when all of it is valid.
size_t invalid_utf8_at(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 1;
    uint32_t cp = c;
    if (c >= 0xC2 && c <= 0xDF) {
      n = 2, cp = c & 0x1Fu;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3, cp = c & 0x0Fu;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4, cp = c & 0x07u;
    } else if (c >= 0x80) {
      return i;
    }
    if (s.size() - i < n) return i;
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0u) != 0x80u) return i;
      cp = (cp << 6) | (b & 0x3Fu);
    }
    const uint32_t min = n == 1 ? 0 : n == 2 ? 0x80u : n == 3 ? 0x800u : 0x10000u;
    if (cp < min || cp > 0x10FFFFu || (cp >= 0xD800u && cp <= 0xDFFFu)) return i;
    i += n;
  }
  return std::string_view::npos;
}

// TOML text is UTF-8, so the run's config.toml can hold only UTF-8 strings: a value from --set
// (bare text is taken as is) that is not would be saved as a config.toml no resume can read.
void check_utf8(const std::string& key, const std::string& value) {
  const size_t at = invalid_utf8_at(value);
  if (at == std::string_view::npos) return;
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02x",
                static_cast<unsigned>(static_cast<unsigned char>(value[at])));
  OCTET_THROW(key, " is not valid UTF-8 (byte ", byte, " at offset ", at,
              "); the run's config.toml, TOML, holds UTF-8 text only");
}

}  // namespace

void TrainConfig::validate() const {
  for (const Key& k : keys()) {
    if (k.type != Type::kString && k.type != Type::kStringList) continue;
    const Value v = k.get(*this);
    if (const auto* str = std::get_if<std::string>(&v)) check_utf8(k.name, *str);
    if (const auto* list = std::get_if<StringList>(&v))
      for (const std::string& e : *list) check_utf8(k.name, e);
  }
  auto at_least = [](const char* key, int64_t v, int64_t lo) {
    OCTET_CHECK(v >= lo, key, " must be >= ", lo, ", got ", v);
  };
  auto in_range = [](const char* key, double v, double lo, double hi, const char* rule) {
    OCTET_CHECK(std::isfinite(v) && v >= lo && v <= hi, key, " must be ", rule, ", got ", v);
  };
  OCTET_CHECK(!run_dir.empty(), "run_dir must not be empty");
  at_least("steps", steps, 1);
  at_least("checkpoint_every", checkpoint_every, -1);
  at_least("keep_checkpoints", keep_checkpoints, 0);
  at_least("seed", seed, 0);
  at_least("batch_size", batch_size, 1);
  at_least("seq_len", seq_len, 1);
  at_least("grad_accum", grad_accum, 1);
  at_least("parallel.ep", parallel.ep, 1);
  OCTET_CHECK(
      parallel.ep == 1 || (model.n_routed_experts > 0 && model.n_routed_experts % parallel.ep == 0),
      "parallel.ep = ", parallel.ep,
      " must divide model.n_routed_experts = ", model.n_routed_experts,
      " (each EP rank holds n_routed_experts / ep experts)");
  at_least("log_every", log_every, 1);
  at_least("sites_every", sites_every, 0);
  // Token counts are int64 (and a micro-batch's rows a 32-bit GEMM dimension): no product wraps.
  int64_t micro_tokens = 0, step_tokens = 0;
  OCTET_CHECK(!__builtin_mul_overflow(batch_size, seq_len, &micro_tokens) &&
                  micro_tokens <= (int64_t{1} << 31) - 1,
              "batch_size * seq_len (", batch_size, " * ", seq_len,
              ") must be <= 2147483647 tokens per micro-batch");
  OCTET_CHECK(!__builtin_mul_overflow(micro_tokens, grad_accum, &step_tokens) &&
                  step_tokens <= (int64_t{1} << 53),
              "batch_size * seq_len * grad_accum must be <= 2^53 tokens per step, got ",
              micro_tokens, " * ", grad_accum);
  OCTET_CHECK(seq_len <= model.max_position_embeddings, "seq_len (", seq_len,
              ") must be <= model.max_position_embeddings (", model.max_position_embeddings, ")");
  resolved_recipe();

  // The optimizer runs in FP32: a rate past FP32's range would become infinity there.
  OCTET_CHECK(std::isfinite(optim.lr) && optim.lr > 0 && optim.lr <= 3.4e38,
              "optim.lr must be > 0 and finite in FP32 (<= 3.4e38), got ", optim.lr);
  in_range("optim.min_lr", optim.min_lr, 0, optim.lr, "in [0, optim.lr]");
  at_least("optim.warmup_steps", optim.warmup_steps, 0);
  OCTET_CHECK(optim.warmup_init >= 0 && optim.warmup_init < 1,
              "optim.warmup_init must be in [0, 1), got ", optim.warmup_init);
  in_range("optim.weight_decay", optim.weight_decay, 0, HUGE_VAL, ">= 0");
  OCTET_CHECK(optim.beta1 >= 0 && optim.beta1 < 1, "optim.beta1 must be in [0, 1), got ",
              optim.beta1);
  OCTET_CHECK(optim.beta2 >= 0 && optim.beta2 < 1, "optim.beta2 must be in [0, 1), got ",
              optim.beta2);
  OCTET_CHECK(std::isfinite(optim.eps) && optim.eps > 0, "optim.eps must be > 0, got ", optim.eps);
  in_range("optim.grad_clip", optim.grad_clip, 0, HUGE_VAL, ">= 0 (0: no clipping)");
  in_range("optim.bucket_mb", optim.bucket_mb, 1.0 / 1024, 65536, "in [1/1024, 65536] MiB");

  OCTET_CHECK(data.text.empty() || data.shards.empty(),
              "data.text and data.shards are exclusive: set one (both are set)");
  OCTET_CHECK(data.megatron.empty() || (data.text.empty() && data.shards.empty()),
              "data.megatron excludes data.text and data.shards: set one");
  OCTET_CHECK(data.val_fraction >= 0 && data.val_fraction < 1,
              "data.val_fraction must be in [0, 1), got ", data.val_fraction);
  at_least("eval.every", eval.every, 0);
  at_least("eval.batches", eval.batches, 1);
  OCTET_CHECK(eval.every == 0 || data.val_fraction > 0,
              "eval.every > 0 needs held-out data: data.val_fraction must be > 0");

  OCTET_CHECK(safety.spike_window == 0 || safety.spike_window >= 2,
              "safety.spike_window must be 0 (off) or >= 2 (a standard deviation needs two), got ",
              safety.spike_window);
  OCTET_CHECK(std::isfinite(safety.spike_threshold) && safety.spike_threshold > 0,
              "safety.spike_threshold must be > 0, got ", safety.spike_threshold);
  at_least("safety.shadow_bf16", safety.shadow_bf16, 0);
  at_least("safety.max_skipped_in_a_row", safety.max_skipped_in_a_row, 0);

  try {
    model.validate();
  } catch (const Error& e) {
    // ModelConfig says "config: <field> ..."; here the field is a key of [model].
    std::string msg = e.what();
    if (msg.rfind("config: ", 0) == 0) {
      msg = msg.substr(8);
      if (msg.rfind("octet_", 0) == 0) msg = msg.substr(6);
      OCTET_THROW("model.", msg);
    }
    OCTET_THROW("model: ", msg);
  }
}

}  // namespace octet::train
