#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "tiny_model.h"
#include "train/train_config.h"

namespace octet::train {
namespace {

// The error message of f(), or "" when it does not throw.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_MESSAGE_HAS(msg, part) \
  EXPECT_NE((msg).find(part), std::string::npos) << "message: " << (msg)

TEST(TrainConfig, BuiltInDefaultParsesToTheDefaultsAndValidates) {
  const TrainConfig c = parse_train_config(default_train_config_toml(), "<default>");
  EXPECT_TRUE(c == TrainConfig{});
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.model.vocab_size, 257);
  EXPECT_EQ(c.model.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.model.recipe.preset, "deepseek");
  EXPECT_TRUE(parse_train_config("", "empty") == TrainConfig{});
}

TEST(TrainConfig, ShippedDefaultFileValidates) {
  const auto path = std::filesystem::path(__FILE__).parent_path() / "../../configs/default.toml";
  std::ifstream in(path);
  if (!in) GTEST_SKIP() << "no " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  const TrainConfig c = parse_train_config(ss.str(), path.string());
  EXPECT_NO_THROW(c.validate());
}

TEST(TrainConfig, ParsesSectionsAndTypes) {
  const TrainConfig c = parse_train_config(R"(
run_dir = "runs/x"
steps = 50
recipe = "fp8-flow"
recipe_overrides = ["gemm.attn.out=bf16", "margin=1"]
device = "cpu"
[optim]
lr = 1          # an integer is a number
schedule = "constant"
[data]
shards = "data/*.bin"
[safety]
spike_action = "rollback"
[model]
hidden_size = 256
q_lora_rank = 0
rope_interleave = false
mtp_loss_weight = 0.1
)",
                                           "t.toml");
  EXPECT_EQ(c.run_dir, "runs/x");
  EXPECT_EQ(c.steps, 50);
  EXPECT_EQ(c.model.recipe.preset, "fp8-flow");
  EXPECT_EQ(c.model.recipe.preset, "fp8-flow");
  EXPECT_EQ(c.model.recipe.overrides, (std::vector<std::string>{"gemm.attn.out=bf16", "margin=1"}));
  EXPECT_EQ(c.device, DeviceChoice::kCpu);
  EXPECT_EQ(c.optim.lr, 1.0);
  EXPECT_EQ(c.optim.schedule, LrScheduleKind::kConstant);
  EXPECT_EQ(c.data.shards, "data/*.bin");
  EXPECT_EQ(c.safety.spike_action, SpikeAction::kRollback);
  EXPECT_EQ(c.model.hidden_size, 256);
  EXPECT_FALSE(c.model.q_lora_rank.has_value());
  EXPECT_FALSE(c.model.rope_interleave);
  EXPECT_EQ(c.model.mtp_loss_weight, 0.1);
  EXPECT_EQ(c.model.num_hidden_layers, default_model_config().num_hidden_layers);  // kept
  EXPECT_NO_THROW(c.validate());
}

TEST(TrainConfig, ParseErrorsNameTheKeyAndThePlace) {
  auto parse = [](const std::string& text) {
    return error_of([&] { parse_train_config(text, "t.toml"); });
  };
  std::string msg = parse("[optim]\nlrr = 1e-3\n");
  EXPECT_MESSAGE_HAS(msg, "t.toml:2:");
  EXPECT_MESSAGE_HAS(msg, "unknown key optim.lrr");
  EXPECT_MESSAGE_HAS(msg, "did you mean optim.lr");
  EXPECT_MESSAGE_HAS(msg, "keys of [optim]: lr, min_lr");
  msg = parse("stepz = 3\n");
  EXPECT_MESSAGE_HAS(msg, "did you mean steps");
  EXPECT_MESSAGE_HAS(msg, "sections: [data]");
  msg = parse("[optimizer]\nlr = 1\n");
  EXPECT_MESSAGE_HAS(msg, "unknown key optimizer.lr");
  EXPECT_MESSAGE_HAS(msg, "[optim]");
  EXPECT_MESSAGE_HAS(parse("[evaluation]\n"), "unknown key evaluation");
  EXPECT_MESSAGE_HAS(parse("[model.rope_parameters]\nrope_theta = 1.0\n"),
                     "unknown key model.rope_parameters");
  msg = parse("steps = \"ten\"\n");
  EXPECT_MESSAGE_HAS(msg, "t.toml:1:9: steps must be an integer, got string");
  EXPECT_MESSAGE_HAS(parse("steps = 1.5\n"), "steps must be an integer, got floating-point 1.5");
  EXPECT_MESSAGE_HAS(parse("[optim]\nlr = \"fast\"\n"), "optim.lr must be a number");
  EXPECT_MESSAGE_HAS(parse("[optim]\nschedule = \"linear\"\n"),
                     "optim.schedule must be one of cosine, constant; got 'linear'");
  EXPECT_MESSAGE_HAS(parse("recipe_overrides = [1]\n"), "recipe_overrides must be an array");
  EXPECT_MESSAGE_HAS(parse("steps = = 3\n"), "t.toml:1:");  // TOML syntax
  EXPECT_MESSAGE_HAS(parse("[model]\nconfig = \"/nonexistent/config.json\"\n"), "model.config");
}

