// The DeepSeek-V3-style model: token embedding, decoder layers (MLA + dense MLP or MoE), final
// norm and output head, and the Multi-Token Prediction modules; one forward + backward per
// micro-batch, in the precision a Recipe assigns per site (DESIGN.md section 1).
//
//   h_0   = Emb(inputs)                                   BF16 out of an FP32 table
//   h_l   = DecoderLayer_l(h_{l-1})                       l = 1..L (model/block.h)
//   loss  = CE(head(norm(h_L)), targets)                  model/head.h
//   MTP k = 1..K: h'_k = MtpModule_k(Emb(inputs shifted by k), h'_{k-1}), h'_0 = h_L;
//           loss_k = CE(shared_head(h'_k), targets shifted by k)      (model/mtp.h)
//   total = loss + mtp_loss_weight / K * sum_k loss_k + sum over MoE layers of the balance loss
//
// Backward runs the same pieces in reverse. The heads run their backward as soon as their loss is
// known (the logits never outlive their head), so one logits buffer exists at a time.
//
// Parameters are FP32 masters on the model's device (model/parameter.h has the fused names); the
// checkpoint form (model/checkpoint.h names, per-expert tensors, MTP copies of the shared embedding
// and head) is produced by export_tensors and read by load.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "io/safetensors.h"
#include "model/block.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/head.h"
#include "model/mtp.h"

namespace octet {

// On the host (uploaded and checked against the vocabulary by step()) or already on the model's
// device (used as they are: the caller checked them; what a replayed step graph reads).
struct ModelBatch {
  Tensor inputs;   // (B, T) i32: token ids in [0, vocab_size)
  Tensor targets;  // (B, T) i32: next tokens, or kIgnoreIndex (ops/cross_entropy)
};

// Device scalars of one micro-batch; read them with read_losses (one synchronisation).
struct ModelLosses {
  Tensor main;                      // (1) f32 mean cross-entropy of the main head
  std::vector<Tensor> mtp;          // (1) f32 per MTP depth
  std::vector<Tensor> aux;          // (1) f32 per MoE layer with a sequence-wise balance loss
  std::vector<Tensor> expert_load;  // (E) i32 per MoE layer (main layers, then MTP): tokens routed
};

struct LossValues {
  double total = 0, main = 0, aux = 0;
  std::vector<double> mtp;
};

enum class Pass : uint8_t { kForward, kForwardBackward };

class Model {
 public:
  // Parameters allocated (uninitialised) on ctx's device; see init / load. With an expert group
  // of W > 1 ranks (expert parallelism, model/moe_ep.h), this rank holds its E / W routed experts
  // only (E % W == 0, else an error): the experts' parameters are (E / W, Out, In), and load()
  // takes this rank's experts from the checkpoint's (the others may be absent or unread).
  Model(Context& ctx, const ModelConfig& config, const Precision& precision,
        std::shared_ptr<Comm> expert_group = nullptr);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const Precision& precision() const { return precision_; }
  // Switches the recipe (resets the delayed-scaling state); call prepare() afterwards.
  void set_precision(Context& ctx, const Precision& p);

  // Attaches a numerics probe to every Linear (null detaches it); see model/site_probe.h.
  void set_probe(SiteProbe* probe) { precision_.probe = probe; }

  std::vector<Parameter*> parameters();
  Parameter& parameter(const std::string& name);

  // Checkpoint-form tensors (expected_tensors names): fresh ones from model/init.h, or a
  // checkpoint's. Missing MTP tensors (a transformers checkpoint) keep the values from `fallback`.
  void load(Context& ctx, const io::NamedTensors& tensors,
            const io::NamedTensors* fallback = nullptr);
  // Host F32 tensors in expected_tensors order. Refused with sharded experts: no rank holds them
  // all (the checkpoint writer, train/checkpoint_plan.h, has each rank write its own).
  io::NamedTensors export_tensors(Context& ctx) const;
  // Where this rank holds checkpoint tensor `name` (an expected_tensors name that is no MTP copy):
  // its first F32 element in the parameter on the model's device, its elements contiguous; null
  // when it is a routed expert of another expert-parallel rank.
  float* held_elements(const std::string& name);
  // Expert parallelism's data group (the ranks holding this rank's experts): the routed experts'
  // delayed-scaling amaxes are reduced over it instead of ctx.comm (model/grouped_linear.h).
  void set_expert_amax_group(const std::shared_ptr<Comm>& group);
  // Whether the routed experts are sharded over an expert group of more than one rank.
  bool experts_sharded() const { return expert_group_ != nullptr; }
  // The routed experts' parameters (sharded over the expert group when experts_sharded()).
  std::vector<Parameter*> expert_parameters();
  // The parameters whose every gradient write goes through first_write (parameter.h): the Linear
  // layers' and the routed experts' weights, less the embedding (a tied head's weight), whose
  // backward scatters +=. The trainer's one-micro-batch steps leave them unzeroed
  // (Parameter::first_writer).
  std::vector<Parameter*> first_writer_parameters();

  // Once per optimizer step, after the weights changed: the GEMMs' copies of the weights. kNotFused
  // leaves out what the optimizer wrote (weight_outputs()).
  void prepare(Context& ctx, PrepareScope scope = PrepareScope::kAll);
  // After a full prepare(): where the optimizer can write the next step's prepared weights in its
  // update pass (a parameter at most once), marking those layers fused so that
  // prepare(kNotFused) skips them. Valid until the next full prepare().
  // With kBf16Only, only the BF16 copies (the FP8 block weights stay with prepare()).
  std::vector<WeightOutput> weight_outputs(OutputCopies copies = OutputCopies::kBf16AndFp8);
  void zero_grad(Context& ctx);

