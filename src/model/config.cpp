#include "model/config.h"

#include <fstream>
#include <set>
#include <sstream>

#include "core/check.h"
#include "io/atomic_file.h"

namespace octet {
namespace {

using Json = nlohmann::json;

// Reads one typed field if present; a wrong JSON type is an error naming the field.
class Reader {
 public:
  Reader(const Json& j, const std::string& source) : j_(j), source_(source) {}

  template <typename T>
  void get(const char* key, T& out) {
    seen_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return;
    out = as<T>(*it, key);
  }
  void get_optional(const char* key, std::optional<int64_t>& out) {
    seen_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end()) return;
    out = it->is_null() ? std::nullopt : std::optional<int64_t>(as<int64_t>(*it, key));
  }
  void get_strings(const char* key, std::vector<std::string>& out) {
    seen_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return;
    OCTET_CHECK(it->is_array(), source_, ": field ", key, " must be an array of strings, got ",
                it->dump());
    out.clear();
    for (size_t i = 0; i < it->size(); ++i)
      out.push_back(as<std::string>((*it)[i], std::string(key) + "[" + std::to_string(i) + "]"));
  }
  void mark(const char* key) { seen_.insert(key); }
  bool seen(const std::string& key) const { return seen_.count(key) > 0; }
  const Json& json() const { return j_; }

  template <typename T>
  T as(const Json& v, const std::string& key) const {
    if constexpr (std::is_same_v<T, bool>) {
      OCTET_CHECK(v.is_boolean(), source_, ": field ", key, " must be true or false, got ",
                  v.dump());
      return v.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      // 4096.0 from a Python writer is still an integer.
      OCTET_CHECK(
          v.is_number_integer() ||
              (v.is_number_float() &&
               v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>()))),
          source_, ": field ", key, " must be an integer, got ", v.dump());
      return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
    } else if constexpr (std::is_floating_point_v<T>) {
      OCTET_CHECK(v.is_number(), source_, ": field ", key, " must be a number, got ", v.dump());
      return v.get<double>();
    } else {
      OCTET_CHECK(v.is_string(), source_, ": field ", key, " must be a string, got ", v.dump());
      return v.get<std::string>();
    }
  }

 private:
  const Json& j_;
  std::string source_;
  std::set<std::string> seen_;
};

void read_rope(Reader& r, ModelConfig& c, const std::string& source) {
  r.get("rope_theta", c.rope_theta);
  // Recent transformers versions move rope settings into rope_parameters (older ones:
  // rope_scaling).
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    r.mark(key);
    auto it = r.json().find(key);
    if (it == r.json().end() || it->is_null()) continue;
    OCTET_CHECK(it->is_object(), source, ": field ", key, " must be an object, got ", it->dump());
    std::string type = "default";
    if (auto t = it->find("rope_type"); t != it->end())
      type = r.as<std::string>(*t, std::string(key) + ".rope_type");
    else if (auto t2 = it->find("type"); t2 != it->end())
      type = r.as<std::string>(*t2, std::string(key) + ".type");
    OCTET_CHECK(
        type == "default", source, ": field ", key, ".rope_type '", type,
        "' is not supported (octet implements the default RoPE; YaRN context extension is not)");
    if (auto t = it->find("rope_theta"); t != it->end())
      c.rope_theta = r.as<double>(*t, std::string(key) + ".rope_theta");
  }
}

}  // namespace

