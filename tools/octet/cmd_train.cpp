// `octet train`: trains a DeepSeek-V3-style model (src/train/trainer.h). With no arguments, the
// built-in default: a small MLA + MoE + MTP model on the fortunes corpus that scripts/setup.sh
// installs, in the deepseek recipe, on the GPU when one is visible and on the CPU otherwise.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "cli.h"
#include "launch.h"
#include "train/trainer.h"

namespace octet::cli {
namespace {

// SIGINT / SIGTERM: the first asks the run to finish its step, write a checkpoint and stop; a
// second one ends the process at once (the default action, re-raised).
std::atomic<int> g_stop{0};

extern "C" void on_stop_signal(int sig) {
  if (g_stop.exchange(sig) != 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  const char msg[] =
      "\noctet train: stopping after this step, with a checkpoint (signal again to stop at once)\n";
  const ssize_t w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)w;
}

void install_stop_handlers() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

train::TrainConfig read_config_file(const std::string& path) {
  std::ifstream f(path);
  OCTET_CHECK(f.good(), path, ": cannot open the training config");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return train::parse_train_config(text, path);
}

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
  const Args args(rest, {"resume", "shadow-bf16", "cache-dir", "nproc", "trace", "trace-steps"},
                  {"print-config", "overwrite", "allow-config-change"});
  args.expect_positional(0, 1, "octet train [CONFIG.toml] [--set key=value ...] [flags]");
  const bool resume = args.has("resume");
  OCTET_CHECK(!(resume && args.has("overwrite")),
              "--resume continues a run and --overwrite deletes it: give one of them");
  OCTET_CHECK(!(resume && !args.positional().empty()),
              "--resume continues the run with its own "
              "config.toml; change keys with --set instead of giving ",
              args.positional()[0]);
  train::TrainConfig cfg;
  std::string resume_from;
  if (resume) {
    resume_from = *args.get("resume");
    cfg = train::resolve_resume(resume_from).config;
  } else if (!args.positional().empty()) {
    cfg = read_config_file(args.positional()[0]);
  } else {
    cfg = train::parse_train_config(train::default_train_config_toml(), "built-in default");
  }
  bool run_dir_given = !args.positional().empty() || resume;
  for (const std::string& s : sets) {
    train::apply_set(cfg, s);
    run_dir_given = run_dir_given || s.rfind("run_dir=", 0) == 0;
  }
  if (const auto n = args.get("shadow-bf16")) train::apply_set(cfg, "safety.shadow_bf16=" + *n);
  cfg.validate();
  if (args.has("print-config")) {
    std::cout << train::to_toml(cfg);
    return 0;
  }
  // The built-in default with no run_dir named never collides with an earlier run: the next free
  // runs/default-N (a run_dir named on purpose gets the ownership rules instead).
  if (!run_dir_given && !args.has("overwrite")) {
    const std::string free_dir = train::first_free_run_dir(cfg.run_dir);
    if (free_dir != cfg.run_dir) {
      std::cout << "note: " << cfg.run_dir << " holds an earlier run; this one goes to " << free_dir
                << "\n";
      cfg.run_dir = free_dir;
    }
  }
  if (args.has("nproc")) {
    // The ranks run this command line without --nproc, on the run directory resolved here.
    std::vector<std::string> child;
    for (size_t i = 0; i < argv.size(); ++i) {
      if (argv[i] == "--nproc") {
        ++i;
      } else if (argv[i].rfind("--nproc=", 0) != 0) {
        child.push_back(argv[i]);
      }
    }
    child.insert(child.end(), {"--set", "run_dir=" + cfg.run_dir});
    return spawn_local_ranks(static_cast<int>(args.get_int("nproc", 1)), child);
  }
  const LaunchEnv launch = launch_env();
  OCTET_CHECK(launch.world_size == 1 || run_dir_given, "rank ", launch.rank, " of ",
              launch.world_size,
              ": name the run directory (a config file, or --set run_dir=DIR) "
              "so that every rank trains the same run");
  train::RunOptions opt;
  opt.comm = join_launch(launch);
  opt.device_index = launch.local_rank;
  std::ostringstream quiet;  // ranks other than 0 print nothing but errors
  std::ostream& out = launch.rank == 0 ? std::cout : quiet;
  opt.resume_from = resume_from;
  opt.allow_config_change = args.has("allow-config-change");
  opt.start =
      args.has("overwrite") ? train::RunStart::kOverwrite : train::RunStart::kRefuseExisting;
  opt.cache_dir = args.get_or("cache-dir", ".cache/octet");
  OCTET_CHECK(args.has("trace") || !args.has("trace-steps"),
              "--trace-steps chooses the steps of --trace FILE: give --trace too");
  if (args.has("trace")) {
    opt.trace_path = *args.get("trace");
    OCTET_CHECK(!opt.trace_path.empty(), "--trace needs a file name");
    const std::string w = args.get_or("trace-steps", "11:15");
    const size_t colon = w.find(':');
    char* end = nullptr;
    OCTET_CHECK(colon != std::string::npos, "--trace-steps ", w, ": give FIRST:LAST, e.g. 11:15");
    opt.trace_first = std::strtoll(w.c_str(), &end, 10);
    OCTET_CHECK(end == w.c_str() + colon && colon > 0, "--trace-steps ", w,
                ": FIRST is not a number");
    opt.trace_last = std::strtoll(w.c_str() + colon + 1, &end, 10);
    OCTET_CHECK(*end == '\0' && colon + 1 < w.size(), "--trace-steps ", w,
                ": LAST is not a number");
  }
  opt.style =
      ::isatty(::fileno(stdout)) ? train::ProgressStyle::kBar : train::ProgressStyle::kLines;
  opt.stop = &g_stop;
  install_stop_handlers();
  const train::RunResult r = train::run_training(cfg, opt, out);
  if (launch.rank != 0) return r.end == train::RunEnd::kCompleted ? 0 : 1;
  std::cout << "trained " << r.steps_done << " steps; final loss " << r.final_loss
            << ", final val loss ";
  if (std::isnan(r.final_val_loss))
    std::cout << "n/a (no evaluation)";
  else
    std::cout << r.final_val_loss;
  std::cout << ", skipped " << r.skipped_steps << "; run directory " << cfg.run_dir << "\n";
  std::cout.flush();
  const std::string where = r.last_checkpoint.empty() ? "no checkpoint written by this process"
                                                      : "last checkpoint " + r.last_checkpoint;
  switch (r.end) {
    case train::RunEnd::kCompleted:
      return 0;
    case train::RunEnd::kInterrupted:
      std::fprintf(stderr,
                   "octet train: interrupted: %s; %s; continue with: octet train --resume %s\n",
                   r.end_reason.c_str(), where.c_str(), cfg.run_dir.c_str());
      return 128 + r.stop_signal;
    case train::RunEnd::kDiverged:
      std::fprintf(stderr, "octet train: error: the run diverged: %s; %s\n", r.end_reason.c_str(),
                   where.c_str());
      return 1;
    case train::RunEnd::kAllSkipped:
      std::fprintf(stderr, "octet train: error: %s; %s\n", r.end_reason.c_str(), where.c_str());
      return 1;
  }
  return 1;
}

}  // namespace

