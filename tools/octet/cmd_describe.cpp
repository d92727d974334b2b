#include <cstdio>
#include <string>

#include "cli.h"
#include "core/check.h"
#include "model/describe.h"

namespace octet::cli {

static int run_describe(const std::vector<std::string>& argv) {
  Args args(argv, {"recipe", "set", "tokens", "seq-len"}, {});
  args.expect_positional(1, 1, "octet describe CONFIG_JSON [--recipe R] [--set k=v,...]");
  const ModelConfig c = read_model_config(args.positional()[0]);
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
  const int64_t seq_len = args.get_int("seq-len", 4096), tokens = args.get_int("tokens", 8 * 4096);
  OCTET_CHECK(seq_len > 0 && tokens > 0, "--tokens and --seq-len must be > 0");
  std::printf("%s", describe_model(c, r, tokens, seq_len).c_str());
  return 0;
}

Command describe_command() {
  return {
      "describe", "parameters, per-site precision, FP8 FLOP share and memory of a model config",
      "usage: octet describe CONFIG_JSON [--recipe R] [--set key=value,...] [--tokens N] "
      "[--seq-len T]\n\n"
      "Reads a model config.json (the transformers library's DeepseekV3Config fields) and prints the\n"
      "parameter count (total and active per token), the precision of every GEMM site and stored tensor\n"
      "under the recipe, the share of GEMM FLOPs that run in FP8, and an estimate of weight and\n"
      "activation memory for every preset recipe.\n\n"
      "  --recipe R        bf16|fp8-tensor-delayed|fp8-tensor-current|deepseek|fp8-flow, without the\n"
      "                    config's overrides (default: the config's octet_recipe and\n"
      "                    octet_recipe_overrides, else deepseek)\n"
      "  --set k=v,...     more recipe overrides, e.g. gemm.attn.out=bf16,attn_out_input=bf16\n"
      "  --tokens N        tokens per step for the activation estimate (default 32768)\n"
      "  --seq-len T       sequence length for the attention FLOPs (default 4096)",
      run_describe};
}

}  // namespace octet::cli
