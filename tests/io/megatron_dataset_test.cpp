// Megatron-LM indexed datasets (.idx + .bin, MMIDIDX) written by the test in the documented layout
// (megatron/core/datasets/indexed_dataset.py, _IndexWriter): read as they are in both token
// dtypes, with document boundaries; one test per kind of damage, each error naming the file; and
// as a run's data source (data.megatron) with its validation tail cut at a document start.
#include "io/megatron_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "tiny_model.h"
#include "train/data.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace octet {
using train::DataStreams;
using train::open_data_streams;
using train::resolve_data_source;
using train::ShardSet;
namespace {

namespace fs = std::filesystem;

// A document is a list of sequences; a sequence a list of token ids.
using Doc = std::vector<std::vector<int64_t>>;

struct Layout {
  uint8_t dtype_code = 8;  // 8 uint16, 4 int32
  uint64_t version = 1;
  std::string magic = std::string("MMIDIDX\0\0", 9);
};

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// What preprocess_data.py's builder writes for `docs`: the .bin (tokens back to back) and the .idx.
std::pair<std::string, std::string> megatron_files(const std::vector<Doc>& docs,
                                                   const Layout& l = {}) {
  std::string bin, idx = l.magic;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, doc_index = {0};
  for (const Doc& d : docs) {
    for (const auto& seq : d) {
      pointers.push_back(static_cast<int64_t>(bin.size()));
      lengths.push_back(static_cast<int32_t>(seq.size()));
      for (const int64_t t : seq) {
        if (l.dtype_code == 8)
          put(bin, static_cast<uint16_t>(t));
        else
          put(bin, static_cast<int32_t>(t));
      }
    }
    doc_index.push_back(static_cast<int64_t>(lengths.size()));
  }
  put(idx, l.version);
  put(idx, l.dtype_code);
  put(idx, static_cast<uint64_t>(lengths.size()));
  put(idx, static_cast<uint64_t>(doc_index.size()));
  for (const int32_t v : lengths) put(idx, v);
  for (const int64_t v : pointers) put(idx, v);
  for (const int64_t v : doc_index) put(idx, v);
  return {bin, idx};
}

class MegatronTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("octet_megatron_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::pair<std::string, std::string>& files) {
    const std::string prefix = (dir_ / name).string();
    std::ofstream(prefix + ".bin", std::ios::binary) << files.first;
    std::ofstream(prefix + ".idx", std::ios::binary) << files.second;
    return prefix;
  }
  static void expect_error(const std::string& prefix, const std::string& file,
                           const std::string& fragment, int64_t vocab = 0) {
    try {
      io::MegatronDataset::open(prefix, vocab);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(file), std::string::npos) << msg;
      EXPECT_NE(msg.find(fragment), std::string::npos) << "missing '" << fragment << "': " << msg;
    }
  }

  fs::path dir_;
};

// Three documents, the second of two sequences (--split-sentences), each ending in eod = 0.
std::vector<Doc> three_docs(int64_t big = 0) {
  return {{{5, 6, 7, 0}}, {{8, 9}, {10, 11 + big, 0}}, {{12, 13, 14, 15, 16, 0}}};
}

TEST_F(MegatronTest, ReadsBothDtypesWithDocumentBoundaries) {
  for (const uint8_t code : {uint8_t{8}, uint8_t{4}}) {
    const int64_t big = code == 4 ? 129000 : 0;  // int32 holds ids past 65,535
    const std::string p =
        write("c" + std::to_string(code), megatron_files(three_docs(big), {code}));
    const io::MegatronDataset m = io::MegatronDataset::open(p, 129280);
    EXPECT_EQ(m.token_type(), code == 8 ? io::ShardTokens::kU16 : io::ShardTokens::kU32);
    EXPECT_EQ(m.num_tokens(), 15);
    EXPECT_EQ(m.num_sequences(), 4);
    ASSERT_EQ(m.num_documents(), 3);
    EXPECT_EQ(m.document_start(0), 0);
    EXPECT_EQ(m.document_start(1), 4);
    EXPECT_EQ(m.document_start(2), 9);
    EXPECT_EQ(m.document_start(3), 15);
    std::vector<int32_t> t(5);
    m.tokens(4, 9).read(0, 5, t.data());
    EXPECT_EQ(t, (std::vector<int32_t>{8, 9, 10, static_cast<int32_t>(11 + big), 0}));
  }
  // An empty dataset is valid (and empty).
  EXPECT_EQ(io::MegatronDataset::open(write("empty", megatron_files({}))).num_tokens(), 0);
}

