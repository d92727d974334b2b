// The trainer's configuration: one TOML file, every key overridable with `--set key=value`, the
// fully resolved config printed and saved as <run_dir>/config.toml.
//
// Layers, each overriding the one before: the built-in default (TrainConfig's member defaults,
// default_train_config_toml()) <- the TOML file <- --set in command-line order. A key left out
// keeps the value of the layer below. Keys are flat with sections for readability; the dotted name
// (optim.lr) is what --set and error messages use. The [model] section takes either
// `config = "path/config.json"` (a transformers or DeepSeek-V3 config.json, read with
// read_model_config; a relative path is taken from the working directory), or inline keys with
// DeepseekV3Config's names, or both (the file first, then the inline keys over it). Inline keys
// start from the built-in default model. TOML has no null: model.q_lora_rank = 0 means a plain
// q_proj.
//
// Parsing and --set check types and names (an unknown key lists the close ones and the valid keys
// of its section); validate() checks values, after every --set, and each message names the key.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "numerics/recipe.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"

namespace octet::train {

enum class DeviceChoice : uint8_t { kAuto, kCpu, kCuda };  // kAuto: CUDA when a GPU is visible
enum class SpikeAction : uint8_t {
  kLog,       // report the spike, keep the step
  kSkip,      // discard the step's update (the optimizer state stays as before it)
  kRollback,  // reload the last checkpoint and continue past the offending batch
};

struct OptimConfig {
  double lr = 3e-3;  // peak learning rate
  double min_lr = 3e-4;
  int64_t warmup_steps = 20;
  double warmup_init = 0.0;  // first warmup rate as a fraction of lr
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // max global gradient norm; 0 disables clipping
  LrScheduleKind schedule = LrScheduleKind::kCosine;
  // The AdamW pass also writes the weights the next forward reads (BF16 copies, FP8 128x128
  // blocks); false: a separate preparation pass over the masters. The same bits either way.
  bool fused_prepare = true;
  // The same for the FP8 128x128 block weights (the fp8-block recipes' GEMM weights): one pass
  // writes the master, the moments and both FP8 copies with their scales (ops/adamw
  // adamw_step_block_quantize). Bit-identical to false, which quantizes the masters after AdamW.
  bool fused_prepare_fp8 = true;
  // Several ranks (ZeRO-1): the gradient reduce-scatter's bucket, in MiB of FP32 gradient; a bucket
  // is sent as soon as its gradients are final, overlapping the rest of the backward.
  double bucket_mb = 32;

  bool operator==(const OptimConfig&) const = default;
};

struct DataConfig {
  std::string text;    // UTF-8 text file, byte-tokenized; "" (and no shards): the default corpus
  std::string shards;  // directory or glob of llm.c .bin token shards; excludes text
  // Megatron-LM indexed dataset prefix (prefix.bin + prefix.idx); excludes text and shards. The
  // last val_fraction of its tokens (whole documents) is held out for validation.
  std::string megatron;
  double val_fraction = 0.05;  // held-out share of the data for evaluation

  bool operator==(const DataConfig&) const = default;
};

struct EvalConfig {
  int64_t every = 50;  // evaluate every N steps (and at the end); 0: never
  int64_t batches = 4;

  bool operator==(const EvalConfig&) const = default;
};

// Parallelism beyond data parallelism (docs/scaling.md). The data-parallel size is the world size
// divided by the product of these.
struct ParallelConfig {
  int64_t ep = 1;  // expert parallelism: ranks the routed experts are sharded over

  bool operator==(const ParallelConfig&) const = default;
};

struct SafetyConfig {
  // A step's loss is a spike when it exceeds mean + spike_threshold * std of the losses of the
  // spike_window steps before it (once that many exist); the window holds non-spike losses only,
  // so one spike does not hide the next. spike_window = 0 disables detection.
  int64_t spike_window = 50;
  double spike_threshold = 6.0;
  SpikeAction spike_action = SpikeAction::kLog;
  int64_t shadow_bf16 = 0;  // N > 0: every Nth batch is also run in the bf16 recipe, for comparison
  // After this many skipped updates in a row the run stops as diverged (a non-zero exit) instead
  // of spending its budget on steps that change nothing. 0: never.
  int64_t max_skipped_in_a_row = 20;

