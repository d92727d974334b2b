// The data pipeline: byte tokenization of UTF-8, text prepared into shards once (split, manifest,
// reuse), data sources (llm.c shard directories and globs, text), the token stream across shards,
// and the samplers: determinism from the seed, shifted targets, whole-epoch coverage, packing
// across documents, and a resume from exported state that continues bit-identically.
#include "train/data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "core/check.h"
#include "io/token_shard.h"

namespace octet::train {
namespace {

namespace fs = std::filesystem;

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("octet_data_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write_file(const std::string& name, const std::string& text) {
    fs::create_directories((dir_ / name).parent_path());
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }
  std::string read_bytes(const std::string& p) const {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  // A shard whose token i is (first + i) % modulus: every token tells where it came from.
  std::string counting_shard(const std::string& name, int64_t n, int64_t first = 0,
                             int64_t modulus = 65536) {
    std::vector<uint16_t> t(n);
    for (int64_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>((first + i) % modulus);
    fs::create_directories((dir_ / name).parent_path());
    io::write_token_shard(path(name), t);
    return path(name);
  }

  fs::path dir_;
};

template <typename F>
void expect_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& s : fragments)
      EXPECT_NE(msg.find(s), std::string::npos) << "missing '" << s << "' in: " << msg;
  }
}

std::vector<int32_t> values(const Tensor& t) {
  const int32_t* p = t.data_as<int32_t>();
  return {p, p + t.numel()};
}

std::vector<int32_t> stream_tokens(const TokenStream& s) {
  std::vector<int32_t> out(s.size());
  s.read(0, s.size(), out.data());
  return out;
}

bool same_batch(const TokenBatch& a, const TokenBatch& b) {
  return values(a.inputs) == values(b.inputs) && values(a.targets) == values(b.targets);
}

// ---- Tokenizer

TEST(ByteTokenizerTest, RoundTripsUtf8) {
  const std::string text =
      "na\xC3\xAFve caf\xC3\xA9 \xE2\x80\x94 \xE6\x97\xA5\xE6\x9C\xAC "
      "\xF0\x9F\x99\x82\n\ttab\r\n";
  const std::vector<uint16_t> tokens = encode_bytes(text);
  ASSERT_EQ(tokens.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(tokens[i], uint8_t(text[i]));
  const std::vector<int32_t> ids(tokens.begin(), tokens.end());
  EXPECT_EQ(decode_bytes(ids), text);
  const std::vector<int32_t> with_eot = {kEndOfText, 'h', 'i', kEndOfText, 300};
  EXPECT_EQ(decode_bytes(with_eot), "<|endoftext|>hi<|endoftext|><|300|>");
  EXPECT_EQ(kByteVocabSize, kEndOfText + 1);
}

// ---- Preparing text

TEST_F(DataTest, PreparesDocumentsWithSplitAtFileTails) {
  // 10 documents of 20 bytes: the tail 30% cut at a document start puts the last 3 in val.
  std::string fortunes;
  for (int i = 0; i < 10; ++i) fortunes += "fortune number " + std::to_string(i) + "..\n%\n";
  PrepareTextArgs args;
  args.corpus = {{write_file("a", fortunes), write_file("b", "first line\nsecond line\n")}, "%"};
  args.out_dir = path("out");
  args.val_fraction = 0.3;
  const PreparedText p = prepare_text_shards(args);
  EXPECT_FALSE(p.reused);
  ASSERT_EQ(p.shards.train, std::vector<std::string>{path("out/train_000000.bin")});
  ASSERT_EQ(p.shards.val, std::vector<std::string>{path("out/val_000000.bin")});

  auto doc = [](int i) { return "<|endoftext|>fortune number " + std::to_string(i) + "..\n"; };
  std::string train, val;
  for (int i = 0; i < 7; ++i) train += doc(i);
  for (int i = 7; i < 10; ++i) val += doc(i);
  // A file without separators is one document, cut at a line start near 70% (here the last
  // line's, as no line starts after that point).
  train += "<|endoftext|>first line\n";
  val += "<|endoftext|>second line\n";
  EXPECT_EQ(decode_bytes(stream_tokens(TokenStream::open(p.shards.train, kByteVocabSize))), train);
  EXPECT_EQ(decode_bytes(stream_tokens(TokenStream::open(p.shards.val, kByteVocabSize))), val);
  EXPECT_EQ(p.train_tokens + p.val_tokens, int64_t(fortunes.size() - 20 + 10 + 23 + 2));
}

TEST_F(DataTest, PreparationIsDeterministicAndReused) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "line " + std::to_string(i * 7919 % 1000) + " of text\n";
  PrepareTextArgs args;
  args.corpus.files = {write_file("t.txt", text)};
  args.out_dir = path("one");
  args.val_fraction = 0.1;
  args.shard_tokens = 1000;  // several shards
  const PreparedText a = prepare_text_shards(args);
  EXPECT_GE(a.shards.train.size(), 3u);
  args.out_dir = path("two");
  const PreparedText b = prepare_text_shards(args);
  ASSERT_EQ(a.shards.train.size(), b.shards.train.size());
  for (size_t i = 0; i < a.shards.train.size(); ++i)
    EXPECT_EQ(read_bytes(a.shards.train[i]), read_bytes(b.shards.train[i]));
  EXPECT_EQ(read_bytes(a.shards.val[0]), read_bytes(b.shards.val[0]));

  // Unchanged sources: nothing is rewritten.
  const PreparedText again = prepare_text_shards(args);
  EXPECT_TRUE(again.reused);
  EXPECT_EQ(again.shards.train, b.shards.train);
  EXPECT_EQ(again.train_tokens, b.train_tokens);

  // A changed split or source prepares again; stale shards of the old run are removed.
  args.shard_tokens = 100'000;
  const PreparedText bigger = prepare_text_shards(args);
  EXPECT_FALSE(bigger.reused);
  EXPECT_EQ(bigger.shards.train.size(), 1u);
  EXPECT_FALSE(fs::exists(path("two/train_000001.bin")));
  write_file("t.txt", text + "one more line\n");
  EXPECT_FALSE(prepare_text_shards(args).reused);

  // A damaged shard is noticed and rebuilt.
  fs::resize_file(path("two/train_000000.bin"), 1030);
  const PreparedText rebuilt = prepare_text_shards(args);
  EXPECT_FALSE(rebuilt.reused);
  EXPECT_EQ(io::TokenShard::open(rebuilt.shards.train[0]).size(), rebuilt.train_tokens);
}

