// Token shards in llm.c's format, read and written as they are, so that text tokenized by llm.c's
// dev/data scripts (GPT-2's vocabulary: fineweb, tinyshakespeare, ...) or by any other tool that
// writes this layout trains without conversion.
//
// Layout (llm.c dev/data/data_common.py, write_datafile; all little-endian):
//   header  256 x int32: [0] magic 20240520, [1] version 1, [2] token count N, the rest zero
//   tokens  N x uint16
// The file size is exactly 1024 + 2 N bytes. llm.c's Llama-3 variant (magic 20240801, uint32
// tokens) is recognised and rejected by name rather than misread. A shard carries no vocabulary:
// the token ids mean whatever the tokenizer that wrote them meant, and the reader only bounds them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace octet::io {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;
// llm.c's writer asserts fewer than 2^31 tokens (the count is an int32).
inline constexpr int64_t kShardMaxTokens = (int64_t{1} << 31) - 1;

// Writes `tokens` as one shard at `path`, atomically (io/atomic_file.h): the file appears whole or
// not at all.
void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);

// One validated shard, memory-mapped read-only. Copies share the mapping, which lives as long as
// any copy does.
class TokenShard {
 public:
  TokenShard() = default;

  // Opens `path` and checks, each with an error naming the file and the problem: the file holds a
  // whole header, the magic and version, a non-negative token count, and a size of exactly
  // header + 2 * count bytes (shorter: truncated; longer: trailing bytes). With vocab_size > 0
  // every token must also be below vocab_size (one pass over the data; the error names the first
  // offending token and its index).
  static TokenShard open(const std::string& path, int64_t vocab_size = 0);
  // The same checks on the bytes of a whole shard file (2-byte aligned), which stay valid as long
  // as `owner` lives: the shard keeps `owner` and reads its tokens from `bytes`. Errors name
  // `path`.
  static TokenShard from_bytes(const std::string& path, std::shared_ptr<const void> owner,
                               std::span<const std::byte> bytes, int64_t vocab_size = 0);

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }  // tokens
  std::span<const uint16_t> tokens() const { return {tokens_, static_cast<size_t>(size_)}; }

 private:
  std::string path_;
  std::shared_ptr<const void> mapping_;
  const uint16_t* tokens_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace octet::io
