// What the harnesses share: a private scratch directory, and the rule that a reader may only refuse
// an input with octet::Error (one line naming the file). Any other exception escapes the harness,
// and libFuzzer records it as a crash.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace octet::fuzz {

// A directory only this process uses (mkdtemp: mode 0700, a fresh name), removed at exit. The name
// is never destroyed: the exit handler that removes the directory runs after static destructors.
inline const std::string& scratch_dir() {
  static const std::string* const dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "octet_fuzz_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) {
      std::perror("octet fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return new std::string(tmpl);
  }();
  return *dir;
}

// Stops the run with a message: an invariant of a reader does not hold for this input.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "octet fuzz: invariant violated: %s\n", what.c_str());
  std::abort();
}

}  // namespace octet::fuzz