TEST_F(DataTest, PrepareRejectsBadText) {
  PrepareTextArgs args;
  args.out_dir = path("out");
  args.corpus.files = {path("missing.txt")};
  expect_error([&] { prepare_text_shards(args); }, {path("missing.txt"), "not found"});
  args.corpus.files = {write_file("bad.txt", "abc\xC3(def")};
  expect_error([&] { prepare_text_shards(args); },
               {path("bad.txt"), "not UTF-8", "0xc3 at offset 3"});
  args.corpus.files = {write_file("overlong.txt", "ab\xC0\xAF")};
  expect_error([&] { prepare_text_shards(args); }, {"offset 2"});
  args.corpus.files = {write_file("blank.txt", " \n\n")};
  expect_error([&] { prepare_text_shards(args); }, {"no training text"});
  args.corpus.files = {write_file("ok.txt", "text\n")};
  args.val_fraction = 1.0;
  expect_error([&] { prepare_text_shards(args); }, {"val_fraction"});
}

// ---- Data sources

TEST_F(DataTest, ResolvesLlmcShardDirectoriesAndGlobs) {
  counting_shard("d/tiny_shakespeare_train.bin", 100);
  counting_shard("d/tiny_shakespeare_val.bin", 50);
  counting_shard("f/fineweb_train_000002.bin", 10);
  counting_shard("f/fineweb_train_000001.bin", 10);
  counting_shard("f/fineweb_val_000000.bin", 10);

  ShardSet s = resolve_data_source({.path = path("d")});
  EXPECT_EQ(s.train, std::vector<std::string>{path("d/tiny_shakespeare_train.bin")});
  EXPECT_EQ(s.val, std::vector<std::string>{path("d/tiny_shakespeare_val.bin")});

  s = resolve_data_source({.path = path("f/fineweb_train_*.bin")});
  EXPECT_EQ(s.train, (std::vector<std::string>{path("f/fineweb_train_000001.bin"),
                                               path("f/fineweb_train_000002.bin")}));
  EXPECT_EQ(s.val, std::vector<std::string>{path("f/fineweb_val_000000.bin")});

  s = resolve_data_source({.path = path("f/fineweb_train_000001.bin"), .val_path = path("d")});
  EXPECT_EQ(s.val, std::vector<std::string>{path("d/tiny_shakespeare_val.bin")});

  expect_error([&] { resolve_data_source({.path = path("f/*.bin")}); },
               {"both a training and a validation shard"});
  expect_error([&] { resolve_data_source({.path = path("nothing*.bin")}); }, {"no files match"});
  expect_error([&] { resolve_data_source({.path = path("absent")}); }, {"data path not found"});
  // A name too long for the file system is not found either (it threw std::filesystem_error).
  const std::string too_long = path(std::string(300, 'x') + ".bin");
  expect_error([&] { resolve_data_source({.path = too_long}); }, {"data path not found"});
  expect_error([&] { resolve_data_source({.path = path("d"), .val_path = too_long}); },
               {"validation shard not found"});
  write_file("mixed/a.txt", "text");
  counting_shard("mixed/a.bin", 10);
  expect_error([&] { resolve_data_source({.path = path("mixed/a.*")}); }, {"both token shards"});
}

