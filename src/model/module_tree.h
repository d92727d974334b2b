// The model's structure, described once: its blocks (the embedding, the decoder layers, the final
// norm and head, the Multi-Token Prediction modules), the parameters each block holds and their
// roles, shapes and kinds, and where the model fuses checkpoint tensors into one parameter.
//
// Everything else derives from this tree: the checkpoint layout (model/checkpoint.h
// expected_tensors, which names each tensor in DeepSeek-V3's layout), the model's parameters and
// the wiring of its blocks (model/model.h, which finds a block's parameters by layer and role),
// and initialisation (model/init.h). Nothing recovers structure from a tensor's name.
//
// Fused parameters (model/parameter.h):
//   kMlpGateUp, kSharedGateUp  (2I, D)     part kGate = rows [0, I), part kUp = rows [I, 2I)
//   kExpertsGateUp             (E, 2F, D)  expert j's kGate = [2j], kUp = [2j + 1]
//   kExpertsDown               (E, D, F)   expert j's down projection = [j]
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace octet {

// What a parameter is, which decides how each checkpoint format stores it.
enum class TensorKind : uint8_t {
  kLinear,         // Linear weight (out, in): FP8 128x128 in the release form
  kNorm,           // RMSNorm weight (n)
  kEmbedding,      // token embedding (V, D)
  kHead,           // output projection (V, D): BF16 in the release
  kRouterGate,     // MoE router weight (E, D): BF16 in the release
  kRouterBias,     // e_score_correction_bias (E): F32 in the release
  kMtpProjection,  // eh_proj (D, 2D): BF16 in the release
};

// A parameter's role in its block. Outside the layers: kEmbedding, kFinalNorm, kLmHead. In a
// decoder layer (main or MTP): attention, its norms and the dense or MoE MLP. In an MTP module,
// around its decoder layer: kMtp*.
enum class ParamRole : uint8_t {
  kEmbedding,
  kFinalNorm,
  kLmHead,
  kInputNorm,
  kQProj,   // without q_lora_rank
  kQAProj,  // with q_lora_rank: q_a_proj, q_a_layernorm, q_b_proj
  kQANorm,
  kQBProj,
  kKvAProj,
  kKvANorm,
  kKvBProj,
  kOProj,
  kPostNorm,
  kMlpGateUp,  // dense layers
  kMlpDown,
  kRouterGate,  // MoE layers
  kRouterBias,
  kExpertsGateUp,
  kExpertsDown,
  kSharedGateUp,
  kSharedDown,
  kMtpEmbedding,  // the MTP module's copy of the shared embedding (holds no parameter)
  kMtpENorm,
  kMtpHNorm,
  kMtpEhProj,
  kMtpHeadNorm,
  kMtpHead,  // the MTP module's copy of the shared head (holds no parameter)
};

// Which part of a fused parameter a checkpoint tensor is.
enum class TensorPart : uint8_t { kWhole, kGate, kUp };

// One checkpoint tensor of the tree, and the parameter that holds it.
struct ModuleTensor {
  ParamRole role = ParamRole::kEmbedding;  // the parameter's role (the fused one's, when fused)
  TensorPart part = TensorPart::kWhole;
  int64_t layer = -1;      // decoder layer index (MTP layers included); -1 outside the layers
  int64_t mtp_depth = -1;  // 0-based MTP depth; -1 for the main model
  int64_t expert = -1;     // routed expert index (kExpertsGateUp, kExpertsDown); -1 otherwise
  Shape shape;             // row-major; Linear weights (out, in) as PyTorch stores them
  TensorKind kind = TensorKind::kLinear;
  // The holding parameter's shape, and this tensor's first element in it (0 and `shape` when the
  // tensor is held as itself).
  Shape param_shape;
  int64_t param_offset = 0;
  // The MTP modules' copies hold no parameter: their values are the main model's parameter of
  // this role (outside the layers): kEmbedding, or for the head kLmHead (kEmbedding when tied).
  std::optional<ParamRole> copy_of = std::nullopt;

  bool fused() const { return part != TensorPart::kWhole || expert >= 0; }
};

// Every checkpoint tensor of the model, in the checkpoint's fixed order: the embedding, layers
// 0..N-1, the final norm, the head (absent when tie_word_embeddings), then the MTP modules at
// layers N..N+depth-1. Validates the config.
std::vector<ModuleTensor> module_tree(const ModelConfig& c);

}  // namespace octet
