// `octet train`: trains a DeepSeek-V3-style model (src/train/trainer.h). With no arguments, the
// built-in default: a small MLA + MoE + MTP model on the fortunes corpus that scripts/setup.sh
// installs, in the deepseek recipe, on the GPU when one is visible and on the CPU otherwise.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "cli.h"
#include "train/trainer.h"

namespace octet::cli {
namespace {

int run_train(const std::vector<std::string>& argv) {
  // --set may repeat; every other flag goes through Args.
  std::vector<std::string> sets, rest;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--set") {
      OCTET_CHECK(i + 1 < argv.size(), "--set needs a key=value argument");
      sets.push_back(argv[++i]);
    } else if (argv[i].rfind("--set=", 0) == 0) {
      sets.push_back(argv[i].substr(6));
    } else {
      rest.push_back(argv[i]);
    }
  }
  const Args args(rest, {"resume", "shadow-bf16", "cache-dir"}, {"print-config"});
  args.expect_positional(0, 1, "octet train [CONFIG.toml] [--set key=value ...] [flags]");
  train::TrainConfig cfg;
  if (!args.positional().empty()) {
    const std::string path = args.positional()[0];
    std::ifstream f(path);
    OCTET_CHECK(f.good(), path, ": cannot open the training config");
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    cfg = train::parse_train_config(text, path);
  } else {
    cfg = train::parse_train_config(train::default_train_config_toml(), "built-in default");
  }
  for (const std::string& s : sets) train::apply_set(cfg, s);
  if (const auto n = args.get("shadow-bf16")) train::apply_set(cfg, "safety.shadow_bf16=" + *n);
  cfg.validate();
  if (args.has("print-config")) {
    std::cout << train::to_toml(cfg);
    return 0;
  }
  train::RunOptions opt;
  opt.resume_from = args.get_or("resume", "");
  opt.cache_dir = args.get_or("cache-dir", ".cache/octet");
  opt.style =
      ::isatty(::fileno(stdout)) ? train::ProgressStyle::kBar : train::ProgressStyle::kLines;
  const train::RunResult r = train::run_training(cfg, opt, std::cout);
  std::cout << "trained " << r.steps_done << " steps; final loss " << r.final_loss
            << ", final val loss " << r.final_val_loss << ", skipped " << r.skipped_steps
            << "; run directory " << cfg.run_dir << "\n";
  return 0;
}

}  // namespace

Command train_command() {
  return {"train", "train a DeepSeek-V3-style model (default: a small one on the fortunes corpus)",
          "usage: octet train [CONFIG.toml] [--set key=value ...] [flags]\n"
          "  CONFIG.toml        training config (default: the built-in one; see --print-config)\n"
          "  --set key=value    override one key, e.g. --set steps=100 --set optim.lr=1e-3\n"
          "                     --set recipe=bf16 --set device=cpu --set run_dir=runs/x\n"
          "  --resume DIR       continue a run (its directory, or one of its checkpoints)\n"
          "                     bit-identically\n"
          "  --shadow-bf16 N    every Nth step, also run its first batch in bf16 and log the gap\n"
          "  --cache-dir DIR    where prepared text shards are kept (default .cache/octet)\n"
          "  --print-config     print the resolved configuration and exit\n"
          "Writes <run_dir>/config.toml, metrics.jsonl and checkpoints/.\n",
          run_train};
}

}  // namespace octet::cli
