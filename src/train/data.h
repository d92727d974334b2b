// Training data: UTF-8 text tokenized byte by byte and prepared once into llm.c token shards
// (io/token_shard.h), llm.c shards from elsewhere taken as they are, and batches of packed
// sequences drawn deterministically from a seed.
//
// Pipeline: a data source (resolve_data_source) becomes a ShardSet (train and validation shard
// paths); TokenStream concatenates shards into one token sequence; BatchSampler draws training
// batches from it and ValBatches yields the fixed validation batches.
//
// Packing: documents are stored back to back, each preceded by an end-of-text token (as llm.c's
// fineweb.py stores GPT-2's <|endoftext|>), and a sequence is any window of the stream, so
// sequences cross document boundaries and nothing is padded.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace octet::io {
class TokenShard;  // io/token_shard.h (data.cpp)
}  // namespace octet::io

namespace octet::train {

// ---------------------------------------------------------------------------------------------
// Byte-level tokenizer: token ids 0..255 are the bytes of the UTF-8 text, 256 separates documents.

inline constexpr int32_t kEndOfText = 256;
inline constexpr int64_t kByteVocabSize = 257;  // the smallest vocab_size that fits byte tokens

// Appends the bytes of `text` as tokens (no end-of-text token).
void append_byte_tokens(std::string_view text, std::vector<uint16_t>& out);
std::vector<uint16_t> encode_bytes(std::string_view text);
// Text of byte tokens, for printing samples: kEndOfText becomes "<|endoftext|>" and ids above it
// "<|id|>". Bytes are copied as they are, so a window that starts or ends inside a multi-byte
// character gives a string that is not valid UTF-8 at that end.
std::string decode_bytes(std::span<const int32_t> tokens);

// ---------------------------------------------------------------------------------------------
// Text corpora.

struct TextCorpus {
  std::vector<std::string> files;  // UTF-8 text files, read in this order
  // A line equal to this ends a document (fortune files use "%"); empty: one document per file.
  std::string document_separator;
};

// The default corpus: Debian's `fortunes` package (scripts/setup.sh installs it), about 2.5 MB of
// English quotations, jokes, poems and prose in 43 files, ~30,000 documents separated by "%"
// lines. BSD-licensed collection from 4.4BSD's fortune(6).
inline constexpr const char* kDefaultCorpusDir = "/usr/share/games/fortunes";
inline constexpr const char* kDefaultCorpusSeparator = "%";

// The regular files of `dir` whose names have no extension (the packages' index files are `.dat`
// and their `.u8` names are links), sorted by name. Throws, telling the user to run
// scripts/setup.sh, when the directory or its files are missing.
TextCorpus default_corpus(const std::string& dir = kDefaultCorpusDir);

// ---------------------------------------------------------------------------------------------
// Preparing text into shards, once.

struct ShardSet {
  std::vector<std::string> train;  // shard paths in stream order
  std::vector<std::string> val;    // may be empty (no validation data)
  // Instead of shards: a Megatron-LM indexed dataset (io/megatron_dataset.h) whose last
  // megatron_val_fraction of the tokens, cut at a document start, is the validation data.
  std::string megatron;
  double megatron_val_fraction = 0;
};

struct PrepareTextArgs {
  TextCorpus corpus;
  std::string out_dir;  // shards and manifest.json are written here (created if missing)
  // Fraction of each file's text held out for validation, in [0, 1): the tail of every file, cut
  // at the first document start at or after the fraction's point (else at a line start, else at
  // a character boundary), so every file is represented in both splits.
  double val_fraction = 0.05;
  int64_t shard_tokens = 100'000'000;  // tokens per shard file (llm.c's fineweb.py shard size)
};

struct PreparedText {
  ShardSet shards;  // out_dir/train_000000.bin ..., out_dir/val_000000.bin ...
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  bool reused = false;  // true: an up-to-date preparation was found and nothing was written
};

// Tokenizes the corpus into shards unless out_dir's manifest.json shows the same sources (paths,
// sizes, modification times), separator, split and shard size, and every shard it lists is intact.
// Every file is validated as UTF-8 (the error names the file and the offset of the first bad
// byte). Not safe against a concurrent preparation of the same out_dir: with several processes,
// one prepares and the others wait for it.
PreparedText prepare_text_shards(const PrepareTextArgs& args);

// ---------------------------------------------------------------------------------------------
// Data sources.

// The files matching a glob(3) pattern, sorted; throws naming the pattern when none match.
std::vector<std::string> expand_glob(const std::string& pattern);

// llm.c shards in a directory: train = its *train*.bin, val = its *val*.bin, each sorted by name
// (the naming of llm.c's dev/data scripts, e.g. fineweb_train_000001.bin,
// tiny_shakespeare_val.bin).
ShardSet find_shards(const std::string& dir);

struct DataSourceArgs {
  // "" for the default corpus; else a text file, an llm.c shard (*.bin), a directory (of *.bin
  // shards, else of *.txt files), or a glob of shards or of text files.
  std::string path;
  // Shards only, optional: validation shards as a file, directory or glob. Default: the *val*.bin
  // shards in the directory of the training shards.
  std::string val_path;
  // Text only: prepared shards go to cache_dir/text-<hash of the sources and split>/.
  std::string cache_dir;
  double val_fraction = 0.05;  // text only, see PrepareTextArgs
  // Text only, see TextCorpus; the default corpus always uses kDefaultCorpusSeparator.
  std::string document_separator;
  // A Megatron-LM dataset prefix instead of `path` (which must then be empty); its validation
  // split is val_fraction.
  std::string megatron;
};

// The shards to train and validate on; text is prepared first (prepare_text_shards). Throws when
// nothing matches, when text and shards are mixed, or when a shard is both train and val.
ShardSet resolve_data_source(const DataSourceArgs& args);

// The vocabulary the data was tokenized with, as the manifest.json beside the first training
// shard records it (`octet prepare` writes vocab_size; octet's byte-level preparation is 257 ids);
// vocab_size 0 when there is no manifest (llm.c's shards, for one).
struct DataVocab {
  int64_t vocab_size = 0;
  std::string manifest;   // the manifest's path
  std::string tokenizer;  // what the manifest names it ("bytes", a tokenizer.json hash, ...)
};
DataVocab data_vocab(const ShardSet& shards);

// ---------------------------------------------------------------------------------------------
// Token streams and batches.

// Shards concatenated into one token sequence (the shards stay memory-mapped; copies share them).
class TokenStream {
 public:
  TokenStream() = default;
  // Opens and validates every shard (io::TokenShard::open), every token bounded by vocab_size.
  static TokenStream open(const std::vector<std::string>& paths, int64_t vocab_size);
  // Shards already opened (and bound-checked), in stream order.
  static TokenStream from_shards(std::vector<io::TokenShard> shards);