Command train_command() {
  return {
      "train", "train a DeepSeek-V3-style model (default: a small one on the fortunes corpus)",
      "usage: octet train [CONFIG.toml] [--set key=value ...] [flags]\n"
      "  CONFIG.toml        training config (default: the built-in one; see --print-config)\n"
      "  --set key=value    override one key, e.g. --set steps=100 --set optim.lr=1e-3\n"
      "                     --set recipe=bf16 --set device=cpu --set run_dir=runs/x\n"
      "  --resume DIR       continue a run (its directory, or one of its checkpoints) in its\n"
      "                     own directory with its saved config.toml, bit-identically; --set\n"
      "                     may change steps, checkpointing, logging, evaluation, safety.* and\n"
      "                     device\n"
      "  --allow-config-change  with --resume: also allow --set to change what a step\n"
      "                     computes (model, recipe, data, batch, optimizer); recorded in\n"
      "                     metrics.jsonl\n"
      "  --overwrite        delete the run already in run_dir and start a new one there\n"
      "  --shadow-bf16 N    every Nth step, also run its first batch in bf16 and log the gap\n"
      "  --cache-dir DIR    where prepared text shards are kept (default .cache/octet)\n"
      "  --trace FILE       CUDA: record every kernel's device start and end during steps\n"
      "                     --trace-steps FIRST:LAST (default 11:15) into FILE (CSV; CUPTI,\n"
      "                     libcupti on LD_LIBRARY_PATH) and print the device's idle time a\n"
      "                     step and its longest gaps; those steps wait for the device\n"
      "  --print-config     print the resolved configuration and exit\n"
      "  --nproc N          data parallelism over N GPUs of this machine: starts N ranks\n"
      "                     (one per GPU, NCCL); batch_size is per rank, so the global batch\n"
      "                     is N x batch_size x grad_accum. Ranks started by torchrun, srun or\n"
      "                     mpirun (RANK/WORLD_SIZE, SLURM_PROCID, OMPI_COMM_WORLD_RANK with\n"
      "                     MASTER_ADDR and MASTER_PORT) join each other the same way\n"
      "Writes <run_dir>/run.json, config.toml, metrics.jsonl and checkpoints/. A run_dir that\n"
      "holds another run is refused (without a run_dir given, the built-in default goes to the\n"
      "next free runs/default-N), and one process at a time trains in a run_dir.\n"
      "SIGINT or SIGTERM finish the current step, write a checkpoint and exit with 128 +\n"
      "the signal; a second signal exits at once. A run that diverges (safety.\n"
      "max_skipped_in_a_row skipped updates in a row, or a non-finite last loss) or whose\n"
      "steps were all skipped exits with 1.\n",
      run_train};
}

}  // namespace octet::cli