TEST_F(DataTest, ResolvesTextIntoTheCache) {
  write_file("texts/b.txt", "bravo text\n");
  write_file("texts/a.txt", "alpha text\n");
  write_file("texts/notes.md", "ignored\n");
  DataSourceArgs args{.path = path("texts"), .cache_dir = path("cache"), .val_fraction = 0};
  const ShardSet s = resolve_data_source(args);
  ASSERT_EQ(s.train.size(), 1u);
  EXPECT_TRUE(s.val.empty());
  EXPECT_EQ(fs::path(s.train[0]).parent_path().parent_path(), fs::path(path("cache")));
  EXPECT_EQ(decode_bytes(stream_tokens(TokenStream::open(s.train, kByteVocabSize))),
            "<|endoftext|>alpha text\n<|endoftext|>bravo text\n");
  args.cache_dir.clear();
  expect_error([&] { resolve_data_source(args); }, {"cache_dir"});
}

// ---- Token stream

TEST_F(DataTest, StreamReadsAcrossShardsAndBoundsTokens) {
  const TokenStream s = TokenStream::open(
      {counting_shard("a.bin", 5, 0), counting_shard("b.bin", 1, 5), counting_shard("c.bin", 9, 6)},
      65536);
  ASSERT_EQ(s.size(), 15);
  std::vector<int32_t> got(11);
  s.read(2, 11, got.data());
  for (int i = 0; i < 11; ++i) EXPECT_EQ(got[i], i + 2);
  expect_error([&] { s.read(10, 6, got.data()); }, {"outside its 15 tokens"});
  expect_error(
      [&] {
        TokenStream::open({path("a.bin"), path("c.bin")}, 10);
      },
      {path("c.bin"), "token 10 at index 4", "vocabulary of 10"});
}

// uint32 shards (ids past 65,535) mix with uint16 ones in one stream; the data's vocabulary from
// its manifest is checked against the model's before any shard is read, naming both and the key.
TEST_F(DataTest, Uint32ShardsAndTheVocabularyCheck) {
  std::vector<uint32_t> big(300);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint32_t>(100000 + i);
  fs::create_directories(path("d"));
  io::write_token_shard(path("d/x_train_000000.bin"), big, io::ShardTokens::kU32);
  counting_shard("d/x_train_000001.bin", 10, 7);
  io::write_token_shard(path("d/x_val_000000.bin"), std::span(big).first(40),
                        io::ShardTokens::kU32);
  const ShardSet s = resolve_data_source({.path = path("d")});
  EXPECT_EQ(data_vocab(s).vocab_size, 0);  // no manifest: only the token scan bounds the ids
  const DataStreams d = open_data_streams(s, 129280);
  ASSERT_EQ(d.train.size(), 310);
  ASSERT_TRUE(d.val.has_value());
  EXPECT_EQ(d.val->size(), 40);
  std::vector<int32_t> got(4);
  d.train.read(298, 4, got.data());
  EXPECT_EQ(got, (std::vector<int32_t>{100298, 100299, 7, 8}));
  expect_error([&] { open_data_streams(s, 100200); },
               {"x_train_000000.bin", "token 100200 at index 200", "model.vocab_size"});

  write_file("d/manifest.json", R"({"vocab_size": 129280, "tokenizer": {"sha256": "abc"}})");
  EXPECT_EQ(data_vocab(s).vocab_size, 129280);
  expect_error([&] { open_data_streams(s, 50000); },
               {"manifest.json", "vocabulary of 129280 ids", "tokenizer abc",
                "the model's vocab_size is 50000", "model.vocab_size = 129280"});
  EXPECT_EQ(open_data_streams(s, 129280).train.size(), 310);
}

// ---- Training sampler

