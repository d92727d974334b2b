// llm.c token shards: a round trip, the exact byte layout llm.c's writer produces, and one test per
// kind of damage, each error naming the file and the problem.
#include "io/token_shard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <vector>

#include "core/check.h"

namespace octet::io {
namespace {

namespace fs = std::filesystem;

class TokenShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("octet_token_shard_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A shard written by hand as llm.c's write_datafile does: 256 int32 header, then uint16 tokens.
  std::string write_raw(const std::string& name, int32_t magic, int32_t version, int32_t count,
                        const std::vector<uint16_t>& tokens, const std::string& extra = "") {
    std::vector<int32_t> header(256, 0);
    header[0] = magic, header[1] = version, header[2] = count;
    std::ofstream out(path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(tokens.data()), 2 * tokens.size());
    out << extra;
    return path(name);
  }

  static void expect_open_error(const std::string& file, const std::string& fragment,
                                int64_t vocab_size = 0) {
    try {
      TokenShard::open(file, vocab_size);
      ADD_FAILURE() << "no error opening " << file;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(file), std::string::npos) << "message does not name the file: " << msg;
      EXPECT_NE(msg.find(fragment), std::string::npos)
          << "missing '" << fragment << "' in: " << msg;
    }
  }

  fs::path dir_;
};

std::vector<uint16_t> some_tokens(size_t n) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>((i * 40503u + 17) % 50257);
  return t;
}

TEST_F(TokenShardTest, RoundTripMatchesLlmcLayout) {
  const std::vector<uint16_t> tokens = some_tokens(1001);
  write_token_shard(path("a.bin"), tokens);
  const TokenShard s = TokenShard::open(path("a.bin"), 50257);
  EXPECT_EQ(s.path(), path("a.bin"));
  ASSERT_EQ(s.size(), 1001);
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), s.tokens().begin()));

  // Byte for byte what llm.c's writer makes of the same tokens.
  write_raw("ref.bin", 20240520, 1, 1001, tokens);
  std::ifstream a(path("a.bin"), std::ios::binary), b(path("ref.bin"), std::ios::binary);
  const std::string bytes_a((std::istreambuf_iterator<char>(a)), {});
  const std::string bytes_b((std::istreambuf_iterator<char>(b)), {});
  EXPECT_EQ(bytes_a.size(), 1024u + 2 * 1001);
  EXPECT_TRUE(bytes_a == bytes_b);
  // No temporary file is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);
}

// llm.c's Llama-3 form: magic 20240801, version 7, uint32 tokens, byte for byte; ids past 65,535
// survive, the vocabulary bound applies, and a uint32 shard is truncated at 4-byte granularity.
TEST_F(TokenShardTest, Uint32RoundTripMatchesLlmcLayout) {
  std::vector<uint32_t> tokens(777);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7919) % 129280);
  tokens[5] = 129279;  // DeepSeek-V3's last id
  write_token_shard(path("a.bin"), tokens, ShardTokens::kU32);
  const TokenShard s = TokenShard::open(path("a.bin"), 129280);
  ASSERT_EQ(s.size(), 777);
  EXPECT_EQ(s.token_type(), ShardTokens::kU32);
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), s.tokens32().begin()));
  std::vector<int32_t> read(777);
  s.read(0, 777, read.data());
  EXPECT_EQ(read[5], 129279);
  EXPECT_THROW(s.tokens(), Error);

  std::vector<int32_t> header(256, 0);
  header[0] = 20240801, header[1] = 7, header[2] = 777;
  std::string ref(reinterpret_cast<const char*>(header.data()), 1024);
  ref.append(reinterpret_cast<const char*>(tokens.data()), 4 * tokens.size());
  std::ifstream a(path("a.bin"), std::ios::binary);
  EXPECT_TRUE(std::string(std::istreambuf_iterator<char>(a), {}) == ref);

  expect_open_error(path("a.bin"), "token 129279 at index 5", 129279);
  std::ofstream(path("t.bin"), std::ios::binary) << ref.substr(0, ref.size() - 2);
  expect_open_error(path("t.bin"), "truncated token shard: the header says 777 uint32 tokens");

  // The uint16 form from the uint32 writer when the ids fit, and a clear refusal when not.
  write_token_shard(path("n.bin"), std::span<const uint32_t>(tokens).first(5), ShardTokens::kU16);
  EXPECT_EQ(TokenShard::open(path("n.bin")).token_type(), ShardTokens::kU16);
  EXPECT_EQ(TokenShard::open(path("n.bin")).tokens()[1], tokens[1]);
  try {
    write_token_shard(path("x.bin"), tokens, ShardTokens::kU16);
    ADD_FAILURE() << "a uint32 id was narrowed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit a uint16 shard"), std::string::npos);
  }
  EXPECT_EQ(shard_tokens_for_vocab(65536), ShardTokens::kU16);
  EXPECT_EQ(shard_tokens_for_vocab(65537), ShardTokens::kU32);
  EXPECT_EQ(shard_tokens_for_vocab(129280), ShardTokens::kU32);
}

