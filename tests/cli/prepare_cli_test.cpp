// `octet prepare` end to end with a tokenizer trained in the test (scripts/prepare_tokens.py, the
// `tokenizers` package of the venv): text files, a directory and JSON lines become shards whose
// documents each start with the end-of-text id, the tokenizer.json and manifest beside them, the
// given tokenizer gives the same ids, `octet train` trains on them, and a model whose vocab_size is
// too small is refused naming the setting.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_fixture.h"
#include "io/token_shard.h"

namespace octet {
namespace {

namespace fs = std::filesystem;
using test::slurp;

const char* const kTinyModel =
    " --set device=cpu --set batch_size=2 --set seq_len=16 --set log_every=1 --set eval.every=2"
    " --set eval.batches=1 --set optim.warmup_steps=0 --set sites_every=0"
    " --set model.hidden_size=32 --set model.intermediate_size=64"
    " --set model.moe_intermediate_size=16 --set model.num_attention_heads=2"
    " --set model.q_lora_rank=16 --set model.kv_lora_rank=16 --set model.qk_nope_head_dim=16"
    " --set model.qk_rope_head_dim=16 --set model.v_head_dim=16"
    " --set model.max_position_embeddings=32";

class PrepareCli : public test::CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    const fs::path python = fs::path(OCTET_CLI_PATH).parent_path() / ".." / ".venv/bin/python";
    if (!fs::exists(python)) GTEST_SKIP() << python << " is missing: run scripts/setup.sh";
    fs::create_directories(path("texts"));
    std::ostringstream a, b;
    for (int i = 0; i < 60; ++i) {
      a << "The quick brown fox " << i % 7 << " jumps over the lazy dog.\n%\n";
      b << "Pack my box with " << i % 5 << " dozen liquor jugs, said the sphinx.\n%\n";
    }
    std::ofstream(path("texts/a.txt")) << a.str();
    std::ofstream(path("texts/b.txt")) << b.str();
    std::ofstream(path("docs.jsonl")) << "{\"text\": \"first json document\", \"id\": 1}\n"
                                      << "{\"text\": \"second one\"}\n\n"
                                      << "{\"text\": \"\"}\n";
  }
  test::CliResult run(const std::string& args) const { return run_octet(args); }
  nlohmann::json manifest(const std::string& dir) const {
    return nlohmann::json::parse(slurp(path(dir) + "/manifest.json"));
  }
  // Every token of the shards of a split, in order.
  std::vector<int32_t> tokens(const nlohmann::json& m, const std::string& dir,
                              const std::string& split, int64_t vocab) const {
    std::vector<int32_t> out;
    for (const auto& s : m[split]) {
      const io::TokenShard shard =
          io::TokenShard::open(path(dir) + "/" + s["file"].get<std::string>(), vocab);
      EXPECT_EQ(shard.size(), s["tokens"].get<int64_t>());
      const size_t at = out.size();
      out.resize(at + static_cast<size_t>(shard.size()));
      shard.read(0, shard.size(), out.data() + at);
    }
    return out;
  }
};