namespace {

// Every count and byte size derived from a config is computed in int64_t. Each size field is
// bounded so that a kernel's 32-bit row or column index holds it, and the parameter count (summed
// here in long double, over-approximating describe.h's count_parameters) so that no product of
// sizes can overflow: a config of absurd sizes is one clear error, never a wrapped count.
constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
constexpr long double kMaxParameters = 1e15L;  // 1000x DeepSeek-V3's 671B

void check_sizes(const ModelConfig& c) {
  const std::pair<const char*, int64_t> dims[] = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"max_position_embeddings", c.max_position_embeddings},
      {"q_lora_rank", c.q_lora_rank.value_or(0)},
      {"kv_lora_rank", c.kv_lora_rank},
      {"qk_nope_head_dim", c.qk_nope_head_dim},
      {"qk_rope_head_dim", c.qk_rope_head_dim},
      {"v_head_dim", c.v_head_dim},
      {"n_routed_experts", c.n_routed_experts},
      {"n_shared_experts", c.n_shared_experts},
      {"num_experts_per_tok", c.num_experts_per_tok},
      {"n_group", c.n_group},
      {"num_nextn_predict_layers", c.num_nextn_predict_layers},
  };
  for (const auto& [name, v] : dims)
    OCTET_CHECK(v <= kMaxDim, "config: ", name, " must be <= ", kMaxDim, ", got ", v);
  using L = long double;
  const L d = static_cast<L>(c.hidden_size), h = static_cast<L>(c.num_attention_heads);
  const L blocks = static_cast<L>(c.num_hidden_layers + c.num_nextn_predict_layers);
  const L q = static_cast<L>(c.q_lora_rank.value_or(0)) + d;
  const L head = static_cast<L>(c.qk_head_dim() + c.v_head_dim);
  const L attention = (d + h * head) * (q + static_cast<L>(c.kv_lora_rank + c.qk_rope_head_dim)) +
                      h * static_cast<L>(c.v_head_dim) * d;
  const L mlp = 3 * d *
                    (static_cast<L>(c.intermediate_size) +
                     static_cast<L>(c.moe_intermediate_size) *
                         static_cast<L>(c.n_routed_experts + c.n_shared_experts)) +
                (d + 1) * static_cast<L>(c.n_routed_experts);
  const L total = 2 * static_cast<L>(c.vocab_size) * d + blocks * (attention + mlp + 2 * d) +
                  static_cast<L>(c.num_nextn_predict_layers) * (2 * d * d + 3 * d) + d;
  OCTET_CHECK(total <= kMaxParameters, "config: the model would have about ",
              static_cast<double>(total), " parameters, more than octet handles (",
              static_cast<double>(kMaxParameters), "); check the size fields");
}

}  // namespace

void ModelConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    OCTET_CHECK(v > 0, "config: ", name, " must be > 0, got ", v);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("moe_intermediate_size", moe_intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("kv_lora_rank", kv_lora_rank);
  positive("qk_nope_head_dim", qk_nope_head_dim);
  positive("qk_rope_head_dim", qk_rope_head_dim);
  positive("v_head_dim", v_head_dim);
  positive("max_position_embeddings", max_position_embeddings);
  if (q_lora_rank) positive("q_lora_rank", *q_lora_rank);
  check_sizes(*this);
  OCTET_CHECK(attention_workspace_mib >= -1 && attention_workspace_mib <= (int64_t{1} << 30),
              "config: attention_workspace_mib must be -1 (unchunked), 0 (the default) or a size "
              "in MiB, got ",
              attention_workspace_mib);
  OCTET_CHECK(qk_rope_head_dim % 2 == 0,
              "config: qk_rope_head_dim must be even (RoPE rotates pairs), got ", qk_rope_head_dim);
  OCTET_CHECK(first_k_dense_replace >= 0 && first_k_dense_replace <= num_hidden_layers,
              "config: first_k_dense_replace must be in [0, num_hidden_layers = ",
              num_hidden_layers, "], got ", first_k_dense_replace);
  OCTET_CHECK(num_nextn_predict_layers >= 0, "config: num_nextn_predict_layers must be >= 0, got ",
              num_nextn_predict_layers);
  OCTET_CHECK(rms_norm_eps > 0, "config: rms_norm_eps must be > 0, got ", rms_norm_eps);
  OCTET_CHECK(rope_theta > 0, "config: rope_theta must be > 0, got ", rope_theta);
  OCTET_CHECK(initializer_range > 0, "config: initializer_range must be > 0, got ",
              initializer_range);
  if (first_k_dense_replace < num_hidden_layers || num_nextn_predict_layers > 0) {
    positive("n_routed_experts", n_routed_experts);
    positive("num_experts_per_tok", num_experts_per_tok);
    positive("n_group", n_group);
    positive("topk_group", topk_group);
    OCTET_CHECK(n_shared_experts >= 0, "config: n_shared_experts must be >= 0, got ",
                n_shared_experts);
    OCTET_CHECK(n_routed_experts % n_group == 0, "config: n_routed_experts (", n_routed_experts,
                ") must be a multiple of n_group (", n_group, ")");
    OCTET_CHECK(topk_group <= n_group, "config: topk_group (", topk_group, ") must be <= n_group (",
                n_group, ")");
    const int64_t per_group = n_routed_experts / n_group;
    OCTET_CHECK(per_group >= 2 || n_group == 1,
                "config: group-limited routing scores a group by its top-2 experts, so "
                "n_routed_experts / n_group must be >= 2, got ",
                per_group);
    OCTET_CHECK(num_experts_per_tok <= topk_group * per_group, "config: num_experts_per_tok (",
                num_experts_per_tok, ") must be <= topk_group * n_routed_experts / n_group (",
                topk_group * per_group, ")");
    OCTET_CHECK(routed_scaling_factor > 0, "config: routed_scaling_factor must be > 0, got ",
                routed_scaling_factor);
  }
  OCTET_CHECK(mtp_loss_weight >= 0, "config: octet_mtp_loss_weight must be >= 0, got ",
              mtp_loss_weight);
  OCTET_CHECK(bias_update_rate >= 0, "config: octet_bias_update_rate must be >= 0, got ",
              bias_update_rate);
  OCTET_CHECK(seq_aux_loss_alpha >= 0, "config: octet_seq_aux_loss_alpha must be >= 0, got ",
              seq_aux_loss_alpha);
  OCTET_CHECK(head_chunk_tokens >= 0,
              "config: octet_head_chunk_tokens must be >= 0 (0: automatic), got ",
              head_chunk_tokens);
  try {
    resolve_recipe(recipe);
  } catch (const Error& e) {
    OCTET_THROW("config: octet_", e.what());  // "config: octet_recipe_overrides[0] '...': ..."
  }
}