// toml++ 3.3 reaches undefined behaviour (__builtin_unreachable) when it asks whether some
// non-ASCII characters are whitespace (found by fuzz/fuzz_train_config: the input kept as
// fuzz/corpus/train_config/crash_toml_nonascii_after_key). Non-ASCII outside strings and comments
// is refused first with a clear error; inside strings and comments it reads as before, also right
// after a line-ending backslash of a multi-line string (toml++ issue 190's case).
TEST(TrainConfig, NonAsciiIsRefusedOutsideStringsAndKeptInside) {
  auto parse = [](const std::string& text) {
    return error_of([&] { parse_train_config(text, "t.toml"); });
  };
  EXPECT_EQ(parse("sze0\xc3\x9bj=~)7\n"),
            "t.toml:1:5: non-ASCII character outside a string or comment");
  EXPECT_EQ(parse("steps = 3\n\xc2\xa7 = 1\n"),
            "t.toml:2:1: non-ASCII character outside a string or comment");
  EXPECT_EQ(parse("run_dir = \"a\\\xc3\xa9\"\n"), "t.toml:1:13: non-ASCII character after '\\'");
  // A quote where no string can start is part of a malformed value to toml++, which asks about
  // the characters after it (crash_toml_quote_inside_value): refused here first.
  EXPECT_EQ(parse("steps = -\"t\xc3\x91  = ''%\"\n"),
            "t.toml:1:12: non-ASCII character outside a string or comment");
  EXPECT_EQ(parse("run_dir = \"a\" \"\xc3\xa9\"\n"),
            "t.toml:1:16: non-ASCII character outside a string or comment");
  // Strings start after '=', '[', ',', '{', '.' and at the start of a line (arrays over lines).
  const TrainConfig q = parse_train_config(
      "\"run_dir\" = 'caf\xc3\xa9'\n"
      "data.\"text\" = \"\xc2\xa7 x\"\n"
      "recipe_overrides = [ # \xc3\xa9\n"
      "  \"gemm.attn.out=bf16\",\n"
      "  '''gemm.attn.q_down=bf16'''\n"
      "]\n",
      "t.toml");
  EXPECT_EQ(q.run_dir, "caf\xc3\xa9");
  EXPECT_EQ(q.data.text, "\xc2\xa7 x");
  EXPECT_EQ(q.model.recipe.overrides.size(), 2u);

  const TrainConfig c = parse_train_config(
      "\xEF\xBB\xBF# caf\xc3\xa9 \xc2\xa7\n"
      "run_dir = \"runs/caf\xc3\xa9\"  # \xc3\x9b\n"
      "[data]\n"
      "text = '''\xc2\xa7 notes'''\n"
      "shards = \"\"\"\\\n   \xc2\xa7x\\\n\n\xef\xad\x80y\"\"\"\n",
      "t.toml");
  EXPECT_EQ(c.run_dir, "runs/caf\xc3\xa9");
  EXPECT_EQ(c.data.text, "\xc2\xa7 notes");
  EXPECT_EQ(c.data.shards, "\xc2\xa7x\xef\xad\x80y");

  TrainConfig s;
  apply_set(s, "run_dir=\xc2\xa7runs");  // not TOML: bare text
  EXPECT_EQ(s.run_dir, "\xc2\xa7runs");
  apply_set(s, "run_dir=\"caf\xc3\xa9\"");
  EXPECT_EQ(s.run_dir, "caf\xc3\xa9");
}

