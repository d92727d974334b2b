#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>

#include "cli.h"
#include "core/check.h"

namespace octet::cli {

Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& value_flags,
           const std::set<std::string>& switch_flags) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() < 3 || a.rfind("--", 0) != 0) {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (switch_flags.count(name)) {
      OCTET_CHECK(!inline_value, "flag --", name, " takes no value");
      switches_.insert(name);
    } else if (value_flags.count(name)) {
      if (!inline_value) {
        OCTET_CHECK(i + 1 < argv.size(), "flag --", name, " needs a value");
        value = argv[++i];
      }
      values_[name] = value;
    } else {
      OCTET_THROW("unknown flag --", name, " (see --help)");
    }
  }
}

bool Args::has(const std::string& flag) const {
  return switches_.count(flag) || values_.count(flag);
}

std::optional<std::string> Args::get(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::get_or(const std::string& flag, const std::string& fallback) const {
  return get(flag).value_or(fallback);
}

std::string Args::choice(const std::string& flag, const std::vector<std::string>& choices,
                         const std::string& fallback) const {
  std::string v = get_or(flag, fallback);
  std::string list;
  for (const auto& c : choices) {
    if (c == v) return v;
    list += (list.empty() ? "" : "|") + c;
  }
  OCTET_THROW("bad value '", v, "' for --", flag, ": expected ", list);
}

int64_t Args::get_int(const std::string& flag, int64_t fallback) const {
  const auto v = get(flag);
  if (!v) return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  OCTET_CHECK(!v->empty() && end && *end == '\0', "bad value '", *v, "' for --", flag,
              ": expected an integer");
  return x;
}

void Args::expect_positional(size_t min, size_t max, const std::string& usage) const {
  OCTET_CHECK(positional_.size() >= min && positional_.size() <= max, "expected ",
              min == max ? std::to_string(min) : std::to_string(min) + " to " + std::to_string(max),
              " arguments, got ", positional_.size(), "; usage: ", usage);
}

void refuse_output_over_input(const std::string& in, const std::string& out) {
  std::error_code ec;
  const bool same = std::filesystem::equivalent(in, out, ec);
  OCTET_CHECK(ec || !same, "output ", out, " is the input file ", in,
              "; writing it would destroy the input: choose another output path");
}

ExistingOutput existing_output(const Args& args) {
  return args.has("force") ? ExistingOutput::kReplace : ExistingOutput::kRefuse;
}

void refuse_existing_output(const std::string& out, ExistingOutput policy) {
  std::error_code ec;
  OCTET_CHECK(policy == ExistingOutput::kReplace ||
                  !std::filesystem::exists(std::filesystem::symlink_status(out, ec)),
              "output ", out,
              " already exists; pass --force to replace it, or choose another path");
}

namespace {

// Length of the valid UTF-8 sequence at the start of `s` (1 to 4), or 0 when it is not one
// (overlong forms, surrogates and code points above U+10FFFF included).
size_t utf8_length(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  size_t n = 0;
  uint32_t cp = 0;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1Fu;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0Fu;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07u;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xC0u) != 0x80u) return 0;
    cp = (cp << 6) | (b(i) & 0x3Fu);
  }
  const uint32_t min = n == 2 ? 0x80u : n == 3 ? 0x800u : 0x10000u;
  if (cp < min || cp > 0x10FFFFu || (cp >= 0xD800u && cp <= 0xDFFFu)) return 0;
  return n;
}

void append_hex(std::string& out, unsigned char c) {
  static const char kHex[] = "0123456789abcdef";
  out += "\\x";
  out += kHex[c >> 4];
  out += kHex[c & 0xFu];
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const auto c = static_cast<unsigned char>(text[0]);
    const size_t n = utf8_length(text);
    // C1 controls are U+0080..U+009F: encoded as C2 80..C2 9F.
    const bool c1 = n == 2 && c == 0xC2 && static_cast<unsigned char>(text[1]) < 0xA0;
    if (c == '\\') {
      out += "\\\\";
    } else if (n == 0 || c < 0x20 || c == 0x7F || c1) {
      for (size_t i = 0; i < std::max<size_t>(n, 1); ++i)
        append_hex(out, static_cast<unsigned char>(text[i]));
    } else {
      out.append(text.substr(0, n));
    }
    text.remove_prefix(std::max<size_t>(n, 1));
  }
  return out;
}

}  // namespace octet::cli
