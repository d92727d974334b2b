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

// llm.c's Llama-3 shards (dev/data/data_common.py): same header, uint32 tokens.
constexpr int32_t kLlama3ShardMagic = 20240801;

// Scans in blocks whose maximum the compiler vectorises; only a block holding a bad token is
// searched element by element.
void check_token_bound(const std::string& path, const uint16_t* tokens, int64_t n,
                       int64_t vocab_size) {
  constexpr int64_t kBlock = 1 << 16;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    uint16_t block_max = 0;
    for (int64_t i = begin; i < end; ++i) block_max = std::max(block_max, tokens[i]);
    if (block_max < vocab_size) continue;
    for (int64_t i = begin; i < end; ++i) {
      OCTET_CHECK(tokens[i] < vocab_size, path, ": token ", tokens[i], " at index ", i,
                  " is out of range for a vocabulary of ", vocab_size,
                  " (the shard was made with a larger tokenizer than the model's vocab_size)");
    }
  }
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

void write_token_shard(const std::string& path, std::span<const uint16_t> tokens) {
  OCTET_CHECK(static_cast<int64_t>(tokens.size()) <= kShardMaxTokens, path, ": ", tokens.size(),
              " tokens do not fit one shard (at most ", kShardMaxTokens, ")");
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  AtomicFile f(path);
  f.write(header.data(), header.size() * sizeof(int32_t));
  f.write(tokens.data(), tokens.size_bytes());
  f.commit();
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
  OCTET_CHECK(reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint16_t) == 0, path,
              ": token shard bytes must be 2-byte aligned");
  const auto file_bytes = static_cast<int64_t>(bytes.size());
  OCTET_CHECK(file_bytes >= kShardHeaderBytes, path, ": truncated token shard: ", file_bytes,
              " bytes, less than the ", kShardHeaderBytes, "-byte header");
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  OCTET_CHECK(header[0] != kLlama3ShardMagic, path, ": llm.c Llama-3 token shard (magic ",
              kLlama3ShardMagic, ", uint32 tokens) is not supported; expected magic ", kShardMagic,
              " (uint16 tokens)");
  OCTET_CHECK(header[0] == kShardMagic, path, ": not an llm.c token shard: magic ", header[0],
              ", expected ", kShardMagic);
  OCTET_CHECK(header[1] == kShardVersion, path, ": unsupported token shard version ", header[1],
              ", expected ", kShardVersion);
  const int64_t n = header[2];
  OCTET_CHECK(n >= 0, path, ": negative token count ", n, " in the header");
  const int64_t expected_bytes = kShardHeaderBytes + 2 * n;
  OCTET_CHECK(file_bytes >= expected_bytes, path, ": truncated token shard: the header says ", n,
              " tokens (", expected_bytes, " bytes) but the file has ", file_bytes, " bytes");
  OCTET_CHECK(file_bytes == expected_bytes, path, ": token count mismatch: the header says ", n,
              " tokens (", expected_bytes, " bytes) but the file has ", file_bytes,
              " bytes (trailing data)");

  TokenShard s;
  s.path_ = path;
  s.tokens_ = reinterpret_cast<const uint16_t*>(bytes.data() + kShardHeaderBytes);
  s.size_ = n;
  s.mapping_ = std::move(owner);
  if (vocab_size > 0) check_token_bound(path, s.tokens_, n, vocab_size);
  return s;
}

}  // namespace octet::io
