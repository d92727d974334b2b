// Checkpoints: a model's parameters as a directory the Hugging Face ecosystem and DeepSeek-V3's
// tooling read as is.
//
// Layout (the transformers library's save_pretrained, and DeepSeek-V3's release): config.json
// (model_config_to_json, plus the release's quantization_config when FP8 weights are stored) in a
// sharded safetensors directory as io/safetensors_dir.h writes and reads it (model.safetensors or
// numbered shards with model.safetensors.index.json).
//
// Tensor names and shapes are the transformers library's DeepseekV3 names (expected_tensors) of the
// structure model/module_tree.h describes. The Multi-Token Prediction modules follow DeepSeek-V3's
// release: depth d lives at layer index L = num_hidden_layers + d as a full (MoE) decoder layer
// plus enorm, hnorm, eh_proj, shared_head.norm, shared_head.head and embed_tokens. The release
// shares embed_tokens and shared_head.head with the main model but stores a copy of each per MTP
// layer; octet does the same, so that a checkpoint it writes loads in the release's own inference
// code, vLLM and SGLang (which read these names), and it requires them on reading. The transformers
// library drops the MTP layers on saving; such a checkpoint reads with a warning
// (LoadedCheckpoint::warnings) and the caller initialises fresh MTP layers.
//
// Storage formats (CheckpointFormat):
//   kAsIs  every tensor in the dtype it is given in (F32 or BF16; an FP8 pair passes through).
//   kBf16  the release's dtypes with every FP8 weight in BF16 instead, i.e. what DeepSeek's
//          fp8_cast_bf16.py makes of the release: BF16 everywhere (norms included, as the release
//          keeps them), except e_score_correction_bias in F32. The bias is moved by ~1e-3 steps
//          (auxiliary-loss-free balancing) and BF16's 8-bit mantissa would swallow those updates.
//   kFp8   DeepSeek-V3's released form: every TensorKind::kLinear weight as `X.weight` F8_E4M3 plus
//          `X.weight_scale_inv` F32 of shape (ceil(out/128), ceil(in/128)), one scale per 128x128
//          block (octet::quantize, E4M3, exact scales, on the CPU); everything else as in kBf16
//          (the release keeps the embeddings, heads, router gate and eh_proj in BF16).
//
// Atomicity: io/safetensors_dir.h's (a staging directory swapped into place; files of an existing
// directory that are not part of its checkpoint are carried over).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/quant_tensor.h"
#include "io/safetensors.h"
#include "io/safetensors_parts.h"
#include "model/config.h"
#include "model/module_tree.h"