TEST_F(MegatronTest, DamageIsOneClearError) {
  const auto good = megatron_files(three_docs());
  std::string p = write("magic", megatron_files(three_docs(), {8, 1, "MMIDIDY\0\0"}));
  expect_error(p, p + ".idx", "not a Megatron-LM index");
  p = write("version", megatron_files(three_docs(), {8, 2}));
  expect_error(p, p + ".idx", "version 2");
  p = write("dtype", megatron_files(three_docs(), {7}));
  expect_error(p, p + ".idx", "dtype code 7 (float32)");
  p = write("short_idx", {good.first, good.second.substr(0, good.second.size() - 3)});
  expect_error(p, p + ".idx", "truncated Megatron index");
  p = write("long_idx", {good.first, good.second + std::string(4, '\0')});
  expect_error(p, p + ".idx", "multimodal");
  p = write("short_bin", {good.first.substr(0, 20), good.second});
  expect_error(p, p + ".bin", "truncated Megatron data: the index counts 15 uint16 tokens");
  p = write("long_bin", {good.first + "xx", good.second});
  expect_error(p, p + ".bin", "trailing data");
  // A pointer that does not follow the lengths (sequence 1 moved by 2 bytes).
  std::string idx = good.second;
  int64_t ptr = 0;
  std::memcpy(&ptr, idx.data() + 34 + 4 * 4 + 8, 8);
  ptr += 2;
  std::memcpy(idx.data() + 34 + 4 * 4 + 8, &ptr, 8);
  p = write("pointer", {good.first, idx});
  expect_error(p, p + ".idx", "sequence 1 starts at byte 10");
  // A document index that goes backwards.
  idx = good.second;
  const int64_t back = 0;
  std::memcpy(idx.data() + idx.size() - 16, &back, 8);
  p = write("docs", {good.first, idx});
  expect_error(p, p + ".idx", "document index entry 2 is 0");
  p = write("vocab", good);
  expect_error(p, p + ".bin", "token 16 at index 13", 16);
  expect_error((dir_ / "absent").string(), "absent.idx", "cannot open");
}

TEST_F(MegatronTest, IsARunsDataSourceWithAValidationTail) {
  // 40 documents of 30 tokens: a 10% validation tail is the last 4 documents.
  std::vector<Doc> docs;
  for (int d = 0; d < 40; ++d) {
    std::vector<int64_t> seq;
    for (int i = 0; i < 29; ++i) seq.push_back(1 + (d * 31 + i * 7) % 150);
    seq.push_back(0);
    docs.push_back({seq});
  }
  const std::string p = write("corpus_text_document", megatron_files(docs));
  const ShardSet s = resolve_data_source({.val_fraction = 0.1, .megatron = p});
  EXPECT_EQ(s.megatron, p);
  const DataStreams d = open_data_streams(s, 160);
  EXPECT_EQ(d.train.size(), 36 * 30);
  ASSERT_TRUE(d.val.has_value());
  EXPECT_EQ(d.val->size(), 4 * 30);
  std::vector<int32_t> first(1);
  d.val->read(0, 1, first.data());
  EXPECT_EQ(first[0], 1 + (36 * 31) % 150);
  try {
    resolve_data_source({.megatron = (dir_ / "nope").string()});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.idx: not found"), std::string::npos) << e.what();
  }

  // octet train on it: a tiny model, two steps, with validation.
  train::TrainConfig c;
  for (const char* kv : {"steps=2", "batch_size=2", "seq_len=16", "eval.every=2", "eval.batches=1",
                         "optim.warmup_steps=0", "device=cpu", "model.vocab_size=160",
                         "recipe=bf16", "data.val_fraction=0.1", "sites_every=0"})
    train::apply_set(c, kv);
  for (const char* kv : test::kTinyTrainModelKeys) train::apply_set(c, kv);
  train::apply_set(c, "run_dir=" + (dir_ / "run").string());
  train::apply_set(c, "data.megatron=\"" + p + "\"");
  c.validate();
  std::ostringstream log;
  const train::RunResult r = train::run_training(c, {}, log);
  EXPECT_EQ(r.steps_done, 2);
  EXPECT_TRUE(std::isfinite(r.final_val_loss)) << log.str();
  EXPECT_NE(log.str().find("train tokens: 1080"), std::string::npos) << log.str();
  // A model vocabulary the data exceeds is refused before any work.
  train::apply_set(c, "model.vocab_size=100");
  train::apply_set(c, "run_dir=" + (dir_ / "run2").string());
  try {
    train::run_training(c, {}, log);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of range for a vocabulary of 100"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "run2" / "metrics.jsonl"));
}

}  // namespace
}  // namespace octet
