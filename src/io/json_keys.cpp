#include "io/json_keys.h"

#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

namespace octet::io {
namespace {

using Json = nlohmann::json;

// A SAX handler that keeps only the keys of the objects open at each moment.
class KeyChecker : public nlohmann::json_sax<Json> {
 public:
  std::optional<DuplicateKey> found;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    open_.push_back({pending_, {}});
    pending_.clear();
    return true;
  }
  bool key(string_t& k) override {
    Level& top = open_.back();
    if (!top.keys.insert(k).second && !found) found = DuplicateKey{k, open_.size(), top.parent_key};
    pending_ = k;
    return true;
  }
  bool end_object() override {
    open_.pop_back();
    return value();
  }
  bool start_array(std::size_t) override {
    open_.push_back({pending_, {}});
    pending_.clear();
    return true;
  }
  bool end_array() override {
    open_.pop_back();
    return value();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  struct Level {
    std::string parent_key;  // the key this object or array is the value of ("" in an array)
    std::unordered_set<std::string> keys;
  };
  // A value ends: the next value in an object comes after a new key.
  bool value() {
    pending_.clear();
    return true;
  }
  std::vector<Level> open_;
  std::string pending_;  // the key whose value comes next
};

}  // namespace

std::optional<DuplicateKey> find_duplicate_key(std::string_view text) {
  KeyChecker checker;
  if (!Json::sax_parse(text, &checker)) return std::nullopt;
  return checker.found;
}

}  // namespace octet::io