// A --set value taken as bare text may hold bytes that are not UTF-8; saved as is, they made a
// config.toml that no resume can read (found by fuzz/fuzz_train_config: the input kept as
// fuzz/corpus/train_config/crash_set_invalid_utf8). validate() refuses such a string, naming the
// key; UTF-8 text of any script, bare or quoted, still reads back from to_toml.
TEST(TrainConfig, StringsThatAreNotUtf8AreRefusedAndUtf8RoundTrips) {
  const struct {
    const char* set;
    const char* message;
  } cases[] = {
      {"run_dir = \"run\"  # metrics and config\x8d here",
       "run_dir is not valid UTF-8 (byte 0x8d at offset 27)"},
      {"data.text=caf\xe9.txt", "data.text is not valid UTF-8 (byte 0xe9 at offset 3)"},
      {"run_dir=\xc0\xafx", "(byte 0xc0 at offset 0)"},         // overlong '/'
      {"run_dir=a\xed\xa0\x80", "(byte 0xed at offset 1)"},     // a surrogate
      {"run_dir=\xf4\x90\x80\x80", "(byte 0xf4 at offset 0)"},  // above U+10FFFF
      {"run_dir=ab\xe2\x82", "(byte 0xe2 at offset 2)"},        // cut short
      {"recipe_overrides=x\xff", "recipe_overrides is not valid UTF-8"},
  };
  for (const auto& c : cases) {
    TrainConfig t;
    EXPECT_MESSAGE_HAS(error_of([&] {
                         apply_set(t, c.set);
                         t.validate();
                       }),
                       c.message);
  }
  TrainConfig ok;
  apply_set(ok, "run_dir=runs/\xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x93\x88");
  apply_set(ok, "data.text=\xc2\x85notes.txt");  // U+0085, a C1 control: TOML allows it
  ok.validate();
  const TrainConfig back = parse_train_config(to_toml(ok), "saved");
  EXPECT_EQ(back.run_dir, ok.run_dir);
  EXPECT_EQ(back.data.text, ok.data.text);
}

TEST(TrainConfig, SetOverridesAreTypeChecked) {
  TrainConfig c;
  apply_set(c, "optim.lr=1e-3");
  apply_set(c, "steps = 50");
  apply_set(c, "recipe=bf16");
  apply_set(c, "run_dir=runs/exp 1");  // bare text for a string key
  apply_set(c, "data.text=\"corpus.txt\"");
  apply_set(c, "device=cuda");
  apply_set(c, "safety.spike_action=skip");
  apply_set(c, "model.hidden_size=256");
  apply_set(c, "model.q_lora_rank=0");
  apply_set(c, "model.rope_interleave=false");
  apply_set(c, "recipe_overrides=gemm.attn.out=bf16");  // one bare string: a one-element array
  EXPECT_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.steps, 50);
  EXPECT_EQ(c.model.recipe.preset, "bf16");
  EXPECT_EQ(c.model.recipe.preset, "bf16");
  EXPECT_EQ(c.run_dir, "runs/exp 1");
  EXPECT_EQ(c.data.text, "corpus.txt");
  EXPECT_EQ(c.device, DeviceChoice::kCuda);
  EXPECT_EQ(c.safety.spike_action, SpikeAction::kSkip);
  EXPECT_EQ(c.model.hidden_size, 256);
  EXPECT_FALSE(c.model.q_lora_rank.has_value());
  EXPECT_FALSE(c.model.rope_interleave);
  EXPECT_EQ(c.model.recipe.overrides, std::vector<std::string>{"gemm.attn.out=bf16"});
  apply_set(c, R"(recipe_overrides=["gemm.*=bf16", "fp8_flow=false"])");
  EXPECT_EQ(c.model.recipe.overrides.size(), 2u);
  apply_set(c, "recipe_overrides=");
  EXPECT_TRUE(c.model.recipe.overrides.empty());
  apply_set(c, "run_dir=2024");  // a number is still a path for a string key
  EXPECT_EQ(c.run_dir, "2024");

  auto set = [&](const char* a) { return error_of([&] { apply_set(c, a); }); };
  EXPECT_MESSAGE_HAS(set("steps=abc"), "steps must be an integer, got 'abc'");
  EXPECT_MESSAGE_HAS(set("steps=1.5"), "steps must be an integer");
  EXPECT_MESSAGE_HAS(set("optim.lr=fast"), "optim.lr must be a number");
  EXPECT_MESSAGE_HAS(set("model.rope_interleave=1"), "model.rope_interleave must be true or false");
  EXPECT_MESSAGE_HAS(set("optim.schedule=linear"), "must be one of cosine, constant");
  EXPECT_MESSAGE_HAS(set("optim.lrr=1"), "did you mean optim.lr");
  EXPECT_MESSAGE_HAS(set("lr=1"), "did you mean optim.lr");  // the leaf of a sectioned key
  EXPECT_MESSAGE_HAS(set("model.hidden=1"), "did you mean model.hidden_size");
  EXPECT_MESSAGE_HAS(set("steps"), "expected key=value");
  EXPECT_MESSAGE_HAS(set("model.extra=[1]"), "model.extra");
  EXPECT_EQ(c.steps, 50);  // failed sets change nothing
}

