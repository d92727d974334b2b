// Duplicate keys in JSON text. A parsed JSON object keeps one of two equal keys, so a reader that
// must refuse them (a tensor named twice in a safetensors header or a checkpoint index) looks at
// the text itself. nlohmann's parse callbacks would see every key too, but its callback parser
// rescans the enclosing object at the end of every nested object: quadratic in the key count
// (80k tensors: minutes).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace octet::io {

struct DuplicateKey {
  std::string key;
  size_t depth = 0;    // 1: a key of the top-level object, 2: of an object inside it, ...
  std::string parent;  // the key under which the object holding it sits ("" at depth 1)
};

// The first key that occurs twice in one object of `text`, in one linear pass; nullopt when there
// is none, and also when `text` is not valid JSON (the caller's parser reports that).
std::optional<DuplicateKey> find_duplicate_key(std::string_view text);

}  // namespace octet::io
