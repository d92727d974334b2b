// The trainer_state.json reader (train/trainer_state.h) on arbitrary text: every input is either
// parsed or refused with octet::Error, and a parsed state holds what the format promises.
#include <cmath>
#include <cstdint>
#include <string_view>

#include "core/check.h"
#include "fuzz_util.h"
#include "train/trainer_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  octet::train::TrainerState s;
  try {
    s = octet::train::parse_trainer_state(text, "trainer_state.json");
  } catch (const octet::Error&) {
    return 0;
  }
  if (s.step < 0 || s.tokens_seen < 0) octet::fuzz::fail("a negative count was accepted");
  for (const double v : s.spike_window)
    if (!std::isfinite(v)) octet::fuzz::fail("a non-finite loss was accepted");
  return 0;
}
