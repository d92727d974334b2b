// The shard writer of `octet prepare` without Python: a vocabulary past 65,535 (DeepSeek-V3's
// 129,280) gives uint32 shards, split into several files, each document after the end-of-text id,
// whole documents held out for validation, and a manifest that the data source and the vocabulary
// check read back.
#include "train/prepare.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "train/data.h"

namespace octet::train {
namespace {

namespace fs = std::filesystem;

TEST(TokenizedDataWriter, LargeVocabularyWritesUint32ShardsAndAManifest) {
  const fs::path dir =
      fs::temp_directory_path() / ("octet_prepare_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  TokenizedDataWriter w({.out_dir = dir.string(),
                         .vocab_size = 129280,
                         .eot_id = 1,
                         .val_fraction = 0.2,
                         .shard_tokens = 100});
  std::vector<uint32_t> doc;
  int64_t tokens = 0;
  for (int d = 0; d < 30; ++d) {
    doc.assign(static_cast<size_t>(9 + d % 4), 0);
    for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<uint32_t>(129279 - d * 100 - i);
    w.add_document(doc);
    tokens += static_cast<int64_t>(doc.size()) + 1;
  }
  w.add_document({});  // blank: skipped
  EXPECT_THROW(w.add_document(std::vector<uint32_t>{129280}), Error);
  const TokenizedDataSummary s = w.finish(R"({"tokenizer": {"sha256": "feed"}})");
  EXPECT_EQ(s.token_type, io::ShardTokens::kU32);
  EXPECT_EQ(s.train_documents + s.val_documents, 30);
  EXPECT_EQ(s.train_tokens + s.val_tokens, tokens);
  EXPECT_GT(s.train.size(), 1u);  // 100 tokens per shard
  EXPECT_NEAR(static_cast<double>(s.val_tokens) / static_cast<double>(tokens), 0.2, 0.05);

  const ShardSet set = resolve_data_source({.path = dir.string()});
  EXPECT_EQ(set.train, s.train);
  EXPECT_EQ(set.val, s.val);
  EXPECT_EQ(data_vocab(set).vocab_size, 129280);
  EXPECT_EQ(data_vocab(set).tokenizer, "feed");
  const DataStreams streams = open_data_streams(set, 129280);
  std::vector<int32_t> head(3);
  streams.train.read(0, 3, head.data());
  EXPECT_EQ(head, (std::vector<int32_t>{1, 129279, 129278}));  // end-of-text, then the document
  EXPECT_THROW(open_data_streams(set, 65536), Error);
  std::ifstream in(s.manifest);
  const nlohmann::json m = nlohmann::json::parse(in);
  EXPECT_EQ(m["token_type"], "uint32");
  EXPECT_EQ(m["eot_id"], 1);
  EXPECT_EQ(m["documents"]["train"].get<int64_t>(), s.train_documents);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace octet::train
