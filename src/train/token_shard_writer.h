// Tokens accumulating into numbered shards `<prefix>_NNNNNN.bin` in a directory, shard_tokens
// each (the last may be shorter), each written by io::write_token_shard: what the byte-level
// preparation of text (train/data.h) and the tokenized preparation (train/prepare.h) both make.
// Internal to train/.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "io/token_shard.h"

namespace octet {

// T: uint16_t writes the GPT-2 form; uint32_t writes `type`'s form (io/token_shard.h).
template <typename T>
class TokenShardWriter {
 public:
  TokenShardWriter(std::string dir, std::string prefix, int64_t shard_tokens,
                   io::ShardTokens type = io::ShardTokens::kU16)
      : dir_(std::move(dir)),
        prefix_(std::move(prefix)),
        shard_tokens_(shard_tokens),
        type_(type) {}

  // One document: the end-of-text token, then its tokens. Every full shard is written.
  void add_document(T eot, std::span<const T> doc) {
    buffer_.push_back(eot);
    buffer_.insert(buffer_.end(), doc.begin(), doc.end());
    tokens_ += static_cast<int64_t>(doc.size()) + 1;
    ++documents_;
    while (static_cast<int64_t>(buffer_.size()) >= shard_tokens_) {
      write({buffer_.data(), static_cast<size_t>(shard_tokens_)});
      buffer_.erase(buffer_.begin(), buffer_.begin() + shard_tokens_);
    }
  }
  // Writes what is left as the last, shorter shard.
  void finish() {
    if (!buffer_.empty()) write(buffer_);
    buffer_.clear();
  }

  const std::vector<std::string>& files() const { return files_; }  // names, in `dir`
  const std::vector<int64_t>& counts() const { return counts_; }    // tokens per file
  int64_t tokens() const { return tokens_; }                        // added (end-of-text included)
  int64_t documents() const { return documents_; }
  io::ShardTokens type() const { return type_; }
  std::vector<std::string> paths() const {
    std::vector<std::string> out;
    for (const std::string& f : files_) out.push_back((std::filesystem::path(dir_) / f).string());
    return out;
  }
  // The manifest's list of the shards: [{"file": name, "tokens": count}, ...].
  nlohmann::ordered_json list() const {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (size_t i = 0; i < files_.size(); ++i)
      out.push_back({{"file", files_[i]}, {"tokens", counts_[i]}});
    return out;
  }

 private:
  void write(std::span<const T> t) {
    char name[64];
    std::snprintf(name, sizeof name, "%s_%06zu.bin", prefix_.c_str(), files_.size());
    const std::string path = (std::filesystem::path(dir_) / name).string();
    if constexpr (std::is_same_v<T, uint16_t>)
      io::write_token_shard(path, t);
    else
      io::write_token_shard(path, t, type_);
    files_.emplace_back(name);
    counts_.push_back(static_cast<int64_t>(t.size()));
  }

  std::string dir_, prefix_;
  int64_t shard_tokens_;
  io::ShardTokens type_;
  std::vector<T> buffer_;
  std::vector<std::string> files_;
  std::vector<int64_t> counts_;
  int64_t tokens_ = 0, documents_ = 0;
};

}  // namespace octet
