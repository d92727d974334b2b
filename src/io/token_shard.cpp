#include "io/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "io/atomic_file.h"

namespace octet::io {

// The format is little-endian and tokens are used straight from the mapping.
static_assert(std::endian::native == std::endian::little,
              "token shard I/O assumes a little-endian host");

namespace {

// Scans in blocks whose maximum the compiler vectorises; only a block holding a bad token is
// searched element by element.
template <typename T>
void check_token_bound(const std::string& path, const T* tokens, int64_t n, int64_t vocab_size) {
  constexpr int64_t kBlock = 1 << 16;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    T block_max = 0;
    for (int64_t i = begin; i < end; ++i) block_max = std::max(block_max, tokens[i]);
    if (static_cast<int64_t>(block_max) < vocab_size) continue;
    for (int64_t i = begin; i < end; ++i) {
      OCTET_CHECK(static_cast<int64_t>(tokens[i]) < vocab_size, path, ": token ", tokens[i],
                  " at index ", i, " is out of range for a vocabulary of ", vocab_size,
                  " (the data was made with a larger tokenizer than the model's vocab_size; set "
                  "model.vocab_size to the tokenizer's)");
    }
  }
}

void write_shard_file(const std::string& path, int32_t magic, int32_t version, int64_t count,
                      const void* data, size_t bytes) {
  OCTET_CHECK(count <= kShardMaxTokens, path, ": ", count, " tokens do not fit one shard (at most ",
              kShardMaxTokens, ")");
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count);
  AtomicFile f(path);
  f.write(header.data(), header.size() * sizeof(int32_t));
  f.write(data, bytes);
  f.commit();
}

// Closes the descriptor on every exit, the throwing ones included.
struct FileDescriptor {
  explicit FileDescriptor(int descriptor) : fd(descriptor) {}
  int fd;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

const char* shard_tokens_name(ShardTokens t) {
  return t == ShardTokens::kU16 ? "uint16" : "uint32";
}

ShardTokens shard_tokens_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65536 ? ShardTokens::kU16 : ShardTokens::kU32;
}

void write_token_shard(const std::string& path, std::span<const uint16_t> tokens) {
  write_shard_file(path, kShardMagic, kShardVersion, static_cast<int64_t>(tokens.size()),
                   tokens.data(), tokens.size_bytes());
}

void write_token_shard(const std::string& path, std::span<const uint32_t> tokens,
                       ShardTokens type) {
  if (type == ShardTokens::kU32) {
    write_shard_file(path, kShardMagicU32, kShardVersionU32, static_cast<int64_t>(tokens.size()),
                     tokens.data(), tokens.size_bytes());
    return;
  }
  std::vector<uint16_t> narrow(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    OCTET_CHECK(tokens[i] <= 0xFFFF, path, ": token ", tokens[i], " at index ", i,
                " does not fit a uint16 shard; write uint32 (vocabularies above 65,536)");
    narrow[i] = static_cast<uint16_t>(tokens[i]);
  }
  write_token_shard(path, narrow);
}

TokenShard TokenShard::open(const std::string& path, int64_t vocab_size) {
  const FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  OCTET_CHECK(file.fd >= 0, path, ": cannot open token shard: ", std::strerror(errno));
  struct stat st = {};
  OCTET_CHECK(::fstat(file.fd, &st) == 0, path,
              ": cannot stat token shard: ", std::strerror(errno));
  OCTET_CHECK(S_ISREG(st.st_mode), path, ": not a regular file");
  const int64_t file_bytes = st.st_size;
  OCTET_CHECK(file_bytes >= kShardHeaderBytes, path, ": truncated token shard: ", file_bytes,
              " bytes, less than the ", kShardHeaderBytes, "-byte header");

  // The mapping keeps the data reachable after the descriptor is closed.
  void* base = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, file.fd, 0);
  OCTET_CHECK(base != MAP_FAILED, path, ": cannot map token shard: ", std::strerror(errno));
  auto mapping =
      std::shared_ptr<const void>(base, [bytes = static_cast<size_t>(file_bytes)](const void* p) {
        ::munmap(const_cast<void*>(p), bytes);
      });
  const std::span<const std::byte> bytes(static_cast<const std::byte*>(base),
                                         static_cast<size_t>(file_bytes));
  return from_bytes(path, std::move(mapping), bytes, vocab_size);
}

