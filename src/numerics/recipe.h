// Precision recipes: the per-site precision map of DESIGN.md section 1, as data.
//
// A site is a place where the model runs a GEMM or stores a tensor for backward. A recipe assigns
// every site its precision; the model reads the recipe, it never branches on a recipe's name.
// Presets:
//
//   bf16                every GEMM in BF16: the baseline
//   fp8-tensor-delayed  per-tensor scales from an amax history; E4M3 forward, E5M2 gradients
//                       ("HYBRID", TransformerEngine's DelayedScaling)
//   fp8-tensor-current  per-tensor scales from this step's amax; E4M3 forward, E5M2 gradients
//   deepseek            DeepSeek-V3's fine-grained recipe: E4M3 everywhere, activations and
//                       gradients in 1x128 tiles, weights in 128x128 blocks, FP32-promoted
//                       accumulation; the o_proj input cached in E5M6; FP8 MoE dispatch;
//                       power-of-2 scales where the report requires them
//                       (reference/fp8-facts.md section 4)
//   fp8-flow            deepseek plus FP8-Flow-MoE's casting-free MoE dataflow (section 5)
//
// In every preset the embedding, the output head and the MTP projection stay BF16 (the last two
// can be overridden), the router always (BF16 input, FP32 scores: not overridable), norms, softmax
// and accumulation FP32, master weights and gradients FP32, AdamW moments BF16. Any other site can
// be overridden with `key=value` (see apply_recipe_override).
//
// What a user chose is a RecipeSpec: a preset name and its override list, stored once
// (ModelConfig::recipe; config.json `octet_recipe` + `octet_recipe_overrides`; the trainer's
// `recipe` + `recipe_overrides` keys). resolve_recipe turns it into the Recipe the model reads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "numerics/scale.h"

namespace octet {

// The Linear layers of a DeepSeek-V3-style model.
enum class GemmSite : uint8_t {
  kAttnQDown,     // q_a_proj (or q_proj without q_lora)
  kAttnQUp,       // q_b_proj
  kAttnKvDown,    // kv_a_proj_with_mqa
  kAttnKvUp,      // kv_b_proj
  kAttnOut,       // o_proj
  kDenseGateUp,   // gate_proj + up_proj of the first dense layers
  kDenseDown,     // down_proj of the first dense layers
  kExpertGateUp,  // routed experts' gate_proj + up_proj (grouped)
  kExpertDown,    // routed experts' down_proj (grouped)
  kSharedGateUp,  // shared experts
  kSharedDown,
  kRouter,   // mlp.gate: BF16 input, FP32 scores
  kMtpProj,  // MTP eh_proj
  kHead,     // lm_head / shared_head.head
  kCount,
};
inline constexpr int kGemmSiteCount = static_cast<int>(GemmSite::kCount);

enum class GemmPrecision : uint8_t {
  kBf16,       // BF16 operands, FP32 accumulation
  kFp8Tensor,  // one scale per tensor
  kFp8Block,   // 1x128 activations and gradients, 128x128 weights, FP32 promotion every 128 of K
};

enum class ScalingMode : uint8_t { kCurrent, kDelayed };  // per-tensor FP8 only

// How a tensor kept for the backward pass is stored.
enum class Storage : uint8_t {
  kBf16,
  kFp8,   // as the FP8 GEMM that consumes it quantized it
  kE5M6,  // DeepSeek-V3's emulated 5-exponent, 6-mantissa storage with power-of-2 scales
};

// How a Wgrad operand's column-wise FP8 copy is made from a row-wise FP8 tensor that already exists
// (the MoE dispatch payload, the SwiGLU output, and in fp8_flow the dispatched gradient and the
// dSwiGLU output).
enum class Fp8Transpose : uint8_t {
  kScalingAware,  // FP8-Flow-MoE's scaling-aware transpose: exact exponent shifts, no wide copy
  kRequantize,    // dequantize to FP32, quantize along the other axis with the tensor's
                  // (power-of-2) scale rounding: the double quantization fp8-flow avoids, kept to
                  // measure it (docs/numerics.md)
  kRequantizeExact,  // the same with exact (not power-of-2) scales: the naive FP8 flow
};

// The operands a site's GEMMs quantize.
enum class GemmOperand : uint8_t {
  kActivation,  // x: Fprop's A, Wgrad's B
  kWeight,      // W: Fprop's B, Dgrad's B (its column-wise copy)
  kGradient,    // dy: Dgrad's A, Wgrad's A
};

struct GemmRecipe {
  GemmPrecision precision = GemmPrecision::kBf16;
  ScalingMode scaling = ScalingMode::kCurrent;   // kFp8Tensor only
  Fp8Format forward_format = Fp8Format::kE4M3;   // activations and weights
  Fp8Format backward_format = Fp8Format::kE4M3;  // gradients (E5M2 in the HYBRID recipes)
  ScaleRounding activation_rounding = ScaleRounding::kExact;  // kPow2 where DeepSeek requires it
  ScaleRounding gradient_rounding = ScaleRounding::kExact;

