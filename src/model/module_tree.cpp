// The model's structure (module_tree.h).
#include "model/module_tree.h"

namespace octet {
namespace {

// Appends the tensors of one block: `layer` and `depth` as ModuleTensor has them.
struct BlockTensors {
  std::vector<ModuleTensor>& out;
  int64_t layer = -1;
  int64_t depth = -1;

  // A parameter held as itself (or an MTP module's copy of the main model's `copy_of`).
  void add(ParamRole role, const Shape& shape, TensorKind kind,
           std::optional<ParamRole> copy_of = std::nullopt) {
    ModuleTensor t;
    t.role = role;
    t.layer = layer;
    t.mtp_depth = depth;
    t.shape = shape;
    t.kind = kind;
    t.param_shape = shape;
    t.copy_of = copy_of;
    out.push_back(std::move(t));
  }
  // A Linear weight held as `part` (of `expert`, or -1) of the fused parameter of `role`, whose
  // shape is `param_shape`, from element `offset`.
  void add_part(ParamRole role, TensorPart part, int64_t expert, const Shape& shape,
                const Shape& param_shape, int64_t offset) {
    add(role, shape, TensorKind::kLinear);
    out.back().part = part;
    out.back().expert = expert;
    out.back().param_shape = param_shape;
    out.back().param_offset = offset;
  }
};

// One decoder layer (main or MTP): attention, norms and the dense or MoE MLP.
void add_decoder_layer(const ModelConfig& c, BlockTensors b) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  b.add(ParamRole::kInputNorm, {D}, TensorKind::kNorm);
  if (c.q_lora_rank) {
    b.add(ParamRole::kQAProj, {*c.q_lora_rank, D}, TensorKind::kLinear);
    b.add(ParamRole::kQANorm, {*c.q_lora_rank}, TensorKind::kNorm);
    b.add(ParamRole::kQBProj, {H * c.qk_head_dim(), *c.q_lora_rank}, TensorKind::kLinear);
  } else {
    b.add(ParamRole::kQProj, {H * c.qk_head_dim(), D}, TensorKind::kLinear);
  }
  b.add(ParamRole::kKvAProj, {c.kv_lora_rank + c.qk_rope_head_dim, D}, TensorKind::kLinear);
  b.add(ParamRole::kKvANorm, {c.kv_lora_rank}, TensorKind::kNorm);
  b.add(ParamRole::kKvBProj, {H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank},
        TensorKind::kLinear);
  b.add(ParamRole::kOProj, {D, H * c.v_head_dim}, TensorKind::kLinear);
  b.add(ParamRole::kPostNorm, {D}, TensorKind::kNorm);
  // A SwiGLU MLP whose gate and up projections the model holds as one gate_up parameter.
  auto add_mlp = [&](ParamRole gate_up, ParamRole down, int64_t inter) {
    b.add_part(gate_up, TensorPart::kGate, -1, {inter, D}, {2 * inter, D}, 0);
    b.add_part(gate_up, TensorPart::kUp, -1, {inter, D}, {2 * inter, D}, inter * D);
    b.add(down, {D, inter}, TensorKind::kLinear);
  };
  if (!c.is_moe_layer(b.layer)) {
    add_mlp(ParamRole::kMlpGateUp, ParamRole::kMlpDown, c.intermediate_size);
    return;
  }
  b.add(ParamRole::kRouterGate, {c.n_routed_experts, D}, TensorKind::kRouterGate);
  b.add(ParamRole::kRouterBias, {c.n_routed_experts}, TensorKind::kRouterBias);
  // The routed experts, stacked: (E, 2F, D) gate_up and (E, D, F) down.
  const int64_t E = c.n_routed_experts, F = c.moe_intermediate_size;
  for (int64_t j = 0; j < E; ++j) {
    b.add_part(ParamRole::kExpertsGateUp, TensorPart::kGate, j, {F, D}, {E, 2 * F, D},
               2 * j * F * D);
    b.add_part(ParamRole::kExpertsGateUp, TensorPart::kUp, j, {F, D}, {E, 2 * F, D},
               (2 * j + 1) * F * D);
    b.add_part(ParamRole::kExpertsDown, TensorPart::kWhole, j, {D, F}, {E, D, F}, j * D * F);
  }
  if (c.n_shared_experts > 0)
    add_mlp(ParamRole::kSharedGateUp, ParamRole::kSharedDown,
            c.moe_intermediate_size * c.n_shared_experts);
}

}  // namespace

std::vector<ModuleTensor> module_tree(const ModelConfig& c) {
  c.validate();
  const int64_t V = c.vocab_size, D = c.hidden_size, N = c.num_hidden_layers;
  std::vector<ModuleTensor> out;
  BlockTensors outside{out};
  outside.add(ParamRole::kEmbedding, {V, D}, TensorKind::kEmbedding);
  for (int64_t i = 0; i < N; ++i) add_decoder_layer(c, {out, i, -1});
  outside.add(ParamRole::kFinalNorm, {D}, TensorKind::kNorm);
  if (!c.tie_word_embeddings) outside.add(ParamRole::kLmHead, {V, D}, TensorKind::kHead);
  // MTP modules, as DeepSeek-V3's release stores them (see the top of model/checkpoint.h): a full
  // decoder layer at index N + d between the module's own norms, projection and copies of the
  // shared embedding and head.
  const ParamRole head = c.tie_word_embeddings ? ParamRole::kEmbedding : ParamRole::kLmHead;
  for (int64_t d = 0; d < c.num_nextn_predict_layers; ++d) {
    BlockTensors mtp{out, N + d, d};
    mtp.add(ParamRole::kMtpEmbedding, {V, D}, TensorKind::kEmbedding, ParamRole::kEmbedding);
    mtp.add(ParamRole::kMtpENorm, {D}, TensorKind::kNorm);
    mtp.add(ParamRole::kMtpHNorm, {D}, TensorKind::kNorm);
    mtp.add(ParamRole::kMtpEhProj, {D, 2 * D}, TensorKind::kMtpProjection);
    add_decoder_layer(c, mtp);
    mtp.add(ParamRole::kMtpHeadNorm, {D}, TensorKind::kNorm);
    mtp.add(ParamRole::kMtpHead, {V, D}, TensorKind::kHead, head);
  }
  return out;
}

}  // namespace octet
