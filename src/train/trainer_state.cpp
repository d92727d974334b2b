#include "train/trainer_state.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"

namespace octet::train {
namespace {

using Json = nlohmann::json;

const Json& required(const Json& j, const char* key, const std::string& source) {
  const auto it = j.find(key);
  OCTET_CHECK(it != j.end(), source, ": missing key '", key, "' (not a complete trainer state)");
  return *it;
}

// An integer that fits int64_t (nlohmann holds non-negative ones as uint64_t).
bool is_int64(const Json& v) {
  return v.is_number_integer() &&
         (!v.is_number_unsigned() ||
          v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
}

int64_t count(const Json& j, const char* key, const std::string& source) {
  const Json& v = required(j, key, source);
  OCTET_CHECK(is_int64(v) && v.get<int64_t>() >= 0, source, ": '", key,
              "' must be a non-negative integer, got ", v.dump());
  return v.get<int64_t>();
}

}  // namespace

TrainerState parse_trainer_state(std::string_view text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    OCTET_THROW(source, ": not valid JSON: ", e.what());
  }
  OCTET_CHECK(j.is_object(), source, ": expected a JSON object, got ", j.type_name());
  TrainerState s;
  s.step = count(j, "step", source);
  s.tokens_seen = count(j, "tokens_seen", source);

  const Json& sampler = required(j, "sampler", source);
  const bool ints = sampler.is_array() && sampler.size() == SamplerState::kSize &&
                    std::all_of(sampler.begin(), sampler.end(), is_int64);
  OCTET_CHECK(ints, source, ": 'sampler' must be an array of ", SamplerState::kSize,
              " integers, got ", sampler.dump());
  std::vector<int64_t> values;
  for (const Json& v : sampler) values.push_back(v.get<int64_t>());
  s.sampler = SamplerState::from_array(values);

  const Json& window = required(j, "spike_window", source);
  OCTET_CHECK(window.is_array(), source, ": 'spike_window' must be an array of losses, got ",
              window.type_name());
  for (const Json& v : window) {
    OCTET_CHECK(v.is_number() && std::isfinite(v.get<double>()), source,
                ": 'spike_window' must hold finite losses, got ", v.dump());
    s.spike_window.push_back(v.get<double>());
  }
  return s;
}

TrainerState read_trainer_state(const std::string& path) {
  std::error_code ec;
  OCTET_CHECK(std::filesystem::is_regular_file(path, ec), path,
              ": cannot open: ", ec ? ec.message() : "not a regular file");
  std::ifstream in(path, std::ios::binary);
  OCTET_CHECK(in, path, ": cannot open: ", std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_trainer_state(ss.str(), path);
}

}  // namespace octet::train
