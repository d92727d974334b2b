#include "train/prepare.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/atomic_file.h"
#include "train/token_shard_writer.h"

namespace octet {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

// One split's shards: tokens accumulate and every shard_tokens of them become a file.
struct TokenizedDataWriter::Split : TokenShardWriter<uint32_t> {
  using TokenShardWriter::TokenShardWriter;
};

TokenizedDataWriter::TokenizedDataWriter(const TokenizedDataArgs& args) : args_(args) {
  OCTET_CHECK(args.vocab_size >= 1, "prepare: vocab_size must be >= 1, got ", args.vocab_size);
  OCTET_CHECK(args.eot_id >= 0 && args.eot_id < args.vocab_size, "prepare: end-of-text id ",
              args.eot_id, " is outside the vocabulary of ", args.vocab_size);
  OCTET_CHECK(args.val_fraction >= 0 && args.val_fraction < 1,
              "prepare: val_fraction must be in [0, 1), got ", args.val_fraction);
  OCTET_CHECK(args.shard_tokens >= 1 && args.shard_tokens <= io::kShardMaxTokens,
              "prepare: shard_tokens must be in [1, ", io::kShardMaxTokens, "], got ",
              args.shard_tokens);
  std::error_code ec;
  fs::create_directories(args.out_dir, ec);
  OCTET_CHECK(!ec, args.out_dir, ": cannot create the output directory: ", ec.message());
  const io::ShardTokens type = io::shard_tokens_for_vocab(args.vocab_size);
  train_ = std::make_unique<Split>(args.out_dir, "train", args.shard_tokens, type);
  val_ = std::make_unique<Split>(args.out_dir, "val", args.shard_tokens, type);
}

TokenizedDataWriter::~TokenizedDataWriter() = default;

void TokenizedDataWriter::add_document(std::span<const uint32_t> tokens) {
  if (tokens.empty()) return;
  for (size_t i = 0; i < tokens.size(); ++i)
    OCTET_CHECK(tokens[i] < static_cast<uint64_t>(args_.vocab_size), "prepare: document ",
                train_->documents() + val_->documents(), ": token ", tokens[i], " at index ", i,
                " is outside the tokenizer's vocabulary of ", args_.vocab_size);
  const auto n = static_cast<double>(tokens.size() + 1);
  const double total = static_cast<double>(train_->tokens() + val_->tokens()) + n;
  const bool to_val = static_cast<double>(val_->tokens()) + n <= args_.val_fraction * total;
  (to_val ? *val_ : *train_).add_document(static_cast<uint32_t>(args_.eot_id), tokens);
}

TokenizedDataSummary TokenizedDataWriter::finish(const std::string& extra_json) {
  train_->finish();
  val_->finish();
  OCTET_CHECK(train_->tokens() > 0, "prepare: the inputs hold no text (every document is blank)");
  Json m = {{"format", "octet token shards"},
            {"version", 1},
            {"vocab_size", args_.vocab_size},
            {"eot_id", args_.eot_id},
            {"token_type", io::shard_tokens_name(train_->type())},
            {"val_fraction", args_.val_fraction},
            {"shard_tokens", args_.shard_tokens},
            {"documents", {{"train", train_->documents()}, {"val", val_->documents()}}},
            {"tokens", {{"train", train_->tokens()}, {"val", val_->tokens()}}}};
  if (!extra_json.empty()) {
    const Json extra = Json::parse(extra_json);
    OCTET_CHECK(extra.is_object(), "prepare: the manifest's extra keys must be a JSON object");
    for (const auto& [k, v] : extra.items()) m[k] = v;
  }
  m["train"] = train_->list();
  m["val"] = val_->list();
  TokenizedDataSummary s;
  s.manifest = (fs::path(args_.out_dir) / "manifest.json").string();
  io::write_text_file_atomic(s.manifest, m.dump(2) + "\n");
  s.train = train_->paths();
  s.val = val_->paths();
  s.train_tokens = train_->tokens();
  s.val_tokens = val_->tokens();
  s.train_documents = train_->documents();
  s.val_documents = val_->documents();
  s.token_type = train_->type();
  return s;
}

}  // namespace octet
