// Token shards from a real tokenizer's documents, for `octet prepare`: the documents arrive one at
// a time as token ids (the CLI runs scripts/prepare_tokens.py, which uses the Hugging Face
// `tokenizers` library), and this writes them as llm.c shards with a manifest that data_vocab reads
// back.
//
// Output in out_dir:
//   train_000000.bin ...   llm.c shards (io/token_shard.h): uint16 when the vocabulary fits
//   val_000000.bin ...     (vocab_size <= 65,536), else uint32
//   manifest.json          {"format": "octet token shards", "version": 1, "vocab_size", "eot_id",
//                           "token_type", "val_fraction", "shard_tokens", "documents": {"train",
//                           "val"}, "tokens": {"train", "val"}, "train": [{"file", "tokens"}],
//                           "val": [...], and the caller's keys (tokenizer, sources)}
// Every document is stored as the end-of-text id followed by its tokens, as prepared text is
// (data.h), so documents are separated by the tokenizer's end-of-text id.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/token_shard.h"

namespace octet {

struct TokenizedDataArgs {
  std::string out_dir;  // created if missing
  int64_t vocab_size = 0;
  int64_t eot_id = -1;  // the tokenizer's end-of-text id, in [0, vocab_size)
  // Share of the tokens held out for validation, in [0, 1): whole documents, interleaved (a
  // document goes to validation while that keeps validation at or below the share of all tokens
  // so far), so both splits sample the whole input.
  double val_fraction = 0.05;
  int64_t shard_tokens = 100'000'000;  // tokens per shard file (llm.c's fineweb.py shard size)
};

struct TokenizedDataSummary {
  std::vector<std::string> train, val;  // shard paths
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t train_documents = 0, val_documents = 0;
  io::ShardTokens token_type = io::ShardTokens::kU16;
  std::string manifest;  // its path
};

class TokenizedDataWriter {
 public:
  explicit TokenizedDataWriter(const TokenizedDataArgs& args);
  ~TokenizedDataWriter();
  TokenizedDataWriter(const TokenizedDataWriter&) = delete;
  TokenizedDataWriter& operator=(const TokenizedDataWriter&) = delete;

  // One document's ids (without the end-of-text id, which this adds); each must be below
  // vocab_size. Blank documents (no tokens) are skipped.
  void add_document(std::span<const uint32_t> tokens);
  // Writes the last shards, then manifest.json with the members of `extra_json` (a JSON object's
  // text) added at its top level. Throws when no document reached the training split.
  TokenizedDataSummary finish(const std::string& extra_json);

 private:
  struct Split;
  TokenizedDataArgs args_;
  std::unique_ptr<Split> train_, val_;
};

}  // namespace octet
