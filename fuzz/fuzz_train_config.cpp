// The TOML run config (train/train_config.h) on arbitrary text, followed by --set overrides.
//
// Input: TOML text, then optionally a NUL byte and NUL-separated `key=value` assignments, applied
// with apply_set in order as `octet train --set` does. Every input is either taken or refused with
// octet::Error; a config that validates must come back unchanged from to_toml and
// parse_train_config (the run saves and resumes through exactly that).
//
// The harness runs in its own scratch directory holding a config.json, so that `model.config =
// "config.json"` in the corpus reads a real file and no relative path reaches the caller's files.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/check.h"
#include "fuzz_util.h"
#include "model/config.h"
#include "train/train_config.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string& dir = octet::fuzz::scratch_dir();
  octet::write_model_config(dir + "/config.json", octet::train::default_model_config());
  if (::chdir(dir.c_str()) != 0) {
    std::perror("octet fuzz: chdir");
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  const size_t nul = rest.find('\0');
  const std::string_view toml = rest.substr(0, nul);
  rest = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
  octet::train::TrainConfig c;
  try {
    c = octet::train::parse_train_config(toml, "input.toml");
    while (!rest.empty()) {
      const size_t end = rest.find('\0');
      octet::train::apply_set(c, rest.substr(0, end));
      rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    }
    c.validate();
  } catch (const octet::Error&) {
    return 0;
  }
  const std::string saved = octet::train::to_toml(c);
  octet::train::TrainConfig back;
  try {
    back = octet::train::parse_train_config(saved, "config.toml");
  } catch (const octet::Error& e) {
    octet::fuzz::fail(std::string("the saved config does not read back: ") + e.what() + "\n" +
                      saved);
  }
  if (!(back == c)) octet::fuzz::fail("the saved config reads back different:\n" + saved);
  return 0;
}
