// The table of TrainConfig's keys (train_config_keys.h).
#include "train/train_config_keys.h"

#include <nlohmann/json.hpp>
#include <type_traits>
#include <utility>

#include "core/check.h"
#include "model/config.h"

namespace octet::train {
namespace {

using StringList = ConfigStrings;
using Value = ConfigValue;
using Type = ConfigType;
using Key = ConfigKey;

template <typename T>
constexpr Type type_of() {
  if constexpr (std::is_same_v<T, bool>) return Type::kBool;
  if constexpr (std::is_same_v<T, int64_t>) return Type::kInt;
  if constexpr (std::is_same_v<T, double>) return Type::kFloat;
  if constexpr (std::is_same_v<T, std::string>) return Type::kString;
  return Type::kStringList;
}

// A reference to one field of the config: a member (&C::steps) or a member of a member
// (&C::optim, &OptimConfig::lr).
template <typename T>
using Ref = std::function<T&(TrainConfig&)>;

template <typename T>
Ref<T> at(T TrainConfig::*m) {
  return [m](TrainConfig& c) -> T& { return c.*m; };
}
template <typename S, typename T>
Ref<T> at(S TrainConfig::*s, T S::*m) {
  return [s, m](TrainConfig& c) -> T& { return (c.*s).*m; };
}

// Reading goes through the same reference, const-cast: the getter never writes.
template <typename T>
Key field(std::string name, const char* doc, Ref<T> ref) {
  return {std::move(name),
          type_of<T>(),
          doc,
          {},
          [ref](const TrainConfig& c) { return Value(ref(const_cast<TrainConfig&>(c))); },
          [ref](TrainConfig& c, const Value& v) { ref(c) = std::get<T>(v); }};
}

// An enum read and written by name; to_value() has checked the name against `choices`.
template <typename E>
Key enum_field(std::string name, const char* doc, Ref<E> ref,
               std::vector<std::pair<std::string, E>> map) {
  StringList names;
  for (const auto& [n, e] : map) names.push_back(n);
  auto get = [ref, map](const TrainConfig& c) {
    for (const auto& [n, e] : map)
      if (e == ref(const_cast<TrainConfig&>(c))) return Value(n);
    return Value(std::string("?"));
  };
  auto set = [ref, map](TrainConfig& c, const Value& v) {
    for (const auto& [n, e] : map)
      if (n == std::get<std::string>(v)) ref(c) = e;
  };
  return {std::move(name), Type::kString, doc, names, get, set};
}

using Getter = std::function<Value(const TrainConfig&)>;
using Setter = std::function<void(TrainConfig&, const Value&)>;

Key custom(std::string name, Type type, const char* doc, Getter get, Setter set) {
  return {std::move(name), type, doc, {}, std::move(get), std::move(set)};
}

// The model's sections, after model.config: DeepseekV3Config's names.
void add_model_keys(std::vector<Key>& k) {
  using C = TrainConfig;
  using M = ModelConfig;
  auto add = [&](const char* name, const char* doc, auto M::*m) {
    k.push_back(field(std::string("model.") + name, doc, at(&C::model, m)));
  };
  add("vocab_size", "257 for the byte tokenizer", &M::vocab_size);
  add("hidden_size", "", &M::hidden_size);
  add("intermediate_size", "dense MLP", &M::intermediate_size);
  add("moe_intermediate_size", "each expert", &M::moe_intermediate_size);
  add("num_hidden_layers", "", &M::num_hidden_layers);
  add("first_k_dense_replace", "dense layers before the MoE ones", &M::first_k_dense_replace);
  add("num_attention_heads", "", &M::num_attention_heads);
  add("max_position_embeddings", "", &M::max_position_embeddings);
  k.push_back(custom(
      "model.q_lora_rank", Type::kInt, "0: a plain q_proj",
      [](const C& c) { return Value(c.model.q_lora_rank.value_or(0)); },
      [](C& c, const Value& v) {
        const int64_t r = std::get<int64_t>(v);
        c.model.q_lora_rank = r == 0 ? std::nullopt : std::optional<int64_t>(r);
      }));
  add("kv_lora_rank", "", &M::kv_lora_rank);
  add("qk_nope_head_dim", "", &M::qk_nope_head_dim);
  add("qk_rope_head_dim", "", &M::qk_rope_head_dim);
  add("v_head_dim", "", &M::v_head_dim);
  add("rope_theta", "", &M::rope_theta);
  add("rope_interleave", "", &M::rope_interleave);
  add("n_routed_experts", "", &M::n_routed_experts);
  add("n_shared_experts", "", &M::n_shared_experts);
  add("num_experts_per_tok", "top-k", &M::num_experts_per_tok);
  add("n_group", "expert groups; divides n_routed_experts", &M::n_group);
  add("topk_group", "groups a token may route to", &M::topk_group);
  add("routed_scaling_factor", "", &M::routed_scaling_factor);
  add("norm_topk_prob", "", &M::norm_topk_prob);
  add("rms_norm_eps", "", &M::rms_norm_eps);
  add("tie_word_embeddings", "", &M::tie_word_embeddings);
  add("initializer_range", "", &M::initializer_range);
  add("num_nextn_predict_layers", "Multi-Token Prediction depth", &M::num_nextn_predict_layers);
  add("mtp_loss_weight", "lambda of the MTP loss", &M::mtp_loss_weight);
  add("bias_update_rate", "gamma of the aux-loss-free balancing", &M::bias_update_rate);
  add("seq_aux_loss_alpha", "sequence-wise balance loss; 0: off", &M::seq_aux_loss_alpha);
  add("head_chunk_tokens", "tokens per output-head chunk; 0: automatic", &M::head_chunk_tokens);
  add("moe_recompute", "MoE backward recomputes SwiGLU + down", &M::moe_recompute);
  add("attention_recompute_k", "MLA backward rebuilds k from kv instead of keeping it",
      &M::attention_recompute_k);
  add("deterministic_attention", "cuDNN's deterministic attention backward; false: atomics",
      &M::deterministic_attention);
  add("attention_workspace_mib",
      "cap of the attention backward's cuDNN workspace in MiB; 0: default, -1: unchunked",
      &M::attention_workspace_mib);
  // Keys of a config.json that octet keeps but does not use (architectures, bos_token_id, ...),
  // carried so that the checkpoint's config.json keeps them; written only when there are any.
  k.push_back(custom(
      "model.extra", Type::kString, "other config.json keys, as JSON",
      [](const C& c) { return Value(c.model.extra.empty() ? "" : c.model.extra.dump()); },
      [](C& c, const Value& v) {
        const std::string& s = std::get<std::string>(v);
        const auto j =
            s.empty() ? nlohmann::json::object() : nlohmann::json::parse(s, nullptr, false);
        OCTET_CHECK(j.is_object(), "must be a JSON object, got '", s, "'");
        c.model.extra = j;
      }));
}

std::vector<Key> make_keys() {
  using C = TrainConfig;
  using O = OptimConfig;
  std::vector<Key> k;
  k.push_back(field("run_dir", "checkpoints, metrics and config.toml go here", at(&C::run_dir)));
  k.push_back(field("steps", "optimizer steps", at(&C::steps)));
  k.push_back(field("checkpoint_every", "steps between checkpoints; 0: only at the end; -1: never",
                    at(&C::checkpoint_every)));
  k.push_back(field("keep_checkpoints", "most recent checkpoints kept; 0 keeps all",
                    at(&C::keep_checkpoints)));
  k.push_back(field("seed", "initialisation and data order", at(&C::seed)));
  // Read before every other key (parse_train_config): it sets the model, which later keys adjust;
  // the run's recipe stays what the config says.
  k.push_back(custom(
      "init_from", Type::kString, "checkpoint to start from (step 0, fresh optimizer); \"\": none",
      [](const C& c) { return Value(c.init_from); },
      [](C& c, const Value& v) {
        c.init_from = std::get<std::string>(v);
        if (c.init_from.empty()) return;
        const RecipeSpec recipe = c.model.recipe;
        c.model = read_model_config(init_checkpoint_dir(c.init_from) + "/config.json");
        c.model.recipe = recipe;
      }));
  // The model's recipe (config.json's octet_recipe and octet_recipe_overrides), stored there once.
  k.push_back(field("recipe", "bf16, fp8-tensor-delayed, fp8-tensor-current, deepseek or fp8-flow",
                    Ref<std::string>([](C& c) -> std::string& { return c.model.recipe.preset; })));
  k.push_back(field("recipe_overrides", "per-site overrides, e.g. \"gemm.attn.out=bf16\"",
                    Ref<StringList>([](C& c) -> StringList& { return c.model.recipe.overrides; })));
  k.push_back(enum_field(
      "device", "auto: cuda when a GPU is visible", at(&C::device),
      {{"auto", DeviceChoice::kAuto}, {"cpu", DeviceChoice::kCpu}, {"cuda", DeviceChoice::kCuda}}));
  k.push_back(field("batch_size", "sequences per micro-batch", at(&C::batch_size)));
  k.push_back(field("seq_len", "tokens per sequence", at(&C::seq_len)));
  k.push_back(field("grad_accum", "micro-batches per optimizer step", at(&C::grad_accum)));
  k.push_back(field("log_every", "steps between metric lines", at(&C::log_every)));
  k.push_back(field("sites_every", "steps between per-site numerics records; 0: never",
                    at(&C::sites_every)));
  k.push_back(field("cuda_graphs",
                    "capture the step as CUDA graphs and replay them (CUDA, one process; same "
                    "results as eager)",
                    at(&C::cuda_graphs)));

  k.push_back(field("optim.lr", "peak learning rate", at(&C::optim, &O::lr)));
  k.push_back(field("optim.min_lr", "end of the cosine decay", at(&C::optim, &O::min_lr)));
  k.push_back(field("optim.warmup_steps", "linear warmup", at(&C::optim, &O::warmup_steps)));
  k.push_back(field("optim.warmup_init", "first warmup rate, as a fraction of lr",
                    at(&C::optim, &O::warmup_init)));
  k.push_back(field("optim.weight_decay", "decoupled (AdamW); not on norms and biases",
                    at(&C::optim, &O::weight_decay)));
  k.push_back(field("optim.beta1", "", at(&C::optim, &O::beta1)));
  k.push_back(field("optim.beta2", "", at(&C::optim, &O::beta2)));
  k.push_back(field("optim.eps", "", at(&C::optim, &O::eps)));
  k.push_back(field("optim.grad_clip", "max global gradient norm; 0: no clipping",
                    at(&C::optim, &O::grad_clip)));
  k.push_back(field("optim.fused_prepare",
                    "the AdamW pass writes the next step's GEMM weights (same bits as a separate "
                    "preparation pass)",
                    at(&C::optim, &O::fused_prepare)));
  k.push_back(
      field("optim.fused_prepare_fp8",
            "with fused_prepare, also the FP8 128x128 block weights (one pass; the same bits)",
            at(&C::optim, &O::fused_prepare_fp8)));
  k.push_back(field("optim.bucket_mb",
                    "several ranks: MiB of FP32 gradient per reduce-scatter bucket, sent during "
                    "the backward",
                    at(&C::optim, &O::bucket_mb)));
  k.push_back(
      enum_field("optim.schedule", "cosine or constant (after warmup)", at(&C::optim, &O::schedule),
                 {{"cosine", LrScheduleKind::kCosine}, {"constant", LrScheduleKind::kConstant}}));

  k.push_back(field("data.text", "UTF-8 text file; \"\" and no shards: built-in corpus",
                    at(&C::data, &DataConfig::text)));
  k.push_back(field("data.shards", "directory or glob of llm.c .bin token shards",
                    at(&C::data, &DataConfig::shards)));
  k.push_back(field("data.megatron", "Megatron-LM indexed dataset: path/prefix of .bin + .idx",
                    at(&C::data, &DataConfig::megatron)));
  k.push_back(field("data.val_fraction", "held out for evaluation",
                    at(&C::data, &DataConfig::val_fraction)));

  k.push_back(
      field("eval.every", "steps between evaluations; 0: never", at(&C::eval, &EvalConfig::every)));
  k.push_back(field("eval.batches", "batches per evaluation", at(&C::eval, &EvalConfig::batches)));

  k.push_back(field("safety.spike_window", "losses in the spike statistics; 0: off",
                    at(&C::safety, &SafetyConfig::spike_window)));
  k.push_back(field("safety.spike_threshold", "spike: loss > mean + threshold * std",
                    at(&C::safety, &SafetyConfig::spike_threshold)));
  k.push_back(enum_field("safety.spike_action",
                         "log, skip (the update) or rollback (to the last checkpoint)",
                         at(&C::safety, &SafetyConfig::spike_action),
                         {{"log", SpikeAction::kLog},
                          {"skip", SpikeAction::kSkip},
                          {"rollback", SpikeAction::kRollback}}));
  k.push_back(field("safety.shadow_bf16", "N: every Nth batch also in bf16; 0: off",
                    at(&C::safety, &SafetyConfig::shadow_bf16)));
  k.push_back(field("safety.max_skipped_in_a_row",
                    "stop as diverged after N skips in a row; 0: never",
                    at(&C::safety, &SafetyConfig::max_skipped_in_a_row)));

  k.push_back(field("parallel.ep",
                    "expert parallelism: ranks the routed experts are sharded over (divides the "
                    "world size and model.n_routed_experts); data parallel = world / ep",
                    at(&C::parallel, &ParallelConfig::ep)));

  // Read before the other model keys (parse_train_config), and never written: to_toml writes the
  // model inline.
  Key config = custom(
      "model.config", Type::kString, "config.json to start the model from",
      [](const C&) { return Value(std::string()); },
      [](C& c, const Value& v) {
        // The recipe is the trainer's keys', not the file's octet_recipe.
        const RecipeSpec recipe = c.model.recipe;
        c.model = read_model_config(std::get<std::string>(v));
        c.model.recipe = recipe;
      });
  config.emitted = false;
  k.push_back(config);
  add_model_keys(k);
  return k;
}

}  // namespace

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> k = make_keys();
  return k;
}

}  // namespace octet::train