  bool operator==(const SafetyConfig&) const = default;
};

// The built-in model: a small DeepSeek-V3-style MoE (MLA, 1 dense + 1 MoE layer, 8 experts top-2,
// a shared expert, one MTP depth) with the byte-level vocabulary, sized for a CPU run of a few
// minutes. The one place these sizes live.
ModelConfig default_model_config();

struct TrainConfig {
  std::string run_dir = "runs/default";
  int64_t steps = 150;             // optimizer steps
  int64_t checkpoint_every = 100;  // 0: only at the end; -1: never (benchmarks)
  int64_t keep_checkpoints = 2;    // most recent K kept; 0 keeps all
  int64_t seed = 1234;
  DeviceChoice device = DeviceChoice::kAuto;
  int64_t batch_size = 8;  // sequences per micro-batch
  int64_t seq_len = 128;
  int64_t grad_accum = 1;  // micro-batches per optimizer step
  int64_t log_every = 10;
  // Steps between records of every site's quantization numerics in metrics.jsonl (and the first
  // step); each costs host copies of samples of every Linear input, so it is kept sparse. 0: never.
  int64_t sites_every = 50;
  // The step as CUDA graphs (train/step_graph.h): captured once, replayed after. On CUDA with one
  // process only; ignored on the CPU, with several ranks and with delayed-scaling recipes.
  bool cuda_graphs = true;
  OptimConfig optim;
  DataConfig data;
  EvalConfig eval;
  SafetyConfig safety;
  ParallelConfig parallel;
  // Its recipe (model.recipe) is what the keys `recipe` and `recipe_overrides` set.
  ModelConfig model = default_model_config();
  // A checkpoint to start a new run from (fresh optimizer, step 0): a transformers-format
  // directory (BF16 or F32, sharded or not), DeepSeek-V3's released FP8 form, an octet checkpoint
  // or run directory (its latest checkpoint). Setting it also sets the model to the checkpoint's
  // config.json (model keys after it override, as with model.config); "" : a fresh initialisation.
  std::string init_from;

  // Checks every value; the message names the key ("optim.min_lr must be ...").
  void validate() const;

  // The pieces the trainer builds from it.
  LrSchedule lr_schedule() const;
  AdamWConfig adamw() const;       // lr is the peak rate; the trainer passes lr_at() per step
  Recipe resolved_recipe() const;  // preset + overrides, validated
};

// The checkpoint directory init_from names: `path` itself when it holds a config.json, else the
// latest checkpoint of the run directory `path`. Throws naming the path when it is neither.
std::string init_checkpoint_dir(const std::string& path);

// Equal when every key of the key table is.
bool operator==(const TrainConfig& a, const TrainConfig& b);

// Parses TOML text over the defaults. `source` names the text in errors ("train.toml:12:5: ...").
// Types and key names are checked here; values by validate(), which the caller runs after --set.
TrainConfig parse_train_config(std::string_view toml, const std::string& source = "config");

// One `key=value` override on a parsed config, e.g. "optim.lr=1e-3", "recipe=bf16",
// "recipe_overrides=[\"gemm.*=bf16\"]", "model.hidden_size=256". The value is read as TOML; a
// string key also takes bare text ("run_dir=runs/x"), and an array key a single bare string.
void apply_set(TrainConfig& config, std::string_view assignment);

// Every key, fully resolved (the model inline, with all of its keys), with a comment per key;
// parse_train_config(to_toml(c)) == c.
std::string to_toml(const TrainConfig& config);

// The built-in default as TOML: to_toml(TrainConfig{}) under a header.
std::string default_train_config_toml();

// Every dotted key parse_train_config and apply_set accept, in to_toml's order.
std::vector<std::string> train_config_keys();

// A key whose value differs between two configs, with both values as TOML text.
struct ConfigChange {
  std::string key, before, after;
};
// The keys (in to_toml's order) on which `after` differs from `before`.
std::vector<ConfigChange> config_changes(const TrainConfig& before, const TrainConfig& after);

// Whether a resumed run may change `key` without asking: how long it runs, how often it checks,
// logs and saves, the safety nets and the device; never what a step computes (model, recipe,
// data, batch, optimizer, seed) nor where the run lives.
bool resume_may_change(const std::string& key);

}  // namespace octet::train