TEST(TrainConfig, ValidateNamesTheKey) {
  auto invalid = [](const char* assignment) {
    TrainConfig c;
    apply_set(c, assignment);
    return error_of([&] { c.validate(); });
  };
  EXPECT_MESSAGE_HAS(invalid("steps=0"), "steps must be >= 1, got 0");
  EXPECT_MESSAGE_HAS(invalid("batch_size=0"), "batch_size must be >= 1");
  EXPECT_MESSAGE_HAS(invalid("seq_len=0"), "seq_len must be >= 1");
  EXPECT_MESSAGE_HAS(invalid("seq_len=4096"),
                     "seq_len (4096) must be <= model.max_position_embeddings (512)");
  EXPECT_MESSAGE_HAS(invalid("checkpoint_every=-2"), "checkpoint_every must be >= -1");
  EXPECT_MESSAGE_HAS(invalid("grad_accum=0"), "grad_accum must be >= 1");
  EXPECT_MESSAGE_HAS(invalid("optim.min_lr=1.0"), "optim.min_lr must be in [0, optim.lr]");
  EXPECT_MESSAGE_HAS(invalid("optim.beta2=1.0"), "optim.beta2 must be in [0, 1)");
  EXPECT_MESSAGE_HAS(invalid("optim.grad_clip=-1"), "optim.grad_clip must be >= 0");
  EXPECT_MESSAGE_HAS(invalid("recipe=fp9"), "recipe: unknown recipe 'fp9'");
  EXPECT_MESSAGE_HAS(invalid("recipe_overrides=gemm.nowhere=bf16"), "recipe_overrides[0]");
  EXPECT_MESSAGE_HAS(invalid("data.val_fraction=1.0"), "data.val_fraction must be in [0, 1)");
  EXPECT_MESSAGE_HAS(invalid("safety.spike_window=1"), "safety.spike_window must be 0");
  EXPECT_MESSAGE_HAS(invalid("model.n_group=3"), "model.n_routed_experts (8) must be a multiple");
  EXPECT_MESSAGE_HAS(invalid("model.hidden_size=0"), "model.hidden_size must be > 0");
  EXPECT_MESSAGE_HAS(invalid("model.mtp_loss_weight=-1"), "model.mtp_loss_weight must be >= 0");
  TrainConfig both;
  apply_set(both, "data.text=a.txt");
  apply_set(both, "data.shards=d/");
  EXPECT_MESSAGE_HAS(error_of([&] { both.validate(); }), "data.text and data.shards");
}

