// Token shards in llm.c's format, read and written as they are, so that text tokenized by llm.c's
// dev/data scripts (GPT-2's vocabulary: fineweb, tinyshakespeare, ...) or by any other tool that
// writes this layout trains without conversion.
//
// Layout (llm.c dev/data/data_common.py, write_datafile, HEADERS_INFO; all little-endian):
//   header  256 x int32: [0] magic, [1] version, [2] token count N, the rest zero
//   tokens  N x uint16 (GPT-2 form: magic 20240520, version 1; file size 1024 + 2 N bytes) or
//           N x uint32 (Llama-3 form: magic 20240801, version 7; file size 1024 + 4 N bytes)
// A shard carries no vocabulary: the token ids mean whatever the tokenizer that wrote them meant,
// and the reader only bounds them. Writers pick uint16 when the vocabulary fits (at most 65,536
// ids), as llm.c does for GPT-2, and uint32 otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace octet::io {

inline constexpr int32_t kShardMagic = 20240520;  // uint16 tokens
inline constexpr int32_t kShardVersion = 1;
inline constexpr int32_t kShardMagicU32 = 20240801;  // uint32 tokens (llm.c's Llama-3 shards)
inline constexpr int32_t kShardVersionU32 = 7;
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;
// llm.c's writer asserts fewer than 2^31 tokens (the count is an int32).
inline constexpr int64_t kShardMaxTokens = (int64_t{1} << 31) - 1;

enum class ShardTokens : uint8_t { kU16, kU32 };
const char* shard_tokens_name(ShardTokens t);  // "uint16", "uint32"
inline int64_t shard_token_bytes(ShardTokens t) {
  return t == ShardTokens::kU16 ? 2 : 4;
}
// kU16 when every id of a vocabulary of `vocab_size` fits 16 bits, else kU32.
ShardTokens shard_tokens_for_vocab(int64_t vocab_size);

// Writes `tokens` as one shard at `path`, atomically (io/atomic_file.h): the file appears whole or
// not at all. The uint16 overload writes the GPT-2 form; the uint32 one writes `type`'s form and
// refuses (naming the token and its index) an id that does not fit kU16.
void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);
void write_token_shard(const std::string& path, std::span<const uint32_t> tokens, ShardTokens type);

// One validated shard, memory-mapped read-only. Copies share the mapping, which lives as long as
// any copy does.
class TokenShard {
 public:
  TokenShard() = default;

  // Opens `path` and checks, each with an error naming the file and the problem: the file holds a
  // whole header, the magic and its version, a non-negative token count, and a size of exactly
  // header + (2 or 4) * count bytes (shorter: truncated; longer: trailing bytes). With vocab_size >
  // 0 every token must also be below vocab_size (one pass over the data; the error names the first
  // offending token and its index).
  static TokenShard open(const std::string& path, int64_t vocab_size = 0);
  // The same checks on the bytes of a whole shard file (4-byte aligned), which stay valid as long
  // as `owner` lives: the shard keeps `owner` and reads its tokens from `bytes`. Errors name
  // `path`.
  static TokenShard from_bytes(const std::string& path, std::shared_ptr<const void> owner,
                               std::span<const std::byte> bytes, int64_t vocab_size = 0);

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }  // tokens
  ShardTokens token_type() const { return type_; }
  // The tokens of a uint16 shard (throws for a uint32 one); of a uint32 shard (throws otherwise).
  std::span<const uint16_t> tokens() const;
  std::span<const uint32_t> tokens32() const;
  // Copies tokens [start, start + n) as int32, either form (ids are bounded by the vocabulary
  // check, or by 2^31 when none was asked for).
  void read(int64_t start, int64_t n, int32_t* out) const;

  // A view of `n` tokens of `type` at `data` inside memory `owner` keeps alive (Megatron's .bin
  // files, whose documents the caller has validated), bound-checked like a shard. `path` names it.
  static TokenShard view(const std::string& path, std::shared_ptr<const void> owner,
                         const void* data, int64_t n, ShardTokens type, int64_t vocab_size = 0);

 private:
  std::string path_;
  std::shared_ptr<const void> mapping_;
  const void* tokens_ = nullptr;
  ShardTokens type_ = ShardTokens::kU16;
  int64_t size_ = 0;
};

}  // namespace octet::io
