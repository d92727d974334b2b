#include <cstdio>

#include "bench.h"
#include "cli.h"

namespace octet::cli {

static std::string bench_help() {
  std::string h =
      "usage: octet bench <suite> [flags]   (octet bench <suite> --help for its "
      "flags)\n\nsuites:\n";
  for (const auto& s : bench::suites())
    h += "  " + s.name + std::string(12 - std::min<size_t>(11, s.name.size()), ' ') + s.summary +
         "\n";
  return h;
}

static int run_bench(const std::vector<std::string>& argv) {
  OCTET_CHECK(!argv.empty(), "missing suite; ", bench_help());
  for (const auto& s : bench::suites()) {
    if (s.name != argv[0]) continue;
    const std::vector<std::string> rest(argv.begin() + 1, argv.end());
    for (const auto& a : rest) {
      if (a == "--help" || a == "-h") {
        std::printf("%s\n", s.help.c_str());
        return 0;
      }
    }
    return s.run(rest);
  }
  OCTET_THROW("unknown bench suite '", argv[0], "'; ", bench_help());
}

Command bench_command() {
  return {"bench", "GPU benchmarks (quantize, ...): throughput and ratios to baselines",
          bench_help(), run_bench};
}

}  // namespace octet::cli
