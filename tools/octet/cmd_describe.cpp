#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "cli.h"
#include "core/check.h"
#include "model/describe.h"
#include "train/train_config.h"

namespace octet::cli {

static int run_describe(const std::vector<std::string>& argv) {
  Args args(argv, {"recipe", "set", "tokens", "seq-len"}, {});
  args.expect_positional(1, 1, "octet describe CONFIG [--recipe R] [--set k=v,...]");
  const std::string path = args.positional()[0];
  ModelConfig c;
  int64_t run_tokens = 8 * 4096, run_seq_len = 4096;
  if (path.ends_with(".toml")) {
    // A training config (octet train's TOML): its model, recipe with overrides and batch.
    std::ifstream f(path);
    OCTET_CHECK(f.good(), path, ": cannot open the training config");
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const train::TrainConfig t = train::parse_train_config(text, path);
    c = t.model;
    run_seq_len = t.seq_len;
    run_tokens = t.batch_size * t.seq_len * t.grad_accum;
  } else {
    c = read_model_config(path);
  }
  // The config's recipe with its overrides; --recipe replaces both, --set adds overrides.
  RecipeSpec spec = c.recipe;
  if (auto preset = args.get("recipe")) spec = RecipeSpec{*preset, {}};
  if (auto set = args.get("set")) {
    size_t start = 0;
    while (start <= set->size()) {
      const size_t comma = set->find(',', start);
      const std::string one =
          set->substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (!one.empty()) spec.overrides.push_back(one);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  const Recipe r = resolve_recipe(spec);
  const int64_t seq_len = args.get_int("seq-len", run_seq_len);
  const int64_t tokens = args.get_int("tokens", run_tokens);
  OCTET_CHECK(seq_len > 0 && tokens > 0, "--tokens and --seq-len must be > 0");
  std::printf("%s", describe_model(c, r, tokens, seq_len).c_str());
  return 0;
}

Command describe_command() {
  return {
      "describe", "parameters, per-site precision, FP8 FLOP share and memory of a model config",
      "usage: octet describe CONFIG [--recipe R] [--set key=value,...] [--tokens N] "
      "[--seq-len T]\n\n"
      "Reads a model config.json (the transformers library's DeepseekV3Config fields) or a\n"
      "training config (*.toml, as octet train takes: its model, recipe and batch) and prints the\n"
      "parameter count (total and active per token), the precision of every GEMM site and stored tensor\n"
      "under the recipe, the share of GEMM FLOPs that run in FP8, and an estimate of weight and\n"
      "activation memory for every preset recipe.\n\n"
      "  --recipe R        bf16|fp8-tensor-delayed|fp8-tensor-current|deepseek|fp8-flow, without the\n"
      "                    config's overrides (default: the config's octet_recipe and\n"
      "                    octet_recipe_overrides, else deepseek)\n"
      "  --set k=v,...     more recipe overrides, e.g. gemm.attn.out=bf16,attn_out_input=bf16\n"
      "  --tokens N        tokens per step for the activation estimate (default 32768, or the\n"
      "                    TOML's batch_size * seq_len * grad_accum)\n"
      "  --seq-len T       sequence length for the attention FLOPs (default 4096, or the TOML's)",
      run_describe};
}

}  // namespace octet::cli