TEST(TrainConfig, ToTomlRoundTripsEveryKey) {
  TrainConfig c;
  for (const char* a : {"run_dir=runs/\"quoted\" \\ dir",
                        "steps=1234",
                        "checkpoint_every=7",
                        "keep_checkpoints=0",
                        "seed=987654321",
                        "recipe=fp8-tensor-delayed",
                        R"(recipe_overrides=["gemm.head=fp8-tensor", "amax_history_len=16"])",
                        "device=cpu",
                        "batch_size=3",
                        "seq_len=61",
                        "grad_accum=4",
                        "log_every=1",
                        "optim.lr=0.30000000000000004",
                        "optim.min_lr=1e-300",
                        "optim.warmup_steps=5",
                        "optim.warmup_init=0.125",
                        "optim.weight_decay=0",
                        "optim.beta1=0.8",
                        "optim.beta2=0.999",
                        "optim.eps=1e-15",
                        "optim.grad_clip=0",
                        "optim.schedule=constant",
                        "data.text=tiny shakespeare.txt",
                        "data.val_fraction=0.2",
                        "eval.every=0",
                        "eval.batches=9",
                        "safety.spike_window=10",
                        "safety.spike_threshold=3.5",
                        "safety.spike_action=rollback",
                        "safety.shadow_bf16=4",
                        "model.hidden_size=96",
                        "model.q_lora_rank=0",
                        "model.rope_theta=50000",
                        "model.tie_word_embeddings=true",
                        "model.routed_scaling_factor=1",
                        R"(model.extra={"bos_token_id": 0, "architectures": ["X"]})"})
    apply_set(c, a);
  ASSERT_NO_THROW(c.validate());
  const std::string text = to_toml(c);
  const TrainConfig back = parse_train_config(text, "resolved");
  EXPECT_TRUE(back == c) << text;
  EXPECT_EQ(to_toml(back), text);
  // Every key but model.config (resolved inline) is written.
  for (const std::string& key : train_config_keys()) {
    if (key == "model.config") continue;
    const std::string leaf = key.substr(key.rfind('.') + 1);
    EXPECT_NE(("\n" + text).find("\n" + leaf + " = "), std::string::npos) << key;
  }
  TrainConfig d;
  apply_set(d, "optim.eps=1e-9");
  EXPECT_FALSE(d == TrainConfig{});
}

TEST(TrainConfig, ModelFromConfigJsonWithInlineOverrides) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("octet_train_cfg_" + std::to_string(::getpid()) + ".json");
  ModelConfig tiny = test::tiny_model_config();
  tiny.extra["bos_token_id"] = 0;
  write_model_config(path.string(), tiny);
  const TrainConfig c = parse_train_config(
      "recipe = \"bf16\"\n[model]\nhidden_size = 96\nconfig = \"" + path.string() + "\"\n",
      "t.toml");
  std::filesystem::remove(path);
  EXPECT_EQ(c.model.hidden_size, 96);  // inline over the file, whatever the order
  EXPECT_EQ(c.model.vocab_size, tiny.vocab_size);
  EXPECT_EQ(c.model.num_hidden_layers, 3);
  EXPECT_EQ(c.model.recipe.preset, "bf16");
  EXPECT_EQ(c.model.extra.at("bos_token_id"), 0);
  EXPECT_TRUE(parse_train_config(to_toml(c), "resolved") == c);
}

TEST(TrainConfig, BuildsTheScheduleAndOptimizerConfig) {
  TrainConfig c;
  apply_set(c, "optim.lr=0.01");
  apply_set(c, "steps=100");
  const LrSchedule s = c.lr_schedule();
  EXPECT_EQ(s.total_steps, 100);
  EXPECT_EQ(s.warmup_steps, c.optim.warmup_steps);
  EXPECT_DOUBLE_EQ(lr_at(s, s.warmup_steps - 1), 0.01);
  EXPECT_DOUBLE_EQ(lr_at(s, 99), c.optim.min_lr);
  const AdamWConfig a = c.adamw();
  EXPECT_EQ(a.lr, 0.01f);
  EXPECT_EQ(a.beta2, 0.95f);
  EXPECT_EQ(a.grad_clip, 1.0f);
  EXPECT_EQ(c.resolved_recipe().name(), "deepseek");

  // A short trial run below the warm-up is valid and warms up over all of its steps.
  apply_set(c, "steps=5");
  apply_set(c, "optim.warmup_steps=20");
  c.validate();
  EXPECT_EQ(c.lr_schedule().warmup_steps, 5);
  EXPECT_DOUBLE_EQ(lr_at(c.lr_schedule(), 4), 0.01);
  EXPECT_LT(lr_at(c.lr_schedule(), 0), 0.01);
}

}  // namespace
}  // namespace octet::train