TEST_F(PrepareCli, TrainsATokenizerWritesShardsAndTrainsOnThem) {
  const test::CliResult r =
      run("prepare '" + path("texts") + "' '" + path("docs.jsonl") + "' --out '" + path("data") +
          "' --train-tokenizer 320 --separator % --val-fraction 0.1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("byte-level BPE trained on the input"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::is_regular_file(path("data/tokenizer.json")));
  const nlohmann::json m = manifest("data");
  const int64_t vocab = m["vocab_size"];
  EXPECT_GT(vocab, 257);
  EXPECT_LE(vocab, 320);
  EXPECT_EQ(m["token_type"], "uint16");
  EXPECT_EQ(m["tokenizer"]["eot"], "<|endoftext|>");
  EXPECT_EQ(m["tokenizer"]["sha256"].get<std::string>().size(), 64u);
  EXPECT_EQ(m["sources"].size(), 3u);
  // 60 + 60 fortune-style documents and 2 non-empty JSON lines, split between train and val.
  const int64_t train_docs = m["documents"]["train"], val_docs = m["documents"]["val"];
  EXPECT_EQ(train_docs + val_docs, 122);
  EXPECT_GT(val_docs, 0);
  const int32_t eot = m["eot_id"];
  for (const char* split : {"train", "val"}) {
    const std::vector<int32_t> t = tokens(m, "data", split, vocab);
    EXPECT_EQ(static_cast<int64_t>(t.size()), m["tokens"][split].get<int64_t>());
    ASSERT_FALSE(t.empty());
    EXPECT_EQ(t[0], eot) << split;
    EXPECT_EQ(std::count(t.begin(), t.end(), eot), m["documents"][split].get<int64_t>()) << split;
  }
  const double val_share = m["tokens"]["val"].get<double>() /
                           (m["tokens"]["train"].get<double>() + m["tokens"]["val"].get<double>());
  EXPECT_NEAR(val_share, 0.1, 0.03);

  // The tokenizer it wrote, given back, gives the same ids.
  const test::CliResult again =
      run("prepare '" + path("texts") + "' '" + path("docs.jsonl") + "' --out '" + path("data2") +
          "' --tokenizer '" + path("data/tokenizer.json") + "' --separator % --val-fraction 0.1");
  ASSERT_EQ(again.code, 0) << again.err;
  const nlohmann::json m2 = manifest("data2");
  EXPECT_EQ(m2["tokenizer"]["sha256"], m["tokenizer"]["sha256"]);
  EXPECT_EQ(tokens(m2, "data2", "train", vocab), tokens(m, "data", "train", vocab));

  // Training takes the shards; a model vocabulary below the tokenizer's is refused before work.
  const std::string data = " --set 'data.shards=\"" + path("data") + "\"'";
  const test::CliResult t = run("train" + std::string(kTinyModel) + data +
                                " --set steps=2 --set model.vocab_size=" + std::to_string(vocab) +
                                " --set run_dir='" + path("run") + "'");
  ASSERT_EQ(t.code, 0) << t.err << t.out;
  // The export of the run carries the tokenizer its data was made with.
  const test::CliResult e =
      run("export '" + path("run") + "' '" + path("exported") + "' --format bf16");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_EQ(slurp(path("exported/tokenizer.json")), slurp(path("data/tokenizer.json")));
  const test::CliResult small =
      run("train" + std::string(kTinyModel) + data + " --set steps=2 --set model.vocab_size=" +
          std::to_string(vocab - 1) + " --set run_dir='" + path("run_small") + "'");
  EXPECT_EQ(small.code, 1);
  EXPECT_NE(small.err.find("model.vocab_size = " + std::to_string(vocab)), std::string::npos)
      << small.err;
  EXPECT_FALSE(fs::exists(path("run_small/metrics.jsonl")));
}

TEST_F(PrepareCli, BadInputsAreOneClearError) {
  std::ofstream(path("bad.jsonl")) << "{\"body\": \"no text field\"}\n";
  test::CliResult r =
      run("prepare '" + path("bad.jsonl") + "' --out '" + path("d") + "' --train-tokenizer 300");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("bad.jsonl:1: no string field \"text\""), std::string::npos) << r.err;
  r = run("prepare '" + path("missing.txt") + "' --out '" + path("d") + "' --train-tokenizer 300");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("missing.txt: input not found"), std::string::npos) << r.err;
  r = run("prepare '" + path("texts") + "' --out '" + path("d") + "' --train-tokenizer 100");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("[257, "), std::string::npos) << r.err;
  r = run("prepare '" + path("texts") + "' --out '" + path("d") + "'");
  EXPECT_NE(r.err.find("exactly one of --tokenizer"), std::string::npos) << r.err;
  // An earlier preparation is replaced only with --force.
  ASSERT_EQ(
      run("prepare '" + path("texts") + "' --out '" + path("d") + "' --train-tokenizer 300").code,
      0);
  r = run("prepare '" + path("texts") + "' --out '" + path("d") + "' --train-tokenizer 300");
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(
      run("prepare '" + path("texts") + "' --out '" + path("d") + "' --train-tokenizer 300 --force")
          .code,
      0);
}

}  // namespace
}  // namespace octet