TEST_F(TokenShardTest, EmptyShardAndCopiesShareTheMapping) {
  write_token_shard(path("empty.bin"), {});
  EXPECT_EQ(TokenShard::open(path("empty.bin")).size(), 0);

  write_token_shard(path("b.bin"), some_tokens(10));
  TokenShard copy;
  {
    const TokenShard s = TokenShard::open(path("b.bin"));
    copy = s;
  }
  fs::remove(path("b.bin"));  // the mapping outlives both the name and the first handle
  EXPECT_EQ(copy.tokens()[9], some_tokens(10)[9]);
}

// from_bytes (what open() checks the mapping with, and the fuzz harness's entry) accepts the bytes
// of a good shard with the same tokens and refuses a damaged one with open()'s message.
TEST_F(TokenShardTest, FromBytesChecksAsOpenDoes) {
  const std::vector<uint16_t> tokens = some_tokens(300);
  write_token_shard(path("good.bin"), tokens);
  std::ifstream in(path("good.bin"), std::ios::binary);
  const std::string bytes(std::istreambuf_iterator<char>(in), {});
  auto owner = std::make_shared<std::vector<uint16_t>>(bytes.size() / 2 + 1);
  std::memcpy(owner->data(), bytes.data(), bytes.size());
  const std::span<const std::byte> view(reinterpret_cast<const std::byte*>(owner->data()),
                                        bytes.size());
  const TokenShard s = TokenShard::from_bytes("mem", owner, view, 50257);
  EXPECT_EQ(s.path(), "mem");
  ASSERT_EQ(s.size(), 300);
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), s.tokens().begin()));

  for (const size_t cut : {size_t{0}, size_t{1023}, bytes.size() - 1}) {
    const std::string file = path("cut.bin");
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes.substr(0, cut);
    std::string from_file, from_memory;
    try {
      TokenShard::open(file, 50257);
    } catch (const Error& e) {
      from_file = e.what();
    }
    try {
      TokenShard::from_bytes(file, owner, view.first(cut), 50257);
    } catch (const Error& e) {
      from_memory = e.what();
    }
    EXPECT_FALSE(from_memory.empty()) << cut;
    if (cut > 0) EXPECT_EQ(from_memory, from_file);  // open() refuses an empty file before mmap
  }
  const auto* odd = reinterpret_cast<const std::byte*>(owner->data()) + 1;
  EXPECT_THROW(TokenShard::from_bytes("mem", owner, {odd, 1024}), Error);
}

TEST_F(TokenShardTest, RejectsMissingAndNonRegular) {
  expect_open_error(path("missing.bin"), "cannot open");
  fs::create_directories(path("dir.bin"));
  expect_open_error(path("dir.bin"), "not a regular file");
}

TEST_F(TokenShardTest, RejectsShortHeader) {
  std::ofstream(path("short.bin"), std::ios::binary) << std::string(100, 'x');
  expect_open_error(path("short.bin"), "truncated token shard: 100 bytes");
}

TEST_F(TokenShardTest, RejectsWrongMagic) {
  expect_open_error(write_raw("m.bin", 12345, 1, 3, {1, 2, 3}), "magic 12345, expected 20240520");
  // The uint32 magic with the uint16 form's version, and the other way round.
  expect_open_error(write_raw("l.bin", 20240801, 1, 3, {1, 2, 3, 0, 0, 0}),
                    "version 1, expected 7 for magic 20240801");
  expect_open_error(write_raw("g.bin", 20240520, 7, 3, {1, 2, 3}), "version 7, expected 1");
}

TEST_F(TokenShardTest, RejectsWrongVersion) {
  expect_open_error(write_raw("v.bin", 20240520, 2, 3, {1, 2, 3}), "version 2, expected 1");
}

TEST_F(TokenShardTest, RejectsNegativeCount) {
  expect_open_error(write_raw("n.bin", 20240520, 1, -5, {}), "negative token count -5");
}

TEST_F(TokenShardTest, RejectsTruncatedTokens) {
  expect_open_error(write_raw("t.bin", 20240520, 1, 10, some_tokens(7)),
                    "truncated token shard: the header says 10 uint16 tokens");
  // An odd byte count is truncation too.
  expect_open_error(write_raw("o.bin", 20240520, 1, 3, some_tokens(2), "x"), "truncated");
}

TEST_F(TokenShardTest, RejectsTokenCountMismatch) {
  expect_open_error(write_raw("c.bin", 20240520, 1, 3, some_tokens(5)),
                    "token count mismatch: the header says 3 uint16 tokens");
}

TEST_F(TokenShardTest, RejectsTokenOutsideVocab) {
  std::vector<uint16_t> tokens(70000, 5);
  tokens[65539] = 257;  // in the second scan block
  write_token_shard(path("big.bin"), tokens);
  EXPECT_EQ(TokenShard::open(path("big.bin"), 258).size(), 70000);
  EXPECT_EQ(TokenShard::open(path("big.bin")).size(), 70000);  // no bound asked for
  expect_open_error(path("big.bin"), "token 257 at index 65539", 257);
}

}  // namespace
}  // namespace octet::io
