// `octet eval`: the mean cross-entropy of a checkpoint over a text file or a token shard, with the
// MTP depths' losses, in any recipe and on either device.
//
// The data is cut into consecutive windows of T + 1 tokens (inputs and next-token targets, the
// windows sharing one token as the training sampler's do), B windows per forward pass; a final
// partial batch is evaluated too. Every window has T targets, so the mean over batches weighted
// by their sequences is the mean over all predicted tokens.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "backend/backend.h"
#include "cli.h"
#include "io/token_shard.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "train/data.h"
#include "train/trainer.h"

namespace octet::cli {
namespace {

std::vector<int32_t> read_tokens(const Args& args, int64_t vocab_size) {
  std::vector<int32_t> out;
  if (const auto text = args.get("text")) {
    std::ifstream f(*text, std::ios::binary);
    OCTET_CHECK(f.good(), *text, ": cannot open the text file");
    const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    OCTET_CHECK(!s.empty(), *text, ": the text file is empty");
    OCTET_CHECK(vocab_size >= train::kByteVocabSize, "--text tokenizes byte by byte (",
                train::kByteVocabSize, " ids) but the model's vocab_size is ", vocab_size,
                "; pass --tokens with a shard in the model's vocabulary");
    out.push_back(
        train::kEndOfText);  // documents start with end-of-text, as the prepared shards do
    for (const uint16_t t : train::encode_bytes(s)) out.push_back(t);
    return out;
  }
  const auto path = args.get("tokens");
  OCTET_CHECK(path.has_value(), "octet eval needs --text FILE or --tokens FILE");
  const io::TokenShard shard = io::TokenShard::open(*path, vocab_size);
  out.resize(static_cast<size_t>(shard.size()));
  shard.read(0, shard.size(), out.data());
  return out;
}

Device pick_device(const std::string& d) {
  if (d == "cpu") return Device::kCpu;
  if (d == "cuda") return Device::kCuda;
  return cuda_device_count() > 0 ? Device::kCuda : Device::kCpu;
}

int run_eval(const std::vector<std::string>& argv) {
  const Args args(argv, {"text", "tokens", "recipe", "device", "seq-len", "batch", "max-batches"},
                  {});
  args.expect_positional(1, 1, "octet eval CHECKPOINT_DIR --text FILE|--tokens FILE [flags]");
  OCTET_CHECK(args.has("text") != args.has("tokens"),
              "octet eval: give exactly one of --text and --tokens");
  // A checkpoint of any form (config.json beside it), else a run directory's latest.
  std::error_code ec;
  const std::string& given = args.positional()[0];
  const std::string dir =
      std::filesystem::is_regular_file(std::filesystem::path(given) / "config.json", ec)
          ? given
          : train::resolve_resume_dir(given);
  CheckpointReadOptions ro;
  ro.cast = ReadCast::kToF32;
  const LoadedCheckpoint ck = read_checkpoint(dir, ro);
  const ModelConfig& c = ck.config;
  // The checkpoint's recipe with its overrides (config.json), or --recipe's preset alone.
  const RecipeSpec spec = args.has("recipe") ? RecipeSpec{*args.get("recipe"), {}} : c.recipe;
  const Recipe recipe = resolve_recipe(spec);
  const Device device = pick_device(args.choice("device", {"auto", "cpu", "cuda"}, "auto"));
  const int64_t T = args.get_int("seq-len", std::min<int64_t>(256, c.max_position_embeddings));
  const int64_t B = args.get_int("batch", 8);
  const int64_t max_batches = args.get_int("max-batches", 0);
  OCTET_CHECK(T >= 1 && T <= c.max_position_embeddings, "--seq-len must be in [1, ",
              c.max_position_embeddings, "] (max_position_embeddings), got ", T);
  OCTET_CHECK(B >= 1, "--batch must be >= 1, got ", B);
  OCTET_CHECK(max_batches >= 0, "--max-batches must be >= 0 (0: all the data), got ", max_batches);
  const std::vector<int32_t> tokens = read_tokens(args, c.vocab_size);
  const int64_t windows = (static_cast<int64_t>(tokens.size()) - 1) / T;
  OCTET_CHECK(windows >= 1, "octet eval: the data has ", tokens.size(),
              " tokens, fewer than one sequence of ", T + 1);

  Context ctx = make_context(device);
  Model model(ctx, c, {recipe, DType::kBF16});
  for (const std::string& w : load_checkpoint_into(ctx, model, ck))
    std::fprintf(stderr, "warning: %s\n", w.c_str());
  model.prepare(ctx);
  std::printf("checkpoint: %s\nrecipe: %s\ndevice: %s\n", dir.c_str(), spec.label().c_str(),
              device_name(device));

  double sum = 0;
  std::vector<double> mtp_sum(static_cast<size_t>(c.num_nextn_predict_layers), 0.0);
  int64_t seqs = 0, batches = 0;
  for (int64_t w0 = 0; w0 < windows && (max_batches == 0 || batches < max_batches); w0 += B) {
    const int64_t b = std::min(B, windows - w0);
    ModelBatch batch{Tensor::empty({b, T}, DType::kI32), Tensor::empty({b, T}, DType::kI32)};
    for (int64_t i = 0; i < b; ++i)
      for (int64_t t = 0; t < T; ++t) {
        batch.inputs.data_as<int32_t>()[i * T + t] = tokens[(w0 + i) * T + t];
        batch.targets.data_as<int32_t>()[i * T + t] = tokens[(w0 + i) * T + t + 1];
      }
    const LossValues l = model.read_losses(ctx, model.step(ctx, batch, Pass::kForward));
    sum += l.main * static_cast<double>(b);
    for (size_t k = 0; k < l.mtp.size(); ++k) mtp_sum[k] += l.mtp[k] * static_cast<double>(b);
    seqs += b;
    ++batches;
  }
  std::printf("tokens: %lld targets in %lld sequences of %lld\n", static_cast<long long>(seqs) * T,
              static_cast<long long>(seqs), static_cast<long long>(T));
  std::printf("loss: %.6f\n", sum / static_cast<double>(seqs));
  for (size_t k = 0; k < mtp_sum.size(); ++k)
    std::printf("mtp_loss[%zu]: %.6f\n", k + 1, mtp_sum[k] / static_cast<double>(seqs));
  return 0;
}

}  // namespace

Command eval_command() {
  return {"eval", "mean cross-entropy of a checkpoint over text or a token shard",
          "usage: octet eval CHECKPOINT_OR_RUN (--text FILE | --tokens FILE) [flags]\n"
          "  CHECKPOINT_OR_RUN  a checkpoint directory, or a run directory (its latest)\n"
          "  --text FILE        UTF-8 text, tokenized byte by byte (vocab_size >= 257)\n"
          "  --tokens FILE      an llm.c token shard (uint16 or uint32 tokens)\n"
          "  --recipe R         precision recipe, without overrides (default: the checkpoint\n"
          "                     config's octet_recipe with its octet_recipe_overrides)\n"
          "  --device D         auto (default: cuda when a GPU is present), cpu or cuda\n"
          "  --seq-len T        tokens per sequence (default min(256, max_position_embeddings))\n"
          "  --batch B          sequences per forward pass (default 8)\n"
          "  --max-batches N    stop after N batches (default 0: all the data)\n"
          "Prints `loss: <mean cross-entropy>` and `mtp_loss[k]: ...` per MTP depth.\n",
          run_eval};
}

}  // namespace octet::cli
