// `octet init`: a freshly initialised checkpoint (config.json plus weights) from a model config,
// the starting point of a training run.
//
// The default storage is F32 (CheckpointFormat::kAsIs on F32 tensors): training keeps FP32 master
// weights, and a BF16 or FP8 start would round every weight before the first step. The
// transformers library saves in the config's torch_dtype instead; --format bf16 and fp8 give the
// ecosystem's forms (checkpoint.h) for inference or export.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <system_error>

#include "backend/backend.h"
#include "cli.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/describe.h"
#include "model/init.h"

namespace octet::cli {
namespace {

namespace fs = std::filesystem;

// The files whose presence makes a directory a checkpoint (model/checkpoint.h's layout).
const char* const kCheckpointFiles[] = {"config.json", "model.safetensors",
                                        "model.safetensors.index.json"};

// model-NNNNN-of-NNNNN.safetensors, the name write_checkpoint gives a shard.
bool is_shard_name(const std::string& name) {
  static const std::regex kShard("model-[0-9]{5,}-of-[0-9]{5,}\\.safetensors");
  return std::regex_match(name, kShard);
}

uint64_t parse_seed(const Args& args) {
  const auto v = args.get("seed");
  if (!v) return 0;
  // strtoull accepts a sign and wraps "-1" to 2^64 - 1: only plain digits are a seed.
  const bool digits =
      !v->empty() && v->size() <= 20 &&
      std::all_of(v->begin(), v->end(), [](unsigned char ch) { return std::isdigit(ch) != 0; });
  errno = 0;
  const unsigned long long s = digits ? std::strtoull(v->c_str(), nullptr, 10) : 0;
  OCTET_CHECK(digits && errno == 0, "bad value '", *v,
              "' for --seed: expected an integer in [0, 2^64)");
  return s;
}

// `dir` without a trailing separator, so that parent_path() is the directory that holds it.
fs::path normalized(const std::string& dir) {
  fs::path p = fs::absolute(fs::path(dir)).lexically_normal();
  if (p.filename().empty() && p.has_parent_path()) p = p.parent_path();
  return p;
}

// Fails before the initialisation, which takes minutes for a large model, rather than after it.
// write_checkpoint stages the new directory next to OUT_DIR and renames it into place, so the
// nearest existing ancestor must be a writable directory.
void check_out_dir(const fs::path& out, ExistingOutput policy) {
  const bool force = policy == ExistingOutput::kReplace;
  std::error_code ec;
  if (fs::exists(out, ec)) {
    OCTET_CHECK(fs::is_directory(out, ec), out.string(), ": exists and is not a directory");
    for (const char* f : kCheckpointFiles)
      OCTET_CHECK(force || !fs::exists(fs::symlink_status(out / f, ec)), out.string(),
                  ": already holds a checkpoint (", f, "); pass --force to replace it");
    // A file with a shard's name would be replaced by the new checkpoint's shard of that name.
    if (!force)
      for (const auto& e : fs::directory_iterator(out, ec))
        OCTET_CHECK(!is_shard_name(e.path().filename().string()), out.string(), ": already holds ",
                    e.path().filename().string(),
                    " (a checkpoint shard's name); pass --force to replace it");
  }
  fs::path p = out.parent_path();
  while (p.has_parent_path() && p != p.parent_path() && !fs::exists(p, ec)) p = p.parent_path();
  OCTET_CHECK(fs::is_directory(p, ec), "cannot create ", out.string(), ": ", p.string(),
              " is not a directory");
  OCTET_CHECK(::access(p.c_str(), W_OK | X_OK) == 0, "cannot create ", out.string(), ": ",
              p.string(), " is not writable");
}

// The parameters are made in F32 on the host (and converted once more for bf16 / fp8): refused
// before any allocation when they cannot fit.
void check_host_memory(const ModelConfig& config) {
  const double need = 4.0 * static_cast<double>(count_parameters(config).total) * 1.5;
  const int64_t have = make_cpu_backend()->available_bytes();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  OCTET_CHECK(have < 0 || need <= static_cast<double>(have), "initialising this model needs about ",
              need / gib, " GiB of host memory (F32 parameters and a converted copy) but ",
              static_cast<double>(have) / gib, " GiB is available");
}

int run_init(const std::vector<std::string>& argv) {
  const Args args(argv, {"seed", "format", "shard-bytes"}, {"force"});
  args.expect_positional(2, 2, "octet init CONFIG_JSON OUT_DIR [flags] (see --help)");
  const uint64_t seed = parse_seed(args);
  const std::string format = args.choice("format", {"f32", "bf16", "fp8"}, "f32");
  CheckpointWriteOptions options;
  options.format = format == "f32"    ? CheckpointFormat::kAsIs
                   : format == "bf16" ? CheckpointFormat::kBf16
                                      : CheckpointFormat::kFp8;
  options.shard_bytes = args.get_int("shard-bytes", options.shard_bytes);
  OCTET_CHECK(options.shard_bytes > 0, "bad value '", *args.get("shard-bytes"),
              "' for --shard-bytes: expected a positive integer");

  const ModelConfig config = read_model_config(args.positional()[0]);
  const fs::path out = normalized(args.positional()[1]);
  check_out_dir(out, existing_output(args));
  check_host_memory(config);

  // F32 values in every format: kBf16 and kFp8 round them once, as init_parameters(.., kBF16)
  // would.
  const io::NamedTensors params = init_parameters(config, seed);
  int64_t numel = 0;
  for (const auto& [name, t] : params) numel += t.numel();
  int files = 0;
  int64_t bytes = 0;
  options.progress = [&](const std::string& file, int64_t, int64_t) {
    ++files;
    bytes += static_cast<int64_t>(fs::file_size(file));
  };
  write_checkpoint(out.string(), config, params, options);
  std::printf(
      "initialised %lld parameters in %zu tensors (seed %llu, %s): %d files, %lld bytes: %s\n",
      static_cast<long long>(numel), params.size(), static_cast<unsigned long long>(seed),
      format.c_str(), files, static_cast<long long>(bytes), out.c_str());
  return 0;
}

}  // namespace

Command init_command() {
  return {
      "init", "write a freshly initialised checkpoint for a model config",
      "usage: octet init CONFIG_JSON OUT_DIR [--seed S] [--format f32|bf16|fp8] [--shard-bytes N]\n"
      "                                      [--force]\n\n"
      "Reads the model config CONFIG_JSON (transformers' DeepseekV3Config or DeepSeek-V3's\n"
      "config.json layout) and writes OUT_DIR: config.json plus the weights under DeepSeek-V3's\n"
      "tensor names, MTP layers included, as model.safetensors or shards with\n"
      "model.safetensors.index.json. Values as transformers' DeepseekV3 _init_weights makes them:\n"
      "Linear weights, router gates, embeddings and heads ~ N(0, initializer_range^2), norm\n"
      "weights 1, e_score_correction_bias 0; the MTP layers' embed_tokens and shared_head.head\n"
      "copy the main model's. Each tensor draws from its own Philox stream keyed by the seed and\n"
      "its name, so a tensor's values depend on the seed, its name and its shape only.\n"
      "OUT_DIR is replaced atomically. An existing checkpoint in it (config.json, the weight\n"
      "files) is replaced only with --force; files in it that are not part of the checkpoint\n"
      "are never touched.\n\n"
      "flags:\n"
      "  --seed S            random seed, an integer in [0, 2^64) (default 0)\n"
      "  --format F          f32: every tensor in F32 (default; training keeps FP32 masters)\n"
      "                      bf16: BF16, e_score_correction_bias F32 (the ecosystem's BF16 form)\n"
      "                      fp8: Linear weights F8_E4M3 with 128x128 weight_scale_inv, the rest\n"
      "                      as bf16 (DeepSeek-V3's released form)\n"
      "  --shard-bytes N     largest shard in data bytes (default 5000000000, transformers' 5GB)\n"
      "  --force             replace a checkpoint already in OUT_DIR (default: refuse)",
      run_init};
}

}  // namespace octet::cli