  bool is_fp8() const { return precision != GemmPrecision::kBf16; }
  // How an FP8 site quantizes one operand: the one mapping from a recipe to quantize arguments
  // (model/linear.h quantize_args builds the ops' QuantizeArgs from it). Format: forward_format
  // for activations and weights, backward_format for gradients. Groups: fp8-block 1x128 tiles for
  // activations and gradients and 128x128 blocks for weights (DeepSeek-V3), fp8-tensor one scale.
  // Rounding: activation_rounding, gradient_rounding; weights exact.
  struct Quantization {
    Fp8Format format = Fp8Format::kE4M3;
    Granularity granularity = Granularity::kTensor;
    ScaleRounding rounding = ScaleRounding::kExact;
  };
  Quantization quantization(GemmOperand operand) const;
  // Per-tensor scales from an amax history (the one predicate every caller uses).
  bool is_delayed() const {
    return precision == GemmPrecision::kFp8Tensor && scaling == ScalingMode::kDelayed;
  }
};

// A recipe as the user states it: a preset and the overrides applied over it, in order.
struct RecipeSpec {
  std::string preset = "deepseek";     // a name of recipe_names()
  std::vector<std::string> overrides;  // apply_recipe_override assignments

  // "deepseek", or "deepseek + gemm.attn.out=bf16, margin=1".
  std::string label() const;
  bool operator==(const RecipeSpec&) const = default;
};

struct Recipe {
  RecipeSpec spec;  // what it was made from: recipe_preset sets the preset, each override appends
  std::array<GemmRecipe, kGemmSiteCount> gemm{};
  Storage attn_out_input = Storage::kBf16;  // input of o_proj, cached for its Wgrad
  Storage moe_dispatch = Storage::kBf16;  // MoE permute payload (and what the experts' Wgrad keeps)
  bool fp8_flow = false;                  // casting-free MoE dataflow between dispatch and combine
  // The routed experts' SwiGLU input gu as kept from forward to backward (model/moe.h): BF16, or
  // FP8 (E4M3, 1x128 tiles, power-of-2 scales) as DeepSeek-V3 caches it, written by the fused
  // SwiGLU pass and read by the backward's recomputation and dSwiGLU. fp8 (the default of deepseek
  // and fp8-flow; gemm.*=bf16 resets it to bf16) needs the recomputed down projection (no delayed
  // scaling there; with the model key moe_recompute off it has no effect; the expert-parallel path
  // keeps BF16).
  Storage moe_swiglu_input = Storage::kBf16;
  Fp8Transpose fp8_transpose = Fp8Transpose::kScalingAware;  // column-wise copies of FP8 tensors
  // Delayed scaling (TransformerEngine's defaults).
  int64_t amax_history_len = 1024;
  AmaxReduction amax_reduction = AmaxReduction::kMax;
  int margin = 0;
  // The scaling a site takes when an override switches it to fp8-tensor (the preset's).
  ScalingMode tensor_scaling = ScalingMode::kCurrent;

  std::string name() const { return spec.label(); }  // for messages
  bool any_fp8() const;
  const GemmRecipe& at(GemmSite s) const { return gemm[static_cast<size_t>(s)]; }
  GemmRecipe& at(GemmSite s) { return gemm[static_cast<size_t>(s)]; }
  void validate() const;
};

const char* gemm_site_name(GemmSite s);  // "attn.q_down", ... (the override keys)
const char* gemm_precision_name(GemmPrecision p);
const char* storage_name(Storage s);
const char* fp8_transpose_name(Fp8Transpose t);
std::vector<std::string> recipe_names();

// A preset by name; throws listing the known names.
Recipe recipe_preset(std::string_view name);

// The preset with every override applied, validated. Errors name the part at fault:
// "recipe: unknown recipe 'x' ..." or "recipe_overrides[1] 'margin=x': ...".
Recipe resolve_recipe(const RecipeSpec& spec);

// One override, `key=value`:
//   gemm.<site>=bf16|fp8-tensor|fp8-block   e.g. gemm.attn.out=bf16, or gemm.*=bf16 for every site
//   attn_out_input=bf16|fp8|e5m6   moe_dispatch=bf16|fp8   moe_swiglu_input=bf16|fp8
//   fp8_flow=true|false   fp8_transpose=scaling-aware|requantize|requantize-exact
//   amax_history_len=N   amax_reduction=max|most_recent   margin=N
// A site switched to fp8-block takes DeepSeek-V3's block settings (E4M3, exact scales); one
// switched to fp8-tensor takes E4M3/E5M2 with the recipe's tensor_scaling. The router site stays
// BF16: `gemm.router=` anything else is an error, and `gemm.*` leaves it alone. Throws naming the
// key or the value on anything else; the result is validated and the assignment appended to
// r.spec.overrides.
void apply_recipe_override(Recipe& r, std::string_view assignment);

// The per-site table `octet describe` prints.
std::string recipe_table(const Recipe& r);

}  // namespace octet
