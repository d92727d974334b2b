// octet: FP8 mixed-precision training for Mixture-of-Experts transformers.
// Catches every error of the library, prints one line and exits non-zero.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli.h"
#include "core/check.h"

namespace {

void print_usage() {
  std::printf("octet %s: FP8 mixed-precision training for MoE transformers\n\n", OCTET_VERSION);
  std::printf("usage: octet <command> [args] [--help]\n\ncommands:\n");
  for (const auto& c : octet::cli::commands())
    std::printf("  %-14s %s\n", c.name.c_str(), c.summary.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_usage();
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::printf("octet %s\n", OCTET_VERSION);
    return 0;
  }
  for (const auto& c : octet::cli::commands()) {
    if (c.name != args[0]) continue;
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    // Commands with sub-suites (bench) answer --help of a suite themselves.
    const bool own_help =
        c.name == "bench" && !rest.empty() && rest[0] != "--help" && rest[0] != "-h";
    for (const auto& a : own_help ? std::vector<std::string>{} : rest) {
      if (a == "--help" || a == "-h") {
        std::printf("%s\n", c.help.c_str());
        return 0;
      }
    }
    try {
      return c.run(rest);
    } catch (const std::exception& e) {
      // Messages quote names read from files, which may hold terminal escape sequences.
      std::fprintf(stderr, "octet %s: error: %s\n", c.name.c_str(),
                   octet::cli::printable(e.what()).c_str());
    }
    return 1;
  }
  std::fprintf(stderr, "octet: error: unknown command '%s' (see octet --help)\n", args[0].c_str());
  return 2;
}