TEST_F(DataTest, SamplerTargetsAreInputsShiftedByOne) {
  const TokenStream stream = TokenStream::open({counting_shard("s.bin", 5000)}, 65536);
  BatchSampler sampler(stream, {.batch_size = 3, .seq_len = 17, .seed = 5});
  for (int step = 0; step < 20; ++step) {
    const TokenBatch b = sampler.next();
    ASSERT_EQ(b.inputs.shape(), (Shape{3, 17}));
    ASSERT_EQ(b.inputs.dtype(), DType::kI32);
    const std::vector<int32_t> in = values(b.inputs), tg = values(b.targets);
    for (int r = 0; r < 3; ++r) {
      for (int t = 0; t < 17; ++t) {
        // Token value = stream position: each row is consecutive and targets are the next token.
        EXPECT_EQ(in[r * 17 + t], in[r * 17] + t);
        EXPECT_EQ(tg[r * 17 + t], in[r * 17 + t] + 1);
      }
    }
  }
}

TEST_F(DataTest, SamplerVisitsEveryWindowOncePerEpoch) {
  const int64_t N = 1000, T = 7;
  const TokenStream stream = TokenStream::open({counting_shard("s.bin", N)}, 65536);
  BatchSampler sampler(stream, {.batch_size = 1, .seq_len = T, .seed = 11});
  std::set<int64_t> offsets;
  for (int epoch = 0; epoch < 3; ++epoch) {
    const int64_t windows = sampler.windows_in_epoch();
    std::set<int32_t> starts;
    std::vector<int32_t> order;
    for (int64_t i = 0; i < windows; ++i) {
      const int32_t start = values(sampler.next().inputs)[0];
      order.push_back(start);
      starts.insert(start);
    }
    EXPECT_EQ(sampler.epoch(), epoch + 1);
    ASSERT_EQ(int64_t(starts.size()), windows) << "a window was drawn twice in epoch " << epoch;
    const int32_t offset = *starts.begin();
    EXPECT_LT(offset, T);
    EXPECT_EQ(windows, (N - 1 - offset) / T);
    for (int32_t s : starts) EXPECT_EQ((s - offset) % T, 0);
    EXPECT_FALSE(std::is_sorted(order.begin(), order.end())) << "not shuffled";
    offsets.insert(offset);
  }
  EXPECT_GT(offsets.size(), 1u) << "window boundaries never moved between epochs";
}

TEST_F(DataTest, SamplerIsDeterministicFromTheSeed) {
  const TokenStream stream = TokenStream::open({counting_shard("s.bin", 20000)}, 65536);
  BatchSampler a(stream, {.batch_size = 4, .seq_len = 32, .seed = 42});
  BatchSampler b(stream, {.batch_size = 4, .seq_len = 32, .seed = 42});
  BatchSampler c(stream, {.batch_size = 4, .seq_len = 32, .seed = 43});
  int differ = 0;
  for (int step = 0; step < 10; ++step) {
    const TokenBatch x = a.next(), y = b.next(), z = c.next();
    EXPECT_TRUE(same_batch(x, y)) << "step " << step;
    differ += !same_batch(x, z);
  }
  EXPECT_EQ(differ, 10);
}

TEST_F(DataTest, SamplerResumesBitIdenticallyFromState) {
  const TokenStream stream = TokenStream::open({counting_shard("s.bin", 3000)}, 65536);
  const SamplerArgs args{.batch_size = 5, .seq_len = 16, .seed = 7};
  BatchSampler a(stream, args);
  // 187 windows per epoch at most: 60 steps of 5 cross two epoch boundaries.
  for (int step = 0; step < 30; ++step) a.next();
  const std::array<int64_t, SamplerState::kSize> saved = a.state().to_array();
  std::vector<TokenBatch> expected(60);
  for (TokenBatch& b : expected) b = a.next();
  EXPECT_GE(a.epoch(), 2);

  // A fresh sampler with another seed: the state carries the seed.
  BatchSampler b(stream, {.batch_size = 5, .seq_len = 16, .seed = 999});
  b.set_state(SamplerState::from_array(saved));
  for (int step = 0; step < 60; ++step) EXPECT_TRUE(same_batch(expected[step], b.next())) << step;
  EXPECT_EQ(a.state().to_array(), b.state().to_array());

  BatchSampler other_len(stream, {.batch_size = 5, .seq_len = 8, .seed = 7});
  expect_error([&] { other_len.set_state(SamplerState::from_array(saved)); }, {"seq_len 16"});
  BatchSampler other_data(TokenStream::open({counting_shard("t.bin", 2999)}, 65536), args);
  expect_error([&] { other_data.set_state(SamplerState::from_array(saved)); },
               {"3000 tokens", "data changed"});
  expect_error([&] { SamplerState::from_array(std::vector<int64_t>{1, 2}); }, {"expected 5"});
}

