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

void refuse_existing_output(const std::string& out, bool force) {
  std::error_code ec;
  OCTET_CHECK(force || !std::filesystem::exists(std::filesystem::symlink_status(out, ec)),
              "output ", out,
              " already exists; pass --force to replace it, or choose another path");
}

}  // namespace octet::cli
