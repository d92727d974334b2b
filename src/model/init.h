// Fresh parameters for a model, as the transformers library's DeepseekV3PreTrainedModel
// ._init_weights makes them:
//   Linear weights (attention, MLPs, experts, eh_proj), the router gate weight, the token
//   embedding and the output head    ~ N(0, initializer_range^2)
//   RMSNorm weights                  = 1
//   e_score_correction_bias          = 0, F32 whatever `dtype` (a buffer created as zeros, and
//                                      zeroed explicitly by recent versions)
//   the embedding row pad_token_id   = 0 when config.json sets pad_token_id (nn.Embedding's
//                                      padding_idx; DeepSeek-V3's release sets none)
// The MTP modules' embed_tokens and shared_head.head are copies of the main model's embedding and
// output head (lm_head, or the embedding when tie_word_embeddings): DeepSeek-V3 shares them and
// stores a copy per MTP layer (see model/checkpoint.h).
//
// Determinism: tensor `name` draws from the Philox stream (seed, stream_id(name)) (core/rng.h),
// element k (row-major) from index k of that stream, as std * z in FP64 rounded once to FP32. A
// tensor's values therefore depend on the seed, its name and its shape only: adding layers, MTP
// depth or experts leaves every other tensor bit-for-bit the same, and a device implementation
// can fill any element independently (ops/init/init_normal.h: the host loop runs on several
// threads for large tensors, and the CUDA kernel gives the host's values bit for bit).
//
// init_model writes the same values straight into a model's parameters on its device: on CUDA the
// Gaussian tensors are drawn by the kernel (no host loop, no upload), so a large model starts in
// seconds where the single-threaded host loop took about a minute for 2.9B parameters.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "io/safetensors.h"
#include "model/config.h"

namespace octet {

class Model;

// Every tensor of expected_tensors(config), in that order, as host tensors of `dtype` (kF32 or
// kBF16: FP32 values rounded to nearest even), except e_score_correction_bias in F32 always.
io::NamedTensors init_parameters(const ModelConfig& config, uint64_t seed,
                                 DType dtype = DType::kF32);

// The stream id tensor `name` draws from (FNV-1a of the name).
uint64_t init_stream(const std::string& name);

// Sets every parameter of `model` (F32 masters on ctx's device) to what
// model.load(init_parameters(model.config(), seed)) would set, bit for bit, computing on the
// model's device. Synchronises (CUDA: once per Gaussian tensor, to read its uncertified indices).
// With the routed experts sharded (expert parallelism) each rank draws only its own experts: an
// element's value depends on its tensor's name and index alone, so they are the single rank's.
void init_model(Context& ctx, Model& model, uint64_t seed);

}  // namespace octet
