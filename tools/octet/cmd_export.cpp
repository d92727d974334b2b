// `octet export`: a checkpoint (or a run's latest) in the forms other tools load: `bf16`, what the
// transformers library loads (BF16, e_score_correction_bias F32), or `fp8`, DeepSeek-V3's released
// form (F8_E4M3 Linear weights with 128x128 weight_scale_inv, the rest BF16, a
// quantization_config in config.json) that its inference code, vLLM and SGLang load. The writing
// is write_checkpoint's (checkpoint.h has both forms and the sharding).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "cli.h"
#include "core/check.h"
#include "model/checkpoint.h"
#include "train/trainer.h"

namespace octet::cli {
namespace {

namespace fs = std::filesystem;

// The tokenizer.json that belongs with checkpoint `in`: beside it, else beside the token shards
// of the run it belongs to (RUN/checkpoints/step_N with RUN/config.toml naming data.shards, as
// octet prepare leaves them). "" when there is none; a run config that no longer parses just
// means no tokenizer.
fs::path find_tokenizer(const fs::path& in) {
  std::error_code ec;
  if (fs::is_regular_file(in / "tokenizer.json", ec)) return in / "tokenizer.json";
  const fs::path run = fs::absolute(in).lexically_normal().parent_path().parent_path();
  std::ifstream f(run / "config.toml");
  if (!f) return {};
  try {
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const train::TrainConfig c = train::parse_train_config(text, (run / "config.toml").string());
    if (c.data.shards.empty()) return {};
    fs::path data = c.data.shards;
    if (!fs::is_directory(data, ec)) data = data.parent_path();
    if (fs::is_regular_file(data / "tokenizer.json", ec)) return data / "tokenizer.json";
  } catch (const std::exception&) {
  }
  return {};
}

int run_export(const std::vector<std::string>& argv) {
  const Args args(argv, {"format", "shard-bytes"}, {"drop-mtp", "force"});
  args.expect_positional(2, 2, "octet export CHECKPOINT_OR_RUN OUT --format bf16|fp8 (see --help)");
  OCTET_CHECK(args.has("format"), "octet export needs --format bf16 or --format fp8");
  const std::string format = args.choice("format", {"bf16", "fp8"}, "bf16");
  CheckpointWriteOptions wo;
  wo.format = format == "bf16" ? CheckpointFormat::kBf16 : CheckpointFormat::kFp8;
  wo.shard_bytes = args.get_int("shard-bytes", wo.shard_bytes);
  OCTET_CHECK(wo.shard_bytes > 0, "--shard-bytes must be a positive integer");
  std::error_code ec;
  const std::string& given = args.positional()[0];
  // A checkpoint of any form (config.json beside it), else a run directory's latest.
  const std::string in = fs::is_regular_file(fs::path(given) / "config.json", ec)
                             ? given
                             : train::resolve_resume_dir(given);
  const fs::path out = fs::absolute(args.positional()[1]).lexically_normal();
  OCTET_CHECK(!fs::equivalent(in, out, ec), "octet export: OUT is the checkpoint being exported");
  OCTET_CHECK(args.has("force") || !fs::exists(out / "config.json", ec), out.string(),
              ": already holds a checkpoint; pass --force to replace it");

  CheckpointReadOptions ro;
  ro.cast = ReadCast::kToF32;  // FP8 weights dequantized: the export re-rounds from F32
  const LoadedCheckpoint ck = read_checkpoint(in, ro);
  ModelConfig config = ck.config;
  const bool drop_mtp = args.has("drop-mtp");
  OCTET_CHECK(ck.missing_mtp.empty() || drop_mtp, in,
              ": has no Multi-Token Prediction layers although its config declares ",
              config.num_nextn_predict_layers, "; export it with --drop-mtp");
  if (drop_mtp) config.num_nextn_predict_layers = 0;
  std::set<std::string> wanted;
  for (const TensorSpec& s : expected_tensors(config)) wanted.insert(s.name);
  io::NamedTensors tensors;
  for (const auto& [name, t] : ck.tensors)
    if (wanted.count(name)) tensors.emplace_back(name, t);

  int files = 0;
  int64_t bytes = 0;
  wo.progress = [&](const std::string& file, int64_t, int64_t) {
    ++files;
    bytes += static_cast<int64_t>(fs::file_size(file));
  };
  write_checkpoint(out.string(), config, tensors, wo);
  // The tokenizer travels with the model.
  const fs::path tokenizer = find_tokenizer(in);
  if (!tokenizer.empty()) {
    fs::copy_file(tokenizer, out / "tokenizer.json", fs::copy_options::overwrite_existing, ec);
    OCTET_CHECK(!ec, out.string(), "/tokenizer.json: cannot copy ", tokenizer.string(), ": ",
                ec.message());
    std::printf("copied %s\n", tokenizer.c_str());
  }
  std::printf("exported %s as %s: %zu tensors%s, %d files, %lld bytes: %s\n", in.c_str(),
              format == "bf16" ? "bf16 (transformers)" : "fp8 (DeepSeek-V3 release form)",
              tensors.size(), drop_mtp ? " (MTP dropped)" : "", files,
              static_cast<long long>(bytes), out.c_str());
  return 0;
}

}  // namespace

Command export_command() {
  return {
      "export", "write a checkpoint in the bf16 (transformers) or fp8 (DeepSeek-V3) form",
      "usage: octet export CHECKPOINT_OR_RUN OUT --format bf16|fp8 [--drop-mtp]\n"
      "                    [--shard-bytes N] [--force]\n"
      "  CHECKPOINT_OR_RUN  a checkpoint directory or a run directory (its latest checkpoint)\n"
      "  --format bf16      BF16 tensors (e_score_correction_bias F32): what transformers'\n"
      "                     DeepseekV3ForCausalLM.from_pretrained loads\n"
      "  --format fp8       DeepSeek-V3's released form: Linear weights F8_E4M3 with one F32\n"
      "                     weight_scale_inv per 128x128 block, the rest as bf16, and\n"
      "                     quantization_config {quant_method fp8, fmt e4m3, weight_block_size\n"
      "                     [128, 128], activation_scheme dynamic} in config.json\n"
      "  --drop-mtp         leave the Multi-Token Prediction layers out\n"
      "                     (num_nextn_predict_layers = 0)\n"
      "  --shard-bytes N    largest shard in data bytes; above it model-0000i-of-0000n.\n"
      "                     safetensors with model.safetensors.index.json (default 5000000000)\n"
      "  --force            replace a checkpoint already in OUT\n"
      "Optimizer state and training files are not exported. The tokenizer.json beside the\n"
      "checkpoint, or beside the run's data.shards (octet prepare's), is copied.\n",
      run_export};
}

}  // namespace octet::cli
