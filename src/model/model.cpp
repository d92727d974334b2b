// Model assembly: parameters and their checkpoint names, the forward over embedding, layers, heads
// and MTP modules, and the backward in reverse order (model.h has the math).
#include "model/model.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/checkpoint.h"
#include "model/init.h"
#include "ops/attention/attention.h"
#include "ops/cast/cast.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "ops/embedding/embedding.h"
#include "ops/layout/layout.h"

namespace octet {
namespace {

CopyKind to_device_kind(const Context& ctx) {
  return ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kHostToDevice;
}

void check_precision(const Context& ctx, const Precision& p) {
  p.recipe.validate();
  OCTET_CHECK(p.act == DType::kBF16 || p.act == DType::kF32,
              "model: activations must be BF16 "
              "(or F32 in the FP32 checking mode), got ",
              dtype_name(p.act));
  if (p.act == DType::kF32) {
    OCTET_CHECK(ctx.device == Device::kCpu, "model: the FP32 checking mode runs on the CPU only");
    for (int s = 0; s < kGemmSiteCount; ++s)
      OCTET_CHECK(!p.recipe.gemm[static_cast<size_t>(s)].is_fp8(),
                  "model: the FP32 checking mode needs the bf16 recipe; site ",
                  gemm_site_name(static_cast<GemmSite>(s)), " is FP8");
  }
}

void collect_moe(const MoeLayer::Saved& s, ModelLosses& out) {
  out.expert_load.push_back(s.route.counts);
  if (s.aux_loss.defined() && s.aux_loss.numel() > 0 && s.aux_loss.data() != nullptr)
    out.aux.push_back(s.aux_loss);
}

// Where checkpoint tensor `s` lives in the model: the parameter's name, the first element and the
// parameter's shape (TensorSpec's fused location, or the tensor itself).
struct FusedLocation {
  std::string name;
  int64_t offset = 0;
  Shape shape;
};

FusedLocation fused_location(const TensorSpec& s) {
  if (s.fused_name.empty()) return {s.name, 0, s.shape};
  return {s.fused_name, s.fused_offset, s.fused_shape};
}

}  // namespace

Parameter* Model::add(const std::string& name, const Shape& shape, WeightDecay decay,
                      Trainable trainable) {
  auto p = std::make_unique<Parameter>();
  p->name = name;
  p->weight_decay = decay == WeightDecay::kYes;
  p->trainable = trainable == Trainable::kYes;
  // Shape only (no storage yet): the constructor allocates every parameter on the device once all
  // are known.
  p->value = Tensor::wrap(nullptr, shape, DType::kF32, Device::kCpu);
  Parameter* raw = p.get();
  params_.push_back(std::move(p));
  by_name_[name] = raw;
  return raw;
}

Model::Model(Context& ctx, const ModelConfig& config, const Precision& precision,
             std::shared_ptr<Comm> expert_group)
    : config_(config), precision_(precision) {
  config_.validate();
  if (expert_group && expert_group->size() > 1) expert_group_ = std::move(expert_group);
  experts_ = expert_group_ ? expert_slice(config_.n_routed_experts, expert_group_->rank(),
                                          expert_group_->size())
                           : ExpertSlice{0, config_.n_routed_experts};
  check_precision(ctx, precision_);
  // A head-dim pair the attention backend cannot run fails here, before any work.
  attention_check_supported(ctx, config_.qk_nope_head_dim + config_.qk_rope_head_dim,
                            config_.v_head_dim);
  const ModelConfig& c = config_;
  const int64_t L = c.num_hidden_layers, K = c.num_nextn_predict_layers;

  // Parameters, named and shaped by the checkpoint layout (fused where the model fuses).
  for (const TensorSpec& s : expected_tensors(c)) {
    if (!s.copy_of.empty()) continue;  // the MTP modules' copies of the shared embedding and head
    auto [name, offset, shape] = fused_location(s);
    const bool sharded =
        expert_group_ && (s.role == ParamRole::kExpertsGateUp || s.role == ParamRole::kExpertsDown);
    const int64_t base = sharded ? experts_.first * (shape_numel(shape) / shape[0]) : 0;
    if (sharded) shape[0] = experts_.count;  // this rank's experts only
    if (!by_name_.count(name)) {
      by_role_[{s.layer, s.role}] =
          add(name, shape, shape.size() >= 2 ? WeightDecay::kYes : WeightDecay::kNo,
              s.kind == TensorKind::kRouterBias ? Trainable::kNo : Trainable::kYes);
      if (sharded) shard_base_[by_name_.at(name)] = base;
    }
    slots_[s.name] = {by_name_.at(name), offset, shape_numel(s.shape)};
  }
  for (auto& p : params_) {
    const Shape shape = p->value.shape();
    p->value = Tensor::empty(ctx, shape, DType::kF32);
    p->grad = zeros(ctx, shape, DType::kF32);
  }

  embed_ = param(-1, ParamRole::kEmbedding);
  head_proj_.site = GemmSite::kHead;
  head_proj_.param = c.tie_word_embeddings ? embed_ : param(-1, ParamRole::kLmHead);
  head_.norm = {param(-1, ParamRole::kFinalNorm), static_cast<float>(c.rms_norm_eps)};
  head_.head = &head_proj_;
  head_.chunk_tokens = c.head_chunk_tokens;
  layers_.resize(static_cast<size_t>(L));
  mtp_.resize(static_cast<size_t>(K));
  for (int64_t i = 0; i < L; ++i) build_layer(layers_[i], i);
  for (int64_t k = 0; k < K; ++k) {
    MtpModule& m = mtp_[k];
    const int64_t layer = L + k;
    const auto eps = static_cast<float>(c.rms_norm_eps);
    m.enorm = {param(layer, ParamRole::kMtpENorm), eps};
    m.hnorm = {param(layer, ParamRole::kMtpHNorm), eps};
    m.eh_proj.site = GemmSite::kMtpProj;
    m.eh_proj.param = param(layer, ParamRole::kMtpEhProj);
    build_layer(m.layer, layer);
    m.head.norm = {param(layer, ParamRole::kMtpHeadNorm), eps};
    m.head.head = &head_proj_;
    m.head.chunk_tokens = c.head_chunk_tokens;
  }
  for (auto& l : layers_)
    if (l.moe) moe_layers_.push_back(&*l.moe);
  for (auto& m : mtp_)
    if (m.layer.moe) moe_layers_.push_back(&*m.layer.moe);
  for (MoeLayer* m : moe_layers_) m->recompute_down = c.moe_recompute;
  rope_ = make_rope_table(ctx, c.max_position_embeddings, c.qk_rope_head_dim, c.rope_theta);
  set_precision(ctx, precision_);
}

Parameter* Model::param(int64_t layer, ParamRole role) const {
  const auto it = by_role_.find({layer, role});
  OCTET_CHECK(it != by_role_.end(), "model: layer ", layer, " has no parameter of role ",
              static_cast<int>(role));
  return it->second;
}

void Model::build_layer(DecoderLayer& l, int64_t index) {
  const ModelConfig& c = config_;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  auto param = [&](ParamRole role) { return this->param(index, role); };
  auto linear = [&](LinearLayer& ll, GemmSite site, ParamRole role) {
    ll.site = site;
    ll.param = param(role);
  };
  l.input_norm = {param(ParamRole::kInputNorm), eps};
  l.post_norm = {param(ParamRole::kPostNorm), eps};
  MlaLayer& a = l.attn;
  a.heads = c.num_attention_heads;
  a.nope = c.qk_nope_head_dim;
  a.rope = c.qk_rope_head_dim;
  a.v_dim = c.v_head_dim;
  a.kv_lora = c.kv_lora_rank;
  a.has_q_lora = c.q_lora_rank.has_value();
  a.deterministic = c.deterministic_attention;
  a.recompute_k = c.attention_recompute_k;
  a.backward_workspace_cap = c.attention_workspace_mib < 0
                                 ? std::numeric_limits<int64_t>::max()
                                 : c.attention_workspace_mib * (int64_t{1} << 20);
  a.pairing = c.rope_interleave ? RopePairing::kInterleave : RopePairing::kHalf;
  if (a.has_q_lora) {
    linear(a.q_a, GemmSite::kAttnQDown, ParamRole::kQAProj);
    a.q_a_norm = {param(ParamRole::kQANorm), eps};
    linear(a.q_b, GemmSite::kAttnQUp, ParamRole::kQBProj);
  } else {
    linear(a.q, GemmSite::kAttnQDown, ParamRole::kQProj);
  }
  linear(a.kv_a, GemmSite::kAttnKvDown, ParamRole::kKvAProj);
  a.kv_a_norm = {param(ParamRole::kKvANorm), eps};
  linear(a.kv_b, GemmSite::kAttnKvUp, ParamRole::kKvBProj);
  linear(a.o, GemmSite::kAttnOut, ParamRole::kOProj);
  if (!c.is_moe_layer(index)) {
    l.mlp.emplace();
    linear(l.mlp->gate_up, GemmSite::kDenseGateUp, ParamRole::kMlpGateUp);
    linear(l.mlp->down, GemmSite::kDenseDown, ParamRole::kMlpDown);
    return;
  }
  MoeLayer& m = l.moe.emplace();
  m.router.num_experts = c.n_routed_experts;
  m.router.top_k = c.num_experts_per_tok;
  m.router.n_group = c.n_group;
  m.router.topk_group = c.topk_group;
  m.router.norm = c.norm_topk_prob ? TopkNorm::kSumToOne : TopkNorm::kNone;
  m.router.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  m.router.validate();
  m.seq_aux_alpha = static_cast<float>(c.seq_aux_loss_alpha);
  m.gate = param(ParamRole::kRouterGate);
  m.bias = param(ParamRole::kRouterBias);
  m.gate_up.site = GemmSite::kExpertGateUp;
  m.gate_up.param = param(ParamRole::kExpertsGateUp);
  m.down.site = GemmSite::kExpertDown;
  m.down.param = param(ParamRole::kExpertsDown);
  m.gate_up.first_expert = m.down.first_expert = experts_.first;  // the recipe state's names
  m.ep = expert_group_.get();
  if (c.n_shared_experts > 0) {
    m.shared.emplace();
    linear(m.shared->gate_up, GemmSite::kSharedGateUp, ParamRole::kSharedGateUp);
    linear(m.shared->down, GemmSite::kSharedDown, ParamRole::kSharedDown);
  }
}

void Model::set_precision(Context& ctx, const Precision& p) {
  check_precision(ctx, p);
  precision_ = p;
  head_proj_.init_state(ctx, p.recipe);
  for (auto& l : layers_) l.init_state(ctx, p.recipe);
  for (auto& m : mtp_) {
    m.eh_proj.init_state(ctx, p.recipe);
    m.layer.init_state(ctx, p.recipe);
  }
}

std::vector<Parameter*> Model::parameters() {
  std::vector<Parameter*> out;
  for (auto& p : params_) out.push_back(p.get());
  return out;
}

Parameter& Model::parameter(const std::string& name) {
  auto it = by_name_.find(name);
  OCTET_CHECK(it != by_name_.end(), "model: no parameter '", name, "'");
  return *it->second;
}

void Model::load(Context& ctx, const io::NamedTensors& tensors, const io::NamedTensors* fallback) {
  Context host = make_context(Device::kCpu);
  std::map<std::string, const Tensor*> given;
  for (const auto& [n, t] : tensors) given[n] = &t;
  if (fallback != nullptr)
    for (const auto& [n, t] : *fallback) given.emplace(n, &t);
  for (const auto& [name, slot] : slots_) {
    auto it = given.find(name);
    OCTET_CHECK(it != given.end(), "model: checkpoint tensor '", name, "' is missing");
    const Tensor& t = *it->second;
    OCTET_CHECK(t.numel() == slot.numel, "model: checkpoint tensor '", name, "' has ", t.numel(),
                " elements, expected ", slot.numel);
    int64_t at = slot.offset;
    if (const auto sh = shard_base_.find(slot.param); sh != shard_base_.end()) {
      at -= sh->second;  // sharded experts: this rank takes its own
      if (at < 0 || at >= slot.param->value.numel()) continue;
    }
    const Tensor f = t.dtype() == DType::kF32 ? t : cast(host, t, DType::kF32);
    auto* dst = slot.param->value.data_as<float>() + at;
    ctx.be().copy(dst, f.data(), f.nbytes(), to_device_kind(ctx));
  }
}

io::NamedTensors Model::export_tensors(Context& ctx) const {
  OCTET_CHECK(shard_base_.empty(),
              "model: export_tensors needs every routed expert, but this rank holds ",
              experts_.count, " of ", config_.n_routed_experts,
              " (expert parallelism); each rank writes its own to a checkpoint "
              "(train/checkpoint_plan.h)");
  io::NamedTensors out;
  const CopyKind kind =
      ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kDeviceToHost;
  for (const TensorSpec& s : expected_tensors(config_)) {
    const std::string& source = s.copy_of.empty() ? s.name : s.copy_of;
    const Slot slot = slots_.count(source) ? slots_.at(source)
                                           : Slot{by_name_.at(source), 0, shape_numel(s.shape)};
    Tensor t = Tensor::empty(s.shape, DType::kF32);
    ctx.be().copy(t.data(), slot.param->value.data_as<const float>() + slot.offset, t.nbytes(),
                  kind);
    out.emplace_back(s.name, t);
  }
  return out;
}

float* Model::held_elements(const std::string& name) {
  const auto it = slots_.find(name);
  OCTET_CHECK(it != slots_.end(), "model: no parameter holds checkpoint tensor '", name, "'");
  const Slot& s = it->second;
  int64_t at = s.offset;
  if (const auto sh = shard_base_.find(s.param); sh != shard_base_.end()) {
    at -= sh->second;  // sharded experts: into this rank's part
    if (at < 0 || at >= s.param->value.numel()) return nullptr;
  }
  return s.param->value.data_as<float>() + at;
}

std::vector<Parameter*> Model::expert_parameters() {
  std::vector<Parameter*> out;
  std::set<const Parameter*> experts;
  for (const auto& [key, p] : by_role_)
    if (key.second == ParamRole::kExpertsGateUp || key.second == ParamRole::kExpertsDown)
      experts.insert(p);
  for (auto& p : params_)
    if (experts.count(p.get())) out.push_back(p.get());
  return out;
}

std::vector<Parameter*> Model::first_writer_parameters() {
  std::set<const Parameter*> linear;
  visit_linears([&](LinearLayer& l) { linear.insert(l.param); },
                [&](GroupedLinearLayer& g) { linear.insert(g.param); });
  linear.erase(embed_);
  std::vector<Parameter*> out;
  for (auto& p : params_)
    if (linear.count(p.get())) out.push_back(p.get());
  return out;
}

void Model::prepare(Context& ctx, PrepareScope scope) {
  const Precision& p = precision_;
  head_proj_.prepare(ctx, p, scope);
  for (auto& l : layers_) l.prepare(ctx, p, scope);
  for (auto& m : mtp_) {
    m.eh_proj.prepare(ctx, p, scope);
    m.layer.prepare(ctx, p, scope);
  }
}

void Model::visit_linears(const std::function<void(LinearLayer&)>& linear,
                          const std::function<void(GroupedLinearLayer&)>& grouped) {
  auto layer = [&](DecoderLayer& l) {
    for (LinearLayer* x :
         {&l.attn.q_a, &l.attn.q_b, &l.attn.q, &l.attn.kv_a, &l.attn.kv_b, &l.attn.o})
      if (x->param != nullptr) linear(*x);
    if (l.mlp) {
      linear(l.mlp->gate_up);
      linear(l.mlp->down);
    }
    if (l.moe) {
      grouped(l.moe->gate_up);
      grouped(l.moe->down);
      if (l.moe->shared) {
        linear(l.moe->shared->gate_up);
        linear(l.moe->shared->down);
      }
    }
  };
  linear(head_proj_);
  for (auto& l : layers_) layer(l);
  for (auto& m : mtp_) {
    linear(m.eh_proj);
    layer(m.layer);
  }
}

std::vector<WeightOutput> Model::weight_outputs(OutputCopies copies) {
  std::vector<WeightOutput> out;
  std::set<const Parameter*> taken;
  auto add = [&](auto& layer) {
    WeightOutput w;
    layer.fused = false;
    if (layer.param == nullptr || taken.count(layer.param) || !layer.weight_output(w) ||
        (copies == OutputCopies::kBf16Only && w.fp8.data.data() != nullptr))
      return;
    taken.insert(layer.param);
    layer.fused = true;
    out.push_back(w);
  };
  visit_linears([&](LinearLayer& l) { add(l); }, [&](GroupedLinearLayer& g) { add(g); });
  return out;
}

void Model::zero_grad(Context& ctx) {
  std::vector<MemsetRange> grads;
  for (auto& p : params_) grads.push_back({p->grad.data(), p->grad.nbytes()});
  ctx.be().memset_ranges(grads, 0);
}

Tensor Model::device_scalar(Context& ctx, float v) {
  auto it = scalars_.find(v);
  if (it != scalars_.end()) return it->second;
  Tensor t = Tensor::empty(ctx, {1}, DType::kF32);
  ctx.be().copy(t.data(), &v, sizeof v, to_device_kind(ctx));
  scalars_[v] = t;
  return t;
}

Tensor Model::upload(Context& ctx, const Tensor& t) const {
  OCTET_CHECK(t.dtype() == DType::kI32 && (t.device() == Device::kCpu || t.device() == ctx.device),
              "model batch: expected int32 tokens on the host or the model's device, got ",
              dtype_name(t.dtype()), " on ", device_name(t.device()));
  return t.device() == ctx.device ? t : t.to(ctx, ctx.device);
}

Tensor Model::constant_tokens(Context& ctx, int32_t value, int64_t B, int64_t T) {
  const auto key = std::make_tuple(value, B, T);
  auto it = token_constants_.find(key);
  if (it != token_constants_.end()) return it->second;
  Tensor h = Tensor::empty({B, T}, DType::kI32);
  for (int64_t i = 0; i < B * T; ++i) h.data_as<int32_t>()[i] = value;
  return token_constants_[key] = h.to(ctx, ctx.device);
}

// out[b, t] = src[b, t + shift] for t + shift < T, else fill: the tokens `shift` ahead, built on the
// device from the batch already there (two strided copies, no host work per step).
Tensor Model::shifted_tokens(Context& ctx, const Tensor& src, int64_t shift, int32_t fill) {
  const int64_t B = src.size(0), T = src.size(1), row = T * 4;
  Tensor out = Tensor::empty(ctx, {B, T}, DType::kI32);
  const int64_t kept = std::max<int64_t>(T - shift, 0);
  auto* o = static_cast<char*>(out.data());
  if (kept > 0)
    ctx.be().copy_2d(o, row, static_cast<const char*>(src.data()) + shift * 4, row, kept * 4, B);
  if (kept < T)
    ctx.be().copy_2d(o + kept * 4, row, constant_tokens(ctx, fill, B, T).data(), row,
                     (T - kept) * 4, B);
  return out;
}

ModelLosses Model::step(Context& ctx, const ModelBatch& batch, Pass pass, float grad_scale) {
  const ModelConfig& c = config_;
  const Precision& p = precision_;
  OCTET_CHECK(batch.inputs.rank() == 2 && batch.targets.shape() == batch.inputs.shape(),
              "model batch: inputs and targets must both be (B, T), got ",
              shape_str(batch.inputs.shape()), " and ", shape_str(batch.targets.shape()));
  const int64_t B = batch.inputs.size(0), T = batch.inputs.size(1), N = B * T, D = c.hidden_size,
                K = c.num_nextn_predict_layers;
  OCTET_CHECK(T <= c.max_position_embeddings, "model batch: sequence length ", T,
              " exceeds max_position_embeddings ", c.max_position_embeddings);
  if (batch.inputs.device() == Device::kCpu) {  // a device batch was checked by its maker
    const int32_t* in = batch.inputs.data_as<const int32_t>();
    for (int64_t i = 0; i < N; ++i)
      OCTET_CHECK(in[i] >= 0 && in[i] < c.vocab_size, "model batch: token ", in[i], " at ", i,
                  " is outside the vocabulary [0, ", c.vocab_size, ")");
  }
  const bool grad = pass == Pass::kForwardBackward;
  for (MoeLayer* m : moe_layers_) m->aux_grad_scale = grad_scale;

  auto embed = [&](const Tensor& ids) {
    Tensor h = Tensor::empty(ctx, {N, D}, p.act);
    embedding_forward(ctx, {.ids = ids, .table = embed_->value, .out = h});
    return h;
  };
  const Tensor ids = upload(ctx, batch.inputs), targets = upload(ctx, batch.targets);
  Tensor h = embed(ids);
  std::vector<DecoderLayer::Saved> saved(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l)
    h = layers_[l].forward(ctx, p, rope_, h, B, T, saved[l]);

  // MTP depth k reads the tokens k ahead and predicts the targets k ahead; positions past the end
  // of the sequence have no target.
  ModelLosses out;
  std::vector<MtpModule::Saved> mtp_saved(static_cast<size_t>(K));
  std::vector<Tensor> mtp_ids(static_cast<size_t>(K)), mtp_dh(static_cast<size_t>(K));
  const Tensor d_mtp = device_scalar(ctx, grad_scale * static_cast<float>(c.mtp_loss_weight) /
                                              static_cast<float>(std::max<int64_t>(K, 1)));
  Tensor h_prev = h;
  for (int64_t k = 0; k < K; ++k) {
    mtp_ids[k] = shifted_tokens(ctx, ids, k + 1, 0);
    const Tensor tgt_k = shifted_tokens(ctx, targets, k + 1, kIgnoreIndex);
    h_prev = mtp_[k].forward(ctx, p, rope_, embed(mtp_ids[k]), h_prev, B, T, mtp_saved[k]);
    const OutputHead::Result r = mtp_[k].head.run(ctx, p, h_prev, tgt_k, grad ? &d_mtp : nullptr);
    out.mtp.push_back(r.loss);
    mtp_dh[k] = r.dx;
  }
  const Tensor d_main = device_scalar(ctx, grad_scale);
  const OutputHead::Result main = head_.run(ctx, p, h, targets, grad ? &d_main : nullptr);
  out.main = main.loss;
  if (grad) layer_grads_ready(-1);
  for (size_t l = 0; l < layers_.size(); ++l)
    if (layers_[l].moe) collect_moe(saved[l].moe, out);
  for (int64_t k = 0; k < K; ++k)
    if (mtp_[k].layer.moe) collect_moe(mtp_saved[k].layer.moe, out);
  if (!grad) return out;

  // Backward: MTP depths last to first (each feeds the previous depth's hidden state), then the
  // main layers.
  Tensor carry;  // d h'_{k-1} from depth k
  for (int64_t k = K - 1; k >= 0; --k) {
    Tensor dh = mtp_dh[k];
    if (carry.defined() && carry.numel() > 0) add_into(ctx, dh, carry);
    const MtpModule::Grads g = mtp_[k].backward(ctx, p, rope_, dh, mtp_saved[k]);
    mtp_saved[k] = MtpModule::Saved{};
    embedding_backward(
        ctx,
        {.ids = mtp_ids[k], .dout = g.d_emb, .dtable = embed_->grad});  // += (shared embedding)
    carry = g.d_h_prev;
    if (grad) layer_grads_ready(c.num_hidden_layers + k);
  }
  Tensor dh = main.dx;
  if (K > 0) add_into(ctx, dh, carry);
  for (size_t l = layers_.size(); l-- > 0;) {
    dh = layers_[l].backward(ctx, p, rope_, dh, saved[l]);
    saved[l] = DecoderLayer::Saved{};  // this layer's activations: not read again
    layer_grads_ready(static_cast<int64_t>(l));
  }
  embedding_backward(ctx, {.ids = ids, .dout = dh, .dtable = embed_->grad});  // +=
  // A gradient left for its first writer that no backward wrote this pass holds no gradient of
  // it: zeroed (every Linear runs its backward on every pass, so this is a guard).
  for (auto& p : params_)
    if (std::exchange(p->grad_fresh, false)) ctx.be().memset(p->grad.data(), 0, p->grad.nbytes());
  if (grad_ready_) grad_ready_({embed_});
  return out;
}

void Model::layer_grads_ready(int64_t layer) const {
  if (!grad_ready_) return;
  std::vector<Parameter*> ps;
  for (auto it = by_role_.lower_bound({layer, ParamRole{}});
       it != by_role_.end() && it->first.first == layer; ++it)
    if (it->second != embed_ && std::find(ps.begin(), ps.end(), it->second) == ps.end())
      ps.push_back(it->second);
  if (!ps.empty()) grad_ready_(ps);
}

LossValues Model::read_losses(Context& ctx, const ModelLosses& l) const {
  auto value = [&](const Tensor& t) {
    const Tensor h = t.device() == Device::kCpu ? t : t.to_host(ctx);
    return static_cast<double>(h.data_as<const float>()[0]);
  };
  LossValues v;
  v.main = value(l.main);
  double mtp_sum = 0;
  for (const Tensor& t : l.mtp) {
    v.mtp.push_back(value(t));
    mtp_sum += v.mtp.back();
  }
  for (const Tensor& t : l.aux) v.aux += value(t);
  const double k = static_cast<double>(std::max<size_t>(l.mtp.size(), 1));
  v.total = v.main + config_.mtp_loss_weight * mtp_sum / k + v.aux;
  return v;
}

void Model::update_router_bias(Context& ctx, const std::vector<ModelLosses>& micro_batches,
                               float rate) {
  if (micro_batches.empty()) return;
  for (size_t m = 0; m < moe_layers_.size(); ++m) {
    Tensor counts = micro_batches[0].expert_load.at(m);
    if (micro_batches.size() > 1) {  // sum the micro-batches' loads on the host
      Tensor sum = Tensor::empty(counts.shape(), DType::kI32);
      std::memset(sum.data(), 0, sum.nbytes());
      for (const ModelLosses& l : micro_batches) {
        const Tensor h = l.expert_load.at(m).to_host(ctx);
        for (int64_t e = 0; e < sum.numel(); ++e)
          sum.data_as<int32_t>()[e] += h.data_as<const int32_t>()[e];
      }
      counts = sum.to(ctx, ctx.device);
    }
    moe_router_bias_update(ctx,
                           {.bias = moe_layers_[m]->bias->value, .counts = counts, .rate = rate});
  }
}

std::vector<std::string> load_checkpoint_into(Context& ctx, Model& model,
                                              const LoadedCheckpoint& checkpoint, uint64_t seed) {
  OCTET_CHECK(checkpoint.quantized.empty(),
              "model: read the checkpoint with Fp8Weights::kDequantize to load it for training");
  std::vector<std::string> notes = checkpoint.warnings;
  if (checkpoint.missing_mtp.empty()) {
    model.load(ctx, checkpoint.tensors);
    return notes;
  }
  const io::NamedTensors fresh = init_parameters(model.config(), seed);
  model.load(ctx, checkpoint.tensors, &fresh);
  notes.push_back("initialised " + std::to_string(checkpoint.missing_mtp.size()) +
                  " missing MTP tensors with seed " + std::to_string(seed));
  return notes;
}

std::vector<LinearLayer*> Model::delayed_linears() {
  std::vector<LinearLayer*> out;
  auto add_layer = [&](DecoderLayer& l) {
    for (LinearLayer* x :
         {&l.attn.q_a, &l.attn.q_b, &l.attn.q, &l.attn.kv_a, &l.attn.kv_b, &l.attn.o})
      out.push_back(x);
    if (l.mlp) out.insert(out.end(), {&l.mlp->gate_up, &l.mlp->down});
    if (l.moe) {
      for (GroupedLinearLayer* g : {&l.moe->gate_up, &l.moe->down})
        for (LinearLayer& x : g->per_expert()) out.push_back(&x);
      if (l.moe->shared) out.insert(out.end(), {&l.moe->shared->gate_up, &l.moe->shared->down});
    }
  };
  out.push_back(&head_proj_);
  for (auto& l : layers_) add_layer(l);
  for (auto& m : mtp_) {
    out.push_back(&m.eh_proj);
    add_layer(m.layer);
  }
  std::vector<LinearLayer*> delayed;
  for (LinearLayer* l : out)
    if (l->param != nullptr && l->state.x.amax_history.defined() &&
        l->state.x.amax_history.numel() > 0 && l->state.x.amax_history.data() != nullptr)
      delayed.push_back(l);
  return delayed;
}

void Model::set_expert_amax_group(const std::shared_ptr<Comm>& group) {
  OCTET_CHECK(!group || expert_group_, "model: an expert amax group without sharded experts");
  for (MoeLayer* m : moe_layers_) m->gate_up.amax_group = m->down.amax_group = group;
}

std::set<const LinearLayer*> Model::sharded_expert_linears() {
  std::set<const LinearLayer*> out;
  if (!expert_group_) return out;
  for (MoeLayer* m : moe_layers_)
    for (GroupedLinearLayer* g : {&m->gate_up, &m->down})
      for (const LinearLayer& l : g->per_expert()) out.insert(&l);
  return out;
}

io::NamedTensors Model::recipe_state(Context& ctx) {
  io::NamedTensors out, mine;  // mine: this rank's sharded experts' (gathered below)
  const std::set<const LinearLayer*> sharded = sharded_expert_linears();
  for (LinearLayer* l : delayed_linears()) {
    io::NamedTensors& to = sharded.count(l) ? mine : out;
    const std::string n = l->param->name;
    const std::pair<const char*, DelayedScaling*> parts[] = {
        {"x", &l->state.x}, {"w", &l->state.w}, {"dy", &l->state.dy}};
    for (const auto& [tag, ds] : parts) {
      to.emplace_back(n + "." + tag + ".amax_history", ds->amax_history.to_host(ctx));
      to.emplace_back(n + "." + tag + ".scale", ds->scale.to_host(ctx));
      to.emplace_back(n + "." + tag + ".scale_inv", ds->scale_inv.to_host(ctx));
    }
    Tensor steps = Tensor::empty({3}, DType::kI64);
    steps.data_as<int64_t>()[0] = l->state.x_steps;
    steps.data_as<int64_t>()[1] = l->state.w_steps;
    steps.data_as<int64_t>()[2] = l->state.dy_steps;
    to.emplace_back(n + ".steps", steps);
  }
  if (!mine.empty()) gather_expert_states(ctx, mine, out);
  return out;
}

// Every expert group rank's experts' states after the rest, in rank order: each rank's tensors
// have the same shapes and order (the same layers and expert counts), named by expert index, so
// rank r's are this rank's bytes' layout with the index moved by r's first expert minus ours.
void Model::gather_expert_states(Context& ctx, const io::NamedTensors& mine,
                                 io::NamedTensors& out) {
  int64_t bytes = 0;
  for (const auto& [n, t] : mine) bytes += t.nbytes();
  Tensor host = Tensor::empty({bytes}, DType::kU8);
  int64_t at = 0;
  for (const auto& [n, t] : mine) {
    std::memcpy(host.data_as<uint8_t>() + at, t.data(), static_cast<size_t>(t.nbytes()));
    at += t.nbytes();
  }
  const int P = expert_group_->size();
  const Tensor send = host.to(ctx, ctx.device);
  Tensor recv = Tensor::empty(ctx, {P * bytes}, DType::kU8);
  expert_group_->all_gather(ctx, send.data(), recv.data(), bytes, DType::kU8);
  const Tensor all = recv.to_host(ctx);
  for (int r = 0; r < P; ++r) {
    const int64_t shift = expert_slice(config_.n_routed_experts, r, P).first - experts_.first;
    at = r * bytes;
    for (const auto& [n, t] : mine) {
      const size_t open = n.find('['), close = n.find(']', open);
      const int64_t e = std::stoll(n.substr(open + 1, close - open - 1)) + shift;
      Tensor c = Tensor::empty(t.shape(), t.dtype());
      std::memcpy(c.data(), all.data_as<const uint8_t>() + at, static_cast<size_t>(c.nbytes()));
      at += c.nbytes();
      out.emplace_back(n.substr(0, open + 1) + std::to_string(e) + n.substr(close), c);
    }
  }
}

void Model::load_recipe_state(Context& ctx, const io::NamedTensors& state) {
  std::map<std::string, const Tensor*> by;
  for (const auto& [n, t] : state) by[n] = &t;
  auto get = [&](const std::string& n, const Tensor& like) -> const Tensor& {
    auto it = by.find(n);
    OCTET_CHECK(it != by.end(), "recipe state: tensor '", n, "' is missing");
    OCTET_CHECK(it->second->shape() == like.shape() && it->second->dtype() == like.dtype(),
                "recipe state: tensor '", n, "' has shape ", shape_str(it->second->shape()),
                ", expected ", shape_str(like.shape()));
    return *it->second;
  };
  const std::vector<LinearLayer*> linears = delayed_linears();
  size_t used = 0;
  // Sharded experts: the other ranks' experts' states are theirs (named by expert index).
  if (expert_group_ && !linears.empty())
    for (MoeLayer* m : moe_layers_)
      for (const GroupedLinearLayer* g : {&m->gate_up, &m->down})
        for (const auto& [n, t] : state) {
          const std::string prefix = g->param->name + "[";
          if (n.rfind(prefix, 0) != 0) continue;
          const int64_t e = std::stoll(n.substr(prefix.size()));
          used += e < experts_.first || e >= experts_.first + experts_.count ? 1 : 0;
        }
  for (LinearLayer* l : linears) {
    const std::string n = l->param->name;
    const std::pair<const char*, DelayedScaling*> parts[] = {
        {"x", &l->state.x}, {"w", &l->state.w}, {"dy", &l->state.dy}};
    for (const auto& [tag, ds] : parts) {
      for (Tensor* t : {&ds->amax_history, &ds->scale, &ds->scale_inv}) {
        const char* field = t == &ds->amax_history ? "amax_history"
                            : t == &ds->scale      ? "scale"
                                                   : "scale_inv";
        const Tensor& src = get(n + "." + tag + "." + field, t->to_host(ctx));
        ctx.be().copy(t->data(), src.data(), src.nbytes(), to_device_kind(ctx));
        ++used;
      }
    }
    const Tensor& steps = get(n + ".steps", Tensor::empty({3}, DType::kI64));
    l->state.x_steps = steps.data_as<const int64_t>()[0];
    l->state.w_steps = steps.data_as<const int64_t>()[1];
    l->state.dy_steps = steps.data_as<const int64_t>()[2];
    ++used;
  }
  OCTET_CHECK(used == state.size(), "recipe state: ", state.size() - used,
              " tensors do not belong to this model's recipe (", precision_.recipe.name(), ")");
}

}  // namespace octet