  int64_t size() const { return offsets_.empty() ? 0 : offsets_.back(); }
  // The first shard's path, and how many more there are: for messages.
  std::string name() const;
  // Copies tokens [start, start + n) of the stream, across shard boundaries, as int32.
  void read(int64_t start, int64_t n, int32_t* out) const;

 private:
  struct Shards;                          // the memory-mapped shard files (data.cpp)
  std::shared_ptr<const Shards> shards_;  // shared by copies
  std::vector<int64_t> offsets_;          // offsets_[i] = tokens in shards 0..i
};

// The training and validation streams of a data source. Checks the data's vocabulary
// (data_vocab) against the model's vocab_size first, naming both and the setting to change, then
// opens every shard with its tokens bounded by vocab_size. val is empty without validation data.
struct DataStreams {
  TokenStream train;
  std::optional<TokenStream> val;
};
DataStreams open_data_streams(const ShardSet& shards, int64_t vocab_size);

struct TokenBatch {
  Tensor inputs;   // (B, T) int32, host
  Tensor targets;  // (B, T) int32, host: targets[b][t] is the stream's token after inputs[b][t]
};

struct SamplerArgs {
  int64_t batch_size = 0;  // B: sequences per step on this rank
  int64_t seq_len = 0;     // T: each sequence reads T + 1 consecutive tokens
  uint64_t seed = 0;
  // Data parallelism: a step draws B * world_size windows and this rank takes the rank-th B.
  int64_t rank = 0;
  int64_t world_size = 1;
};

// Everything a resumed run needs to continue with the same batches, as plain int64 values for a
// checkpoint. num_tokens and seq_len are there to refuse a resume on different data or shapes.
struct SamplerState {
  static constexpr int kSize = 5;
  int64_t seed = 0;        // the sampler's seed, bit-cast to int64
  int64_t epoch = 0;       // passes completed over the training windows
  int64_t position = 0;    // windows of this epoch already drawn (all ranks together)
  int64_t num_tokens = 0;  // the stream's size
  int64_t seq_len = 0;

  std::array<int64_t, kSize> to_array() const;
  static SamplerState from_array(std::span<const int64_t> values);
};

// Training batches. Epoch e cuts the stream into W_e windows of T + 1 tokens, window w starting at
// token offset_e + w * T (consecutive windows share one token, as in llm.c's loader), with
// offset_e in [0, T) drawn from the seed so that sequence boundaries move between epochs. The
// windows of an epoch are visited in the order of a seeded permutation of [0, W_e) (a Feistel
// network on the next power of four, cycle-walked into range: O(1) memory and random access,
// which is what lets state() be a few integers). A batch that exhausts an epoch continues into
// the next, so every epoch visits every window exactly once. Same seed and data: the same batches
// on every platform.
class BatchSampler {
 public:
  BatchSampler(TokenStream stream, const SamplerArgs& args);

  TokenBatch next();
  SamplerState state() const;
  // Continues exactly where `state` was taken. The seed is the state's (the state determines
  // every later batch); a different stream size or seq_len is refused.
  void set_state(const SamplerState& state);

  int64_t epoch() const { return epoch_; }
  int64_t windows_in_epoch() const { return plan_.windows; }
  const TokenStream& stream() const { return stream_; }

 private:
  struct EpochPlan {
    int64_t windows = 0;
    int64_t offset = 0;
    uint64_t key = 0;
    int bits = 0;  // the permutation's domain is [0, 2^bits)
  };
  EpochPlan plan_epoch(int64_t epoch) const;
  int64_t window_start(int64_t position) const;

  TokenStream stream_;
  SamplerArgs args_;
  int64_t epoch_ = 0, position_ = 0;
  EpochPlan plan_;
};

struct ValBatchesArgs {
  int64_t batch_size = 0;   // B
  int64_t seq_len = 0;      // T
  int64_t max_batches = 0;  // at most this many batches; 0: all that fit
};

// Validation batches: the stream's windows in order from token 0 (window w starts at w * T),
// B per batch, so batch(i) is the same on every call and in every run.
class ValBatches {
 public:
  ValBatches(TokenStream stream, const ValBatchesArgs& args);
  int64_t size() const { return num_batches_; }
  TokenBatch batch(int64_t i) const;

 private:
  TokenStream stream_;
  ValBatchesArgs args_;
  int64_t num_batches_ = 0;
};

}  // namespace octet::train