ModelConfig model_config_from_json(const Json& j, const std::string& source) {
  OCTET_CHECK(j.is_object(), source, ": a model config must be a JSON object");
  ModelConfig c;
  Reader r(j, source);
  r.get("vocab_size", c.vocab_size);
  r.get("hidden_size", c.hidden_size);
  r.get("intermediate_size", c.intermediate_size);
  r.get("moe_intermediate_size", c.moe_intermediate_size);
  r.get("num_hidden_layers", c.num_hidden_layers);
  r.get("first_k_dense_replace", c.first_k_dense_replace);
  r.get("num_attention_heads", c.num_attention_heads);
  r.get("max_position_embeddings", c.max_position_embeddings);
  r.get_optional("q_lora_rank", c.q_lora_rank);
  r.get("kv_lora_rank", c.kv_lora_rank);
  r.get("qk_nope_head_dim", c.qk_nope_head_dim);
  r.get("qk_rope_head_dim", c.qk_rope_head_dim);
  r.get("v_head_dim", c.v_head_dim);
  read_rope(r, c, source);
  r.get("rope_interleave", c.rope_interleave);
  r.get("n_routed_experts", c.n_routed_experts);
  r.get("n_shared_experts", c.n_shared_experts);
  r.get("num_experts_per_tok", c.num_experts_per_tok);
  r.get("n_group", c.n_group);
  r.get("topk_group", c.topk_group);
  r.get("routed_scaling_factor", c.routed_scaling_factor);
  r.get("norm_topk_prob", c.norm_topk_prob);
  std::string scoring = "sigmoid";
  r.get("scoring_func", scoring);
  OCTET_CHECK(scoring == "sigmoid", source, ": field scoring_func '", scoring,
              "' is not supported (DeepSeek-V3 routing uses sigmoid)");
  r.get("rms_norm_eps", c.rms_norm_eps);
  r.get("tie_word_embeddings", c.tie_word_embeddings);
  r.get("initializer_range", c.initializer_range);
  r.get("num_nextn_predict_layers", c.num_nextn_predict_layers);
  int64_t kv_heads = c.num_attention_heads;
  r.get("num_key_value_heads", kv_heads);
  OCTET_CHECK(kv_heads == c.num_attention_heads, source, ": field num_key_value_heads (", kv_heads,
              ") must equal num_attention_heads (", c.num_attention_heads, ") in MLA");
  std::string act = "silu";
  r.get("hidden_act", act);
  OCTET_CHECK(act == "silu", source, ": field hidden_act '", act,
              "' is not supported (SwiGLU uses silu)");
  r.get("octet_recipe", c.recipe.preset);
  r.get_strings("octet_recipe_overrides", c.recipe.overrides);
  r.get("octet_mtp_loss_weight", c.mtp_loss_weight);
  r.get("octet_bias_update_rate", c.bias_update_rate);
  r.get("octet_seq_aux_loss_alpha", c.seq_aux_loss_alpha);
  r.get("octet_head_chunk_tokens", c.head_chunk_tokens);
  r.get("octet_moe_recompute", c.moe_recompute);
  r.get("octet_attention_recompute_k", c.attention_recompute_k);
  r.get("octet_deterministic_attention", c.deterministic_attention);
  r.get("octet_attention_workspace_mib", c.attention_workspace_mib);
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!r.seen(it.key())) c.extra[it.key()] = it.value();
  c.validate();
  return c;
}

Json model_config_to_json(const ModelConfig& c) {
  Json j = c.extra;
  j["model_type"] = j.value("model_type", std::string("deepseek_v3"));
  if (!j.contains("architectures")) j["architectures"] = Json::array({"DeepseekV3ForCausalLM"});
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_attention_heads;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["q_lora_rank"] = c.q_lora_rank ? Json(*c.q_lora_rank) : Json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["rope_interleave"] = c.rope_interleave;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["scoring_func"] = "sigmoid";
  j["topk_method"] = "noaux_tc";
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["initializer_range"] = c.initializer_range;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["octet_recipe"] = c.recipe.preset;
  j["octet_recipe_overrides"] = c.recipe.overrides;
  j["octet_mtp_loss_weight"] = c.mtp_loss_weight;
  j["octet_bias_update_rate"] = c.bias_update_rate;
  j["octet_seq_aux_loss_alpha"] = c.seq_aux_loss_alpha;
  j["octet_head_chunk_tokens"] = c.head_chunk_tokens;
  j["octet_moe_recompute"] = c.moe_recompute;
  j["octet_attention_recompute_k"] = c.attention_recompute_k;
  j["octet_deterministic_attention"] = c.deterministic_attention;
  j["octet_attention_workspace_mib"] = c.attention_workspace_mib;
  return j;
}

ModelConfig read_model_config(const std::string& path) {
  std::ifstream in(path);
  OCTET_CHECK(in, path, ": cannot open the model config");
  std::stringstream ss;
  ss << in.rdbuf();
  Json j;
  try {
    j = Json::parse(ss.str());
  } catch (const Json::exception& e) {
    OCTET_THROW(path, ": not valid JSON: ", e.what());
  }
  return model_config_from_json(j, path);
}

void write_model_config(const std::string& path, const ModelConfig& c) {
  c.validate();
  io::write_text_file_atomic(path, model_config_to_json(c).dump(2) + "\n");
}

}  // namespace octet