  // One micro-batch. kForwardBackward adds every gradient (+=), the loss scaled by grad_scale
  // (1 / gradient-accumulation steps).
  ModelLosses step(Context& ctx, const ModelBatch& batch, Pass pass, float grad_scale = 1.0f);
  LossValues read_losses(Context& ctx, const ModelLosses& l) const;

  // Called by a kForwardBackward step with the parameters whose gradients that micro-batch adds
  // nothing more to, in the order the backward finishes them (the same on every rank): the final
  // norm and head after the main head, each MTP module's after its backward (last to first), each
  // layer's after its backward, the embedding last. ZeroAdamW sends a gradient bucket from it.
  using GradReady = std::function<void(const std::vector<Parameter*>&)>;
  void set_grad_ready(GradReady fn) { grad_ready_ = std::move(fn); }

  // Auxiliary-loss-free balancing: each MoE layer's bias moves by `rate` toward balance, from the
  // loads of the step's micro-batches (summed).
  void update_router_bias(Context& ctx, const std::vector<ModelLosses>& micro_batches, float rate);

  // Delayed-scaling state of every Linear (amax histories, scales, recorded steps), named
  // "<parameter>.{x,w,dy}.{amax_history,scale,scale_inv}" and "<parameter>.steps" (i64 x 3), as
  // host tensors; empty for the other recipes. load_recipe_state restores it exactly.
  // With sharded experts it is collective over the expert group and holds every rank's experts
  // (each expert's state is named by its index in the whole model, "<parameter>[e]"), and
  // load_recipe_state takes this rank's experts' from such a set (of any grid).
  io::NamedTensors recipe_state(Context& ctx);
  void load_recipe_state(Context& ctx, const io::NamedTensors& state);

  int64_t moe_layer_count() const { return static_cast<int64_t>(moe_layers_.size()); }

  // The pieces, for the block-level tests and tools.
  DecoderLayer& layer(int64_t i) { return layers_.at(static_cast<size_t>(i)); }
  MtpModule& mtp(int64_t k) { return mtp_.at(static_cast<size_t>(k)); }
  const OutputHead& head() const { return head_; }
  const RopeTable& rope() const { return rope_; }

 private:
  Parameter* add(const std::string& name, const Shape& shape, WeightDecay decay,
                 Trainable trainable = Trainable::kYes);
  void build_layer(DecoderLayer& layer, int64_t index);
  Parameter* param(int64_t layer, ParamRole role) const;
  Tensor device_scalar(Context& ctx, float v);
  // Every Linear and grouped Linear of the model, in preparation order.
  void visit_linears(const std::function<void(LinearLayer&)>& linear,
                     const std::function<void(GroupedLinearLayer&)>& grouped);
  // Every Linear with its delayed-scaling state, named by its parameter.
  std::vector<LinearLayer*> delayed_linears();
  // The routed experts' per-expert Linears when the experts are sharded (else none).
  std::set<const LinearLayer*> sharded_expert_linears();
  // recipe_state's tail with sharded experts: `mine` gathered over the expert group into `out`.
  void gather_expert_states(Context& ctx, const io::NamedTensors& mine, io::NamedTensors& out);
  Tensor upload(Context& ctx, const Tensor& t) const;
  // MTP's inputs and targets k ahead, built on the device (model.cpp).
  Tensor shifted_tokens(Context& ctx, const Tensor& src, int64_t shift, int32_t fill);
  Tensor constant_tokens(Context& ctx, int32_t value, int64_t B, int64_t T);
  // grad_ready_ with the parameters of `layer` (-1: those outside the layers but the embedding).
  void layer_grads_ready(int64_t layer) const;

  ModelConfig config_;
  Precision precision_;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::map<std::string, Parameter*> by_name_;
  // (layer, role) -> parameter (module_tree.h; layer -1 outside the layers): how blocks find
  // their parameters.
  std::map<std::pair<int64_t, ParamRole>, Parameter*> by_role_;
  // Checkpoint tensor -> (parameter, first element): fused and stacked weights hold several.
  struct Slot {
    Parameter* param;
    int64_t offset;
    int64_t numel;
  };
  std::map<std::string, Slot> slots_;
  // Expert parallelism: the group (null on one rank, or a group of one), this rank's experts, and
  // the sharded parameters with their first element in the whole stacked tensor (Slot offsets of
  // theirs are into the whole tensor).
  std::shared_ptr<Comm> expert_group_;
  ExpertSlice experts_;
  std::map<const Parameter*, int64_t> shard_base_;

  Parameter* embed_ = nullptr;
  LinearLayer head_proj_;
  OutputHead head_;
  std::vector<DecoderLayer> layers_;
  std::vector<MtpModule> mtp_;
  std::vector<MoeLayer*> moe_layers_;
  RopeTable rope_;
  std::map<float, Tensor> scalars_;
  std::map<std::tuple<int32_t, int64_t, int64_t>, Tensor> token_constants_;  // (value, B, T)
  GradReady grad_ready_;
};

// Loads a checkpoint (read_checkpoint's result, F32 or dequantized) into the model. A
// checkpoint without MTP layers (as the transformers library saves) gets fresh MTP layers from
// init_parameters(seed); the returned lines (the checkpoint's warnings) are for the caller to
// print.
std::vector<std::string> load_checkpoint_into(Context& ctx, Model& model,
                                              const LoadedCheckpoint& checkpoint,
                                              uint64_t seed = 0);

}  // namespace octet
