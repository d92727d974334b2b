// trainer_state.json: where a run stands, saved in every training checkpoint beside the weights,
// the optimizer and the recipe state (trainer.h has the checkpoint layout):
//   {"step": N, "tokens_seen": N, "sampler": [5 integers: SamplerState::to_array()],
//    "spike_window": [the finite losses of the spike statistics, oldest first]}
// Keys octet does not know are ignored, so a newer file still reads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "train/data.h"

namespace octet::train {

struct TrainerState {
  int64_t step = 0;  // optimizer steps done
  int64_t tokens_seen = 0;
  SamplerState sampler;
  std::vector<double> spike_window;
};

// Parses and checks the text of a trainer_state.json: every key present with its type (counts
// non-negative, the sampler's five integers, finite losses). Each error is one line naming `source`
// and the key, e.g. "ckpt/trainer_state.json: missing key 'sampler'".
TrainerState parse_trainer_state(std::string_view text, const std::string& source);

// The file at `path` (a regular file), parsed as above.
TrainerState read_trainer_state(const std::string& path);

}  // namespace octet::train