namespace octet {

const char* tensor_kind_name(TensorKind k);

// One tensor of the checkpoint: module_tree()'s ModuleTensor with its DeepSeek-V3 name.
struct TensorSpec {
  std::string name;  // DeepSeek-V3 / transformers name
  Shape shape;       // row-major; Linear weights (out, in) as PyTorch stores them
  TensorKind kind = TensorKind::kLinear;
  int64_t layer = -1;      // decoder layer index (MTP layers included); -1 outside the layers
  int64_t mtp_depth = -1;  // 0-based MTP depth; -1 for the main model
  ParamRole role = ParamRole::kEmbedding;  // of the parameter holding it (module_tree.h)
  // Where the model holds it when it fuses parameters (model/module_tree.h): the fused
  // parameter's name and shape, and this tensor's first element in it. Empty: held as itself.
  // Dense and shared-expert gate_proj / up_proj are rows [0, I) / [I, 2I) of
  // `mlp.gate_up_proj.weight`; routed expert j's are [2j] / [2j + 1] of
  // `mlp.experts.gate_up_proj` (E, 2F, D), its down_proj [j] of `mlp.experts.down_proj` (E, D, F).
  std::string fused_name;
  int64_t fused_offset = 0;
  Shape fused_shape;
  // An MTP module's copy of the shared embedding or head: the main model's tensor whose values it
  // holds (it is no parameter of its own). Empty otherwise.
  std::string copy_of;
};

// Every tensor of the checkpoint, in module_tree()'s order (embed_tokens, layers 0..N-1,
// model.norm, lm_head (absent when tie_word_embeddings), then the MTP layers N..N+depth-1), named
// in DeepSeek-V3's layout.
std::vector<TensorSpec> expected_tensors(const ModelConfig& c);

// The model's name of the parameter of `role` in `layer` (-1 outside the layers): the checkpoint
// name of a tensor held as itself, the fused name (e.g. model.layers.3.mlp.experts.gate_up_proj)
// of a fused one.
std::string parameter_name(ParamRole role, int64_t layer);

// The name of the FP8 scale tensor of weight `name`: "X.weight" -> "X.weight_scale_inv".
std::string fp8_scale_name(const std::string& weight_name);
// The release's scale_inv shape for an (out, in) weight: (ceil(out/128), ceil(in/128)).
Shape fp8_scale_shape(const Shape& weight_shape);

enum class CheckpointFormat : uint8_t { kAsIs, kBf16, kFp8 };

struct CheckpointWriteOptions {
  CheckpointFormat format = CheckpointFormat::kAsIs;
  // Largest shard, in data bytes: transformers' default max_shard_size "5GB" (decimal). A tensor
  // (or an FP8 weight with its scales, which stay together) larger than this gets a shard of its
  // own.
  int64_t shard_bytes = 5'000'000'000;
  // Called after each file is complete in the staging directory, with its path and the data bytes
  // written so far / in all. An exception thrown from it aborts the write as an I/O error would
  // (the previous checkpoint stays in place); the tests use this to simulate interrupted writes.
  std::function<void(const std::string& file, int64_t done_bytes, int64_t total_bytes)> progress;
};

// Writes the checkpoint atomically (see the top of this file). `params` holds host tensors named as
// expected_tensors(config) lists them, exactly those, with those shapes, in F32 or BF16; a kLinear
// weight may instead be given in the release form, `X.weight` F8_E4M3 with `X.weight_scale_inv`.
// Shards hold the tensors in the order of `params`.
void write_checkpoint(const std::string& dir, const ModelConfig& config,
                      const io::NamedTensors& params, const CheckpointWriteOptions& options = {});

enum class Fp8Weights : uint8_t {
  kDequantize,  // X.weight + X.weight_scale_inv -> F32 tensor (octet::dequantize, 128x128)
  kKeep,        // -> LoadedCheckpoint::quantized as QuantTensors
};
enum class ReadCast : uint8_t {
  kAsStored,  // F32 / BF16 tensors as the files hold them
  kToF32,     // every tensor widened to F32 (exact)
};

struct CheckpointReadOptions {
  Fp8Weights fp8_weights = Fp8Weights::kDequantize;
  ReadCast cast = ReadCast::kAsStored;
  // Non-null: the tensors named there have only those element ranges read (the rest of them
  // uninitialised; an empty list reads nothing): what a rank that holds part of the model reads
  // (train/checkpoint_plan.h, model_resume_ranges). A converted tensor (BF16 or FP8 to F32) is
  // converted whole, its unread elements into values the caller must not use.
  const io::ElementRanges* ranges = nullptr;
};

struct LoadedCheckpoint {
  ModelConfig config;
  // Host tensors in expected_tensors order. FP8 weights kept as QuantTensors are not in here.
  io::NamedTensors tensors;
  // With Fp8Weights::kKeep: "X.weight" -> {data (out, in) E4M3, scale_inv (ceil(out/128),
  // ceil(in/128)) F32, granularity k128x128, format kE4M3}; amax is left undefined (not stored).
  std::map<std::string, QuantTensor> quantized;
  // MTP tensors the checkpoint lacks (when it has no MTP layer at all): the caller initialises
  // them.
  std::vector<std::string> missing_mtp;
  std::vector<std::string> warnings;  // one line each, for the caller to print
  bool stored_fp8 = false;            // whether any weight was stored in FP8

  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  // Throws naming the tensor.
  const Tensor& at(const std::string& name) const;

 private:
  friend LoadedCheckpoint read_checkpoint(const std::string&, const CheckpointReadOptions&);
  std::map<std::string, size_t> index_;
};

// Reads and validates a checkpoint directory written by octet, by the transformers library, or
// released by DeepSeek (see the top of this file). Errors name the file and the tensor: a missing,
// extra or misshapen tensor, a weight_map entry whose file is missing or lacks the tensor, a tensor
// in two shards, a shard tensor the index does not list.
LoadedCheckpoint read_checkpoint(const std::string& dir, const CheckpointReadOptions& options = {});

}  // namespace octet