TEST_F(DataTest, SamplerRanksSplitTheGlobalBatch) {
  const TokenStream stream = TokenStream::open({counting_shard("s.bin", 4000)}, 65536);
  BatchSampler whole(stream, {.batch_size = 6, .seq_len = 10, .seed = 3});
  BatchSampler r0(stream, {.batch_size = 3, .seq_len = 10, .seed = 3, .rank = 0, .world_size = 2});
  BatchSampler r1(stream, {.batch_size = 3, .seq_len = 10, .seed = 3, .rank = 1, .world_size = 2});
  for (int step = 0; step < 5; ++step) {
    std::vector<int32_t> joined = values(r0.next().inputs);
    const std::vector<int32_t> second = values(r1.next().inputs);
    joined.insert(joined.end(), second.begin(), second.end());
    EXPECT_EQ(joined, values(whole.next().inputs));
  }
  EXPECT_EQ(r0.state().to_array(), whole.state().to_array());
}

TEST_F(DataTest, SamplerPacksAcrossDocuments) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "doc " + std::to_string(i) + "\n%\n";
  const PreparedText p = prepare_text_shards(
      {.corpus = {{write_file("docs", text)}, "%"}, .out_dir = path("out"), .val_fraction = 0});
  BatchSampler sampler(TokenStream::open(p.shards.train, kByteVocabSize),
                       {.batch_size = 4, .seq_len = 64, .seed = 1});
  const std::vector<int32_t> in = values(sampler.next().inputs);
  for (int r = 0; r < 4; ++r) {
    // Each ~7-byte document is shorter than a sequence: every row holds several, back to back,
    // with no padding.
    const auto row = std::span(in).subspan(r * 64, 64);
    EXPECT_GE(std::count(row.begin(), row.end(), kEndOfText), 6);
    EXPECT_EQ(decode_bytes(row).find("<|endoftext|><|endoftext|>"), std::string::npos);
  }
  expect_error([&] { BatchSampler(TokenStream::open(p.shards.train, 256), {}); },
               {"token 256", "vocabulary of 256"});
  expect_error(
      [&] {
        BatchSampler(TokenStream::open(p.shards.train, 257), {.batch_size = 1, .seq_len = 5000});
      },
      {"fewer than one sequence"});
}

// ---- Validation batches

TEST_F(DataTest, ValidationBatchesAreFixed) {
  const TokenStream stream = TokenStream::open({counting_shard("v.bin", 1000)}, 65536);
  const ValBatches val(stream, {.batch_size = 4, .seq_len = 20});
  EXPECT_EQ(val.size(), 999 / 20 / 4);
  for (int64_t i = 0; i < val.size(); ++i) {
    const TokenBatch a = val.batch(i), b = val.batch(i);
    EXPECT_TRUE(same_batch(a, b));
    EXPECT_EQ(values(a.inputs)[0], i * 4 * 20);
    EXPECT_EQ(values(a.targets)[79], (i + 1) * 4 * 20);
  }
  EXPECT_EQ(ValBatches(stream, {.batch_size = 4, .seq_len = 20, .max_batches = 3}).size(), 3);
  expect_error([&] { val.batch(val.size()); }, {"outside"});
  expect_error([&] { ValBatches(stream, {.batch_size = 50, .seq_len = 20}); },
               {path("v.bin"), "1000 tokens", "1001"});
}

// ---- The default corpus

TEST_F(DataTest, DefaultCorpusMissingSaysHowToInstall) {
  expect_error([&] { default_corpus(path("nowhere")); }, {"scripts/setup.sh", "fortunes"});
}

TEST_F(DataTest, DefaultCorpusPreparesIntoEnglishText) {
  if (!fs::is_directory(kDefaultCorpusDir)) {
    GTEST_SKIP() << kDefaultCorpusDir << " not installed (scripts/setup.sh installs it)";
  }
  const TextCorpus corpus = default_corpus();
  ASSERT_GE(corpus.files.size(), 10u);
  EXPECT_TRUE(std::is_sorted(corpus.files.begin(), corpus.files.end()));
  EXPECT_EQ(corpus.document_separator, "%");
  const ShardSet s = resolve_data_source({.cache_dir = path("cache")});
  const TokenStream train = TokenStream::open(s.train, kByteVocabSize);
  const TokenStream val = TokenStream::open(s.val, kByteVocabSize);
  EXPECT_GT(train.size(), 2'000'000);
  EXPECT_GT(val.size(), train.size() / 40);
  EXPECT_LT(val.size(), train.size() / 10);
  BatchSampler sampler(train, {.batch_size = 2, .seq_len = 256, .seed = 0});
  const std::string sample = decode_bytes(values(sampler.next().inputs));
  EXPECT_NE(sample.find(" the "), std::string::npos) << sample;
}

}  // namespace
}  // namespace octet::train
