// The octet command line: a table of commands and a small argument parser shared by all of them.
//
// This directory is the only code that reads argv, the environment and config files. Each command
// lives in its own cmd_<name>.cpp and registers itself in commands.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace octet::cli {

// Flags and positionals of one command line. Declared flags only: anything else is an error.
class Args {
 public:
  // `value_flags` take a value (`--name v` or `--name=v`); `switch_flags` take none.
  Args(const std::vector<std::string>& argv, const std::set<std::string>& value_flags,
       const std::set<std::string>& switch_flags);

  const std::vector<std::string>& positional() const { return positional_; }
  bool has(const std::string& flag) const;
  std::optional<std::string> get(const std::string& flag) const;
  std::string get_or(const std::string& flag, const std::string& fallback) const;
  // Checks that the value is one of `choices`; the error lists them.
  std::string choice(const std::string& flag, const std::vector<std::string>& choices,
                     const std::string& fallback) const;
  int64_t get_int(const std::string& flag, int64_t fallback) const;
  void expect_positional(size_t min, size_t max, const std::string& usage) const;

 private:
  std::vector<std::string> positional_;
  std::map<std::string, std::string> values_;
  std::set<std::string> switches_;
};

// Throws when `out` names the same file as `in` (through any path, link or hard link): a command
// that writes OUT must never replace its own input, which it is still reading.
void refuse_output_over_input(const std::string& in, const std::string& out);

// Whether a command may replace an output that already exists: only when asked to (--force).
enum class ExistingOutput : uint8_t { kRefuse, kReplace };
ExistingOutput existing_output(const Args& args);  // kReplace when --force was given

// Throws when `out` exists and `policy` is kRefuse.
void refuse_existing_output(const std::string& out, ExistingOutput policy);

// `text` (a tensor name, a path: anything read from a file) made safe to print on a terminal: every
// byte a terminal would act on (C0 controls such as ESC, DEL, the C1 controls U+0080..U+009F) and
// every byte that is not part of valid UTF-8 is written as \xNN, and a backslash as \\, so the
// output shows the name unambiguously and can never move the cursor or recolour the terminal.
std::string printable(std::string_view text);

struct Command {
  std::string name;
  std::string summary;  // one line, for `octet --help`
  std::string help;     // full usage text, for `octet NAME --help`
  std::function<int(const std::vector<std::string>&)> run;
};

const std::vector<Command>& commands();

// Declared in the cmd_*.cpp files.
Command info_command();
Command quantize_command();
Command dequantize_command();
Command quant_report_command();
Command moe_report_command();
Command bench_command();
Command gemm_command();
Command init_command();
Command describe_command();
Command compare_command();
Command eval_command();
Command train_command();
Command prepare_command();
Command export_command();

}  // namespace octet::cli
