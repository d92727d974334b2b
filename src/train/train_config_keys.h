// The table of TrainConfig's keys (internal to train/): each key's dotted name, type, comment and
// accessors. train_config.cpp drives parsing, --set, to_toml, operator== and the unknown-key
// messages from it, so a key added here once is known everywhere.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "train/train_config.h"

namespace octet::train {

using ConfigStrings = std::vector<std::string>;
using ConfigValue = std::variant<bool, int64_t, double, std::string, ConfigStrings>;
enum class ConfigType : uint8_t { kBool, kInt, kFloat, kString, kStringList };

struct ConfigKey {
  std::string name;  // dotted: "optim.lr"
  ConfigType type;
  const char* doc;
  ConfigStrings choices;  // the values of an enum key (a kString)
  std::function<ConfigValue(const TrainConfig&)> get;
  std::function<void(TrainConfig&, const ConfigValue&)> set;
  bool emitted = true;  // false: accepted but not written (model.config is resolved inline)
};

// Every key, in to_toml's order (a section's keys together).
const std::vector<ConfigKey>& config_keys();

}  // namespace octet::train