TokenShard TokenShard::from_bytes(const std::string& path, std::shared_ptr<const void> owner,
                                  std::span<const std::byte> bytes, int64_t vocab_size) {
  OCTET_CHECK(reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint32_t) == 0, path,
              ": token shard bytes must be 4-byte aligned");
  const auto file_bytes = static_cast<int64_t>(bytes.size());
  OCTET_CHECK(file_bytes >= kShardHeaderBytes, path, ": truncated token shard: ", file_bytes,
              " bytes, less than the ", kShardHeaderBytes, "-byte header");
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  OCTET_CHECK(header[0] == kShardMagic || header[0] == kShardMagicU32, path,
              ": not an llm.c token shard: magic ", header[0], ", expected ", kShardMagic,
              " (uint16 tokens) or ", kShardMagicU32, " (uint32 tokens)");
  const ShardTokens type = header[0] == kShardMagic ? ShardTokens::kU16 : ShardTokens::kU32;
  const int32_t version = type == ShardTokens::kU16 ? kShardVersion : kShardVersionU32;
  OCTET_CHECK(header[1] == version, path, ": unsupported token shard version ", header[1],
              ", expected ", version, " for magic ", header[0]);
  const int64_t n = header[2];
  OCTET_CHECK(n >= 0, path, ": negative token count ", n, " in the header");
  const int64_t expected_bytes = kShardHeaderBytes + shard_token_bytes(type) * n;
  OCTET_CHECK(file_bytes >= expected_bytes, path, ": truncated token shard: the header says ", n,
              " ", shard_tokens_name(type), " tokens (", expected_bytes,
              " bytes) but the file has ", file_bytes, " bytes");
  OCTET_CHECK(file_bytes == expected_bytes, path, ": token count mismatch: the header says ", n,
              " ", shard_tokens_name(type), " tokens (", expected_bytes,
              " bytes) but the file has ", file_bytes, " bytes (trailing data)");
  return view(path, std::move(owner), bytes.data() + kShardHeaderBytes, n, type, vocab_size);
}

TokenShard TokenShard::view(const std::string& path, std::shared_ptr<const void> owner,
                            const void* data, int64_t n, ShardTokens type, int64_t vocab_size) {
  OCTET_CHECK(n >= 0, path, ": negative token count ", n);
  OCTET_CHECK(reinterpret_cast<uintptr_t>(data) % shard_token_bytes(type) == 0, path,
              ": tokens must be aligned to their size");
  TokenShard s;
  s.path_ = path;
  s.tokens_ = data;
  s.type_ = type;
  s.size_ = n;
  s.mapping_ = std::move(owner);
  if (vocab_size > 0 && type == ShardTokens::kU16)
    check_token_bound(path, static_cast<const uint16_t*>(data), n, vocab_size);
  // Without a bound, uint32 ids must still fit the int32 that read() gives.
  if (type == ShardTokens::kU32)
    check_token_bound(path, static_cast<const uint32_t*>(data), n,
                      vocab_size > 0 ? vocab_size : (int64_t{1} << 31));
  return s;
}

std::span<const uint16_t> TokenShard::tokens() const {
  OCTET_CHECK(type_ == ShardTokens::kU16, path_, ": a uint32 token shard read as uint16");
  return {static_cast<const uint16_t*>(tokens_), static_cast<size_t>(size_)};
}

std::span<const uint32_t> TokenShard::tokens32() const {
  OCTET_CHECK(type_ == ShardTokens::kU32, path_, ": a uint16 token shard read as uint32");
  return {static_cast<const uint32_t*>(tokens_), static_cast<size_t>(size_)};
}

void TokenShard::read(int64_t start, int64_t n, int32_t* out) const {
  OCTET_CHECK(start >= 0 && n >= 0 && start + n <= size_, path_, ": read of [", start, ", ",
              start + n, ") is outside its ", size_, " tokens");
  if (type_ == ShardTokens::kU16) {
    std::copy_n(static_cast<const uint16_t*>(tokens_) + start, n, out);
  } else {
    std::copy_n(static_cast<const uint32_t*>(tokens_) + start, n, out);
  }
}

}  // namespace octet::io
