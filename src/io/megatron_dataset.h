// Megatron-LM's indexed datasets (the "mmap" format its tools/preprocess_data.py writes), read as
// they are: a prefix names `prefix.idx` (the index) and `prefix.bin` (the tokens).
//
// Index layout (megatron/core/datasets/indexed_dataset.py, _IndexWriter; all little-endian):
//   magic            9 bytes "MMIDIDX\0\0"
//   version          uint64, 1
//   dtype code       uint8: 8 = uint16 (vocabularies under 65,500), 4 = int32 (larger ones);
//                    the other codes (uint8, int8, int16, int64, float32, float64) are refused
//   sequence count   uint64 S
//   document count   uint64 D + 1 (the document index holds an end sentinel)
//   sequence_lengths int32 x S     tokens per sequence
//   sequence_pointers int64 x S    byte offset of each sequence in the .bin
//   document_indices int64 x D+1   the first sequence of each document, then S
//   (sequence_modes  int8 x S, only in multimodal datasets, which are refused: the file size
//                    then differs from the above)
// The .bin is the sequences' tokens back to back. preprocess_data.py writes one sequence per
// document (several with --split-sentences) and with --append-eod ends each with the tokenizer's
// end-of-document id, which is what separates documents in the stream; octet reads the stream as
// it is.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/token_shard.h"

namespace octet::io {

class MegatronDataset {
 public:
  // Opens and validates prefix.idx and prefix.bin, each error naming the file and the problem:
  // the magic, version and dtype; an index of exactly the size its counts give (truncated or with
  // trailing bytes otherwise); non-negative lengths; pointers that lay the sequences back to back
  // from offset 0; a document index that starts at 0, never decreases and ends at S; and a .bin of
  // exactly the tokens the index counts. With vocab_size > 0 every token must be below it.
  static MegatronDataset open(const std::string& prefix, int64_t vocab_size = 0);

  const std::string& prefix() const { return prefix_; }
  ShardTokens token_type() const { return type_; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return static_cast<int64_t>(doc_token_starts_.size()) - 1; }
  // The token offset where document d begins, d in [0, num_documents()]; the last is num_tokens().
  int64_t document_start(int64_t d) const;
  // Tokens [begin, end) of the stream as a shard view that shares the mapping (no copy).
  TokenShard tokens(int64_t begin, int64_t end) const;

 private:
  std::string prefix_;
  std::shared_ptr<const void> bin_;  // the .bin mapping
  const void* data_ = nullptr;
  ShardTokens type_ = ShardTokens::kU16;
  int64_t num_tokens_ = 0, num_sequences_ = 0;
  std::vector<int64_t> doc_token_starts_;
};

}  // namespace octet::io
