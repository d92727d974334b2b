#include "io/megatron_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/check.h"

namespace octet::io {

namespace {

constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  OCTET_CHECK(in, path, ": cannot open the Megatron index: ", std::strerror(errno));
  return {std::istreambuf_iterator<char>(in), {}};
}

template <typename T>
T load(const std::string& bytes, int64_t at) {
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof v);
  return v;
}

const char* dtype_code_name(uint8_t code) {
  switch (code) {
    case 1:
      return "uint8";
    case 2:
      return "int8";
    case 3:
      return "int16";
    case 4:
      return "int32";
    case 5:
      return "int64";
    case 6:
      return "float64";
    case 7:
      return "float32";
    case 8:
      return "uint16";
    default:
      return "unknown";
  }
}

// The .bin mapped read-only; an empty file maps to nothing.
std::shared_ptr<const void> map_file(const std::string& path, int64_t& bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  OCTET_CHECK(fd >= 0, path, ": cannot open the Megatron data file: ", std::strerror(errno));
  struct stat st = {};
  const bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  bytes = st.st_size;
  if (!ok || bytes == 0) {
    ::close(fd);
    OCTET_CHECK(ok, path, ": not a regular file");
    return std::make_shared<int>(0);
  }
  void* base = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  OCTET_CHECK(base != MAP_FAILED, path,
              ": cannot map the Megatron data file: ", std::strerror(errno));
  return std::shared_ptr<const void>(
      base, [n = static_cast<size_t>(bytes)](const void* p) { ::munmap(const_cast<void*>(p), n); });
}

}  // namespace

MegatronDataset MegatronDataset::open(const std::string& prefix, int64_t vocab_size) {
  const std::string idx = prefix + ".idx", bin = prefix + ".bin";
  const std::string b = read_whole(idx);
  const auto size = static_cast<int64_t>(b.size());
  OCTET_CHECK(size >= 9 && std::memcmp(b.data(), kIndexMagic, 9) == 0, idx,
              ": not a Megatron-LM index (the file does not start with MMIDIDX)");
  OCTET_CHECK(size >= kIndexHeaderBytes, idx, ": truncated Megatron index: ", size,
              " bytes, less than the ", kIndexHeaderBytes, "-byte header");
  const auto version = load<uint64_t>(b, 9);
  OCTET_CHECK(version == 1, idx, ": unsupported Megatron index version ", version, ", expected 1");
  const auto code = load<uint8_t>(b, 17);
  OCTET_CHECK(code == 8 || code == 4, idx, ": token dtype code ", int{code}, " (",
              dtype_code_name(code), ") is not supported; expected 8 (uint16) or 4 (int32)");
  const auto seqs = load<uint64_t>(b, 18), docs = load<uint64_t>(b, 26);
  // Bounded first so the size arithmetic below cannot overflow.
  OCTET_CHECK(seqs <= (uint64_t{1} << 40) && docs >= 1 && docs <= (uint64_t{1} << 40), idx,
              ": implausible counts: ", seqs, " sequences, ", docs, " document index entries");
  const auto S = static_cast<int64_t>(seqs), D = static_cast<int64_t>(docs);
  const int64_t expected = kIndexHeaderBytes + S * (4 + 8) + D * 8;
  OCTET_CHECK(size >= expected, idx, ": truncated Megatron index: the header counts ", S,
              " sequences and ", D - 1, " documents (", expected, " bytes) but the file has ", size,
              " bytes");
  OCTET_CHECK(size == expected, idx, ": the header counts ", S, " sequences and ", D - 1,
              " documents (", expected, " bytes) but the file has ", size,
              " bytes (trailing data, or a multimodal index, which is not supported)");

  MegatronDataset d;
  d.prefix_ = prefix;
  d.type_ = code == 8 ? ShardTokens::kU16 : ShardTokens::kU32;
  d.num_sequences_ = S;
  const int64_t width = shard_token_bytes(d.type_);
  const int64_t lengths_at = kIndexHeaderBytes, pointers_at = lengths_at + 4 * S,
                docs_at = pointers_at + 8 * S;
  std::vector<int64_t> seq_start(static_cast<size_t>(S) + 1, 0);
  for (int64_t i = 0; i < S; ++i) {
    const auto len = load<int32_t>(b, lengths_at + 4 * i);
    const auto ptr = load<int64_t>(b, pointers_at + 8 * i);
    OCTET_CHECK(len >= 0, idx, ": sequence ", i, " has a negative length ", len);
    OCTET_CHECK(ptr == seq_start[i] * width, idx, ": sequence ", i, " starts at byte ", ptr,
                " of the .bin, but the lengths before it put it at byte ", seq_start[i] * width);
    seq_start[i + 1] = seq_start[i] + len;
  }
  d.num_tokens_ = seq_start[S];
  int64_t prev = 0;
  for (int64_t k = 0; k < D; ++k) {
    const auto first = load<int64_t>(b, docs_at + 8 * k);
    OCTET_CHECK(k > 0 || first == 0, idx, ": the document index starts at ", first, ", not 0");
    OCTET_CHECK(first >= prev && first <= S, idx, ": document index entry ", k, " is ", first,
                ", outside [", prev, ", ", S, "]");
    d.doc_token_starts_.push_back(seq_start[first]);
    prev = first;
  }
  OCTET_CHECK(prev == S, idx, ": the document index ends at sequence ", prev, ", not at the ", S,
              " sequences");

  int64_t bin_bytes = 0;
  d.bin_ = map_file(bin, bin_bytes);
  OCTET_CHECK(bin_bytes >= d.num_tokens_ * width, bin,
              ": truncated Megatron data: the index counts ", d.num_tokens_, " ",
              dtype_code_name(code), " tokens (", d.num_tokens_ * width,
              " bytes) but the file has ", bin_bytes, " bytes");
  OCTET_CHECK(bin_bytes == d.num_tokens_ * width, bin, ": the index counts ", d.num_tokens_, " ",
              dtype_code_name(code), " tokens (", d.num_tokens_ * width,
              " bytes) but the file has ", bin_bytes, " bytes (trailing data, or another index)");
  d.data_ = d.bin_.get();
  if (vocab_size > 0) TokenShard::view(bin, d.bin_, d.data_, d.num_tokens_, d.type_, vocab_size);
  return d;
}

int64_t MegatronDataset::document_start(int64_t doc) const {
  OCTET_CHECK(doc >= 0 && doc <= num_documents(), prefix_, ": document ", doc, " is outside [0, ",
              num_documents(), "]");
  return doc_token_starts_[static_cast<size_t>(doc)];
}

TokenShard MegatronDataset::tokens(int64_t begin, int64_t end) const {
  OCTET_CHECK(begin >= 0 && begin <= end && end <= num_tokens_, prefix_, ": tokens [", begin, ", ",
              end, ") are outside its ", num_tokens_);
  const auto* base = static_cast<const std::byte*>(data_);
  return TokenShard::view(prefix_ + ".bin", bin_, base + begin * shard_token_bytes(type_),
                          end - begin, type_);
}

}  // namespace octet::io
