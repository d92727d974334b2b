#include "model/checkpoint.h"

#include <filesystem>
#include <iterator>
#include <set>

#include "backend/backend.h"
#include "io/safetensors_dir.h"
#include "numerics/fp8.h"
#include "ops/cast/cast.h"
#include "ops/quantize/quantize.h"

namespace octet {

using io::NamedTensors;

namespace {

namespace fs = std::filesystem;

constexpr const char* kConfigName = "config.json";
constexpr size_t kShownNames = 8;      // names listed in one error before "and N more"
constexpr size_t kShownInWarning = 3;  // a warning is read in passing: the first few

std::string prefix(int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".";
}

// Each role's name (DeepSeek-V3 / transformers), in ParamRole's order: within its layer, or for
// kEmbedding, kFinalNorm and kLmHead outside the layers.
constexpr const char* kRoleNames[] = {"model.embed_tokens.weight",
                                      "model.norm.weight",
                                      "lm_head.weight",
                                      "input_layernorm.weight",
                                      "self_attn.q_proj.weight",
                                      "self_attn.q_a_proj.weight",
                                      "self_attn.q_a_layernorm.weight",
                                      "self_attn.q_b_proj.weight",
                                      "self_attn.kv_a_proj_with_mqa.weight",
                                      "self_attn.kv_a_layernorm.weight",
                                      "self_attn.kv_b_proj.weight",
                                      "self_attn.o_proj.weight",
                                      "post_attention_layernorm.weight",
                                      "mlp.gate_up_proj.weight",
                                      "mlp.down_proj.weight",
                                      "mlp.gate.weight",
                                      "mlp.gate.e_score_correction_bias",
                                      "mlp.experts.gate_up_proj",
                                      "mlp.experts.down_proj",
                                      "mlp.shared_experts.gate_up_proj.weight",
                                      "mlp.shared_experts.down_proj.weight",
                                      "embed_tokens.weight",
                                      "enorm.weight",
                                      "hnorm.weight",
                                      "eh_proj.weight",
                                      "shared_head.norm.weight",
                                      "shared_head.head.weight"};
static_assert(std::size(kRoleNames) == static_cast<size_t>(ParamRole::kMtpHead) + 1,
              "one name per ParamRole");

// The checkpoint name of a tensor: its parameter's, or for a part of a fused parameter the
// unfused name (gate_proj / up_proj, per-expert weights).
std::string checkpoint_name(const ModuleTensor& t) {
  if (!t.fused()) return parameter_name(t.role, t.layer);
  std::string mlp = prefix(t.layer) + "mlp.";
  if (t.role == ParamRole::kSharedGateUp) mlp += "shared_experts.";
  if (t.expert >= 0) mlp += "experts." + std::to_string(t.expert) + ".";
  switch (t.part) {
    case TensorPart::kGate:
      return mlp + "gate_proj.weight";
    case TensorPart::kUp:
      return mlp + "up_proj.weight";
    case TensorPart::kWhole:
      break;
  }
  return mlp + "down_proj.weight";  // a routed expert's slice of kExpertsDown
}

std::string shown_names(const std::vector<std::string>& names, size_t shown = kShownNames) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < shown; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > shown) s += " and " + std::to_string(names.size() - shown) + " more";
  return s;
}

std::string tensor_in(const std::string& file, const std::string& name) {
  return file + ": tensor '" + name + "'";
}

// ---- Matching named tensors (given to the writer, or found in the files) against the specs. ----

using Located = io::LocatedTensor;  // file, for messages: the shard, or "params"

struct Matched {
  const TensorSpec* spec = nullptr;
  Tensor value;      // F32 / BF16, or the E4M3 data of an FP8 pair
  Tensor scale_inv;  // F32 (ceil(out/128), ceil(in/128)) when `value` is FP8; undefined otherwise
  std::string file;
  bool fp8() const { return scale_inv.defined() && value.dtype() == DType::kE4M3; }
};

// Matches every spec to its tensor (or FP8 pair), checking dtype and shape; any tensor no spec
// claims is an error. Returns the matches in spec order; missing specs go to `missing`.
std::vector<Matched> match_tensors(const ModelConfig& c, const std::vector<TensorSpec>& specs,
                                   const std::map<std::string, Located>& given,
                                   std::vector<const TensorSpec*>& missing) {
  const int64_t layers = c.num_hidden_layers + c.num_nextn_predict_layers;
  std::vector<Matched> out;
  std::set<std::string> used;
  for (const TensorSpec& spec : specs) {
    auto it = given.find(spec.name);
    if (it == given.end()) {
      missing.push_back(&spec);
      continue;
    }
    const auto& [t, file] = it->second;
    Matched m{&spec, t, {}, file};
    used.insert(spec.name);
    const std::string where = tensor_in(file, spec.name);
    if (is_fp8(t.dtype())) {
      OCTET_CHECK(t.dtype() == DType::kE4M3, where, ": FP8 weights must be F8_E4M3 (DeepSeek-V3's ",
                  "format), got ", dtype_name(t.dtype()));
      OCTET_CHECK(spec.shape.size() == 2, where,
                  ": only matrices can be stored in FP8, expected shape ", shape_str(spec.shape));
      const std::string sname = fp8_scale_name(spec.name);
      auto s = given.find(sname);
      OCTET_CHECK(s != given.end(), where, " is F8_E4M3 but its scales '", sname, "' are missing");
      const Tensor& scale = s->second.tensor;
      OCTET_CHECK(scale.dtype() == DType::kF32, tensor_in(s->second.file, sname),
                  ": expected dtype F32, got ", dtype_name(scale.dtype()));
      OCTET_CHECK(scale.shape() == fp8_scale_shape(spec.shape), tensor_in(s->second.file, sname),
                  ": expected shape ", shape_str(fp8_scale_shape(spec.shape)),
                  " (one scale per 128x128 ", "block of ", shape_str(spec.shape), "), got ",
                  shape_str(scale.shape()));
      m.scale_inv = scale;
      used.insert(sname);
    } else {
      OCTET_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16, where,
                  ": expected dtype F32, BF16 or F8_E4M3 (with scales), got ",
                  dtype_name(t.dtype()));
    }
    OCTET_CHECK(t.shape() == spec.shape, where, ": expected shape ", shape_str(spec.shape),
                ", got ", shape_str(t.shape()));
    out.push_back(std::move(m));
  }
  std::vector<std::string> extra;
  std::string hint;
  // A release checkpoint with num_nextn_predict_layers set to 0 still holds its MTP layer: the
  // tensors of one MTP layer more than the config declares.
  std::map<std::string, int64_t> undeclared;  // name -> layer
  for (const auto& [name, loc] : given) {
    if (used.count(name)) continue;
    extra.push_back(tensor_in(loc.file, name));
    if (undeclared.empty()) {
      ModelConfig more = c;
      more.num_nextn_predict_layers += 1;
      for (const TensorSpec& s : expected_tensors(more))
        if (s.layer >= layers) undeclared.emplace(s.name, s.layer);
    }
    const auto it = undeclared.find(name);
    if (hint.empty() && it != undeclared.end())
      hint = "; layer " + std::to_string(it->second) + " is beyond num_hidden_layers + " +
             "num_nextn_predict_layers = " + std::to_string(layers) + " (undeclared MTP layers?)";
  }
  OCTET_CHECK(extra.empty(), "unexpected tensor", extra.size() > 1 ? "s " : " ", shown_names(extra),
              ": not a parameter of this model config (", specs.size(), " expected)", hint);
  return out;
}

std::string missing_message(const std::vector<const TensorSpec*>& missing) {
  std::vector<std::string> names;
  names.reserve(missing.size());
  for (const TensorSpec* s : missing) names.push_back(s->name + " " + shape_str(s->shape));
  return "missing tensor" + std::string(missing.size() > 1 ? "s " : " ") + shown_names(names);
}

// ---- Conversions ----

enum class StoredAs : uint8_t { kAsGiven, kF32, kBf16, kFp8 };

StoredAs storage_for(TensorKind kind, CheckpointFormat format) {
  if (format == CheckpointFormat::kAsIs) return StoredAs::kAsGiven;
  if (kind == TensorKind::kRouterBias) return StoredAs::kF32;
  if (format == CheckpointFormat::kFp8 && kind == TensorKind::kLinear) return StoredAs::kFp8;
  return StoredAs::kBf16;
}

int64_t stored_bytes(const Matched& m, StoredAs s) {
  const int64_t n = shape_numel(m.spec->shape);
  switch (s) {
    case StoredAs::kAsGiven:
      return m.value.nbytes() + (m.fp8() ? m.scale_inv.nbytes() : 0);
    case StoredAs::kF32:
      return 4 * n;
    case StoredAs::kBf16:
      return 2 * n;
    case StoredAs::kFp8:
      return n + 4 * shape_numel(fp8_scale_shape(m.spec->shape));
  }
  return 0;
}

QuantTensor as_quant(const Matched& m) {
  QuantTensor q;
  q.format = Fp8Format::kE4M3;
  q.granularity = Granularity::k128x128;
  q.data = m.value;
  q.scale_inv = m.scale_inv;
  return q;
}

Tensor to_float(Context& ctx, const Matched& m, DType to) {
  if (!m.fp8()) return m.value.dtype() == to ? m.value : cast(ctx, m.value, to);
  return dequantize(ctx, as_quant(m), to).reshape(m.spec->shape);
}

// The tensor(s) a match is stored as: one, or the FP8 weight followed by its scales.
NamedTensors convert(Context& ctx, const Matched& m, StoredAs s) {
  const std::string& name = m.spec->name;
  const std::string sname = fp8_scale_name(name);
  switch (s) {
    case StoredAs::kAsGiven:
      if (m.fp8()) return {{name, m.value}, {sname, m.scale_inv}};
      return {{name, m.value}};
    case StoredAs::kF32:
      return {{name, to_float(ctx, m, DType::kF32)}};
    case StoredAs::kBf16:
      return {{name, to_float(ctx, m, DType::kBF16)}};
    case StoredAs::kFp8: {
      if (m.fp8()) return {{name, m.value}, {sname, m.scale_inv}};
      QuantizeArgs args;
      args.input = m.value;
      args.format = Fp8Format::kE4M3;
      args.granularity = Granularity::k128x128;
      // The release's scales are amax / 448, not powers of 2.
      args.rounding = ScaleRounding::kExact;
      const QuantTensor q = quantize(ctx, args);
      return {{name, q.data}, {sname, q.scale_inv}};
    }
  }
  return {};
}

ModelConfig config_for(const ModelConfig& c, bool fp8, DType dtype) {
  ModelConfig out = c;
  if (fp8) {
    out.extra["quantization_config"] = {{"activation_scheme", "dynamic"},
                                        {"fmt", "e4m3"},
                                        {"quant_method", "fp8"},
                                        {"weight_block_size", {128, 128}}};
  } else {
    out.extra.erase("quantization_config");  // a BF16 copy of a release checkpoint is not FP8
  }
  // Recent transformers versions spell torch_dtype "dtype"; keep whichever the config has.
  const char* key = out.extra.contains("dtype") ? "dtype" : "torch_dtype";
  out.extra[key] = dtype == DType::kF32 ? "float32" : "bfloat16";
  return out;
}

}  // namespace

const char* tensor_kind_name(TensorKind k) {
  switch (k) {
    case TensorKind::kLinear:
      return "linear";
    case TensorKind::kNorm:
      return "norm";
    case TensorKind::kEmbedding:
      return "embedding";
    case TensorKind::kHead:
      return "head";
    case TensorKind::kRouterGate:
      return "router_gate";
    case TensorKind::kRouterBias:
      return "router_bias";
    case TensorKind::kMtpProjection:
      return "mtp_projection";
  }
  return "?";
}

std::string fp8_scale_name(const std::string& weight_name) {
  return weight_name + "_scale_inv";
}

Shape fp8_scale_shape(const Shape& s) {
  OCTET_CHECK(s.size() == 2, "fp8_scale_shape: expected a matrix, got shape ", shape_str(s));
  return {ceil_div(s[0], kGroup), ceil_div(s[1], kGroup)};
}

std::string parameter_name(ParamRole role, int64_t layer) {
  const char* name = kRoleNames[static_cast<size_t>(role)];
  return layer < 0 ? std::string(name) : prefix(layer) + name;
}

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
  std::vector<TensorSpec> out;
  for (const ModuleTensor& t : module_tree(c)) {  // validates the config
    TensorSpec s;
    s.name = checkpoint_name(t);
    s.shape = t.shape;
    s.kind = t.kind;
    s.layer = t.layer;
    s.mtp_depth = t.mtp_depth;
    s.role = t.role;
    if (t.fused()) {
      s.fused_name = parameter_name(t.role, t.layer);
      s.fused_offset = t.param_offset;
      s.fused_shape = t.param_shape;
    }
    if (t.copy_of) s.copy_of = parameter_name(*t.copy_of, -1);
    out.push_back(std::move(s));
  }
  return out;
}

const Tensor& LoadedCheckpoint::at(const std::string& name) const {
  auto it = index_.find(name);
  OCTET_CHECK(it != index_.end(), "checkpoint: no tensor '", name, "'",
              quantized.count(name) ? " (it was kept in FP8: see quantized)" : "");
  return tensors[it->second].second;
}

namespace {

// What goes into which shard, validated before anything touches the disk.
struct WritePlan {
  struct Entry {
    const Matched* m;
    StoredAs storage;
    int64_t bytes;  // stored data bytes (an FP8 weight's scales included)
  };
  std::vector<TensorSpec> specs;  // what `matched` points into
  std::vector<Matched> matched;
  std::vector<Entry> entries;               // in the order of `params`
  std::vector<std::vector<size_t>> shards;  // indices into entries
  int64_t total = 0;
  bool any_fp8 = false;
  DType dtype = DType::kBF16;  // config.json's torch_dtype: the embedding's stored dtype
};

WritePlan plan_write(const ModelConfig& config, const NamedTensors& params,
                     const CheckpointWriteOptions& options, const std::string& where) {
  OCTET_CHECK(options.shard_bytes > 0, where, ": shard_bytes must be > 0, got ",
              options.shard_bytes);
  std::map<std::string, Located> given;
  for (const auto& [name, t] : params) {
    OCTET_CHECK(given.emplace(name, Located{t, "params"}).second, tensor_in("params", name),
                ": given twice");
    check_device(t, name.c_str(), Device::kCpu);
  }
  WritePlan plan;
  plan.specs = expected_tensors(config);
  std::vector<const TensorSpec*> missing;
  plan.matched = match_tensors(config, plan.specs, given, missing);
  OCTET_CHECK(missing.empty(), where, ": write_checkpoint: ", missing_message(missing));

  std::map<std::string, const Matched*> by_name;
  for (const Matched& m : plan.matched) by_name[m.spec->name] = &m;
  for (const auto& [name, t] : params) {
    auto it = by_name.find(name);
    if (it == by_name.end()) continue;  // the scales of an FP8 weight travel with it
    const Matched& m = *it->second;
    const StoredAs s = storage_for(m.spec->kind, options.format);
    plan.entries.push_back({&m, s, stored_bytes(m, s)});
    plan.total += plan.entries.back().bytes;
    plan.any_fp8 |= s == StoredAs::kFp8 || (s == StoredAs::kAsGiven && m.fp8());
    if (m.spec->kind == TensorKind::kEmbedding && m.spec->layer < 0)
      plan.dtype = s == StoredAs::kAsGiven ? m.value.dtype() : DType::kBF16;
  }
  // transformers' sharding: a new shard when the next entry would overflow a non-empty one.
  plan.shards.emplace_back();
  int64_t in_shard = 0;
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    if (!plan.shards.back().empty() && in_shard + plan.entries[i].bytes > options.shard_bytes) {
      plan.shards.emplace_back();
      in_shard = 0;
    }
    plan.shards.back().push_back(i);
    in_shard += plan.entries[i].bytes;
  }
  return plan;
}

}  // namespace

void write_checkpoint(const std::string& dir, const ModelConfig& config, const NamedTensors& params,
                      const CheckpointWriteOptions& options) {
  const WritePlan plan = plan_write(config, params, options, dir);
  io::SafetensorsDirWrite w;
  w.files.emplace_back(kConfigName, [&](const std::string& path) {
    write_model_config(path, config_for(config, plan.any_fp8, plan.dtype));
  });
  for (const std::vector<size_t>& shard : plan.shards) {
    int64_t bytes = 0;
    for (size_t e : shard) bytes += plan.entries[e].bytes;
    w.shard_bytes.push_back(bytes);
  }
  // Converted one shard at a time, so at most one shard is held twice.
  Context ctx = make_context(Device::kCpu);
  w.shard = [&](size_t i) {
    NamedTensors tensors;
    for (size_t e : plan.shards[i]) {
      const WritePlan::Entry& entry = plan.entries[e];
      for (auto& nt : convert(ctx, *entry.m, entry.storage)) tensors.push_back(std::move(nt));
    }
    return tensors;
  };
  w.progress = options.progress;
  io::write_safetensors_dir(dir, w);
}

LoadedCheckpoint read_checkpoint(const std::string& dir_name,
                                 const CheckpointReadOptions& options) {
  fs::path dir = fs::path(dir_name).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  std::error_code ec;
  OCTET_CHECK(!dir_name.empty() && fs::is_directory(dir, ec), dir.string(),
              ": not a checkpoint directory");
  LoadedCheckpoint out;
  out.config = read_model_config((dir / kConfigName).string());
  const std::map<std::string, Located> found =
      io::read_safetensors_dir(dir.string(), options.ranges);

  const std::vector<TensorSpec> specs = expected_tensors(out.config);
  std::vector<const TensorSpec*> missing;
  std::vector<Matched> matched = match_tensors(out.config, specs, found, missing);
  if (!missing.empty()) {
    // A checkpoint without any MTP layer (what transformers saves) is complete but for them.
    bool all_mtp = true, any_mtp = false;
    for (const TensorSpec* s : missing) all_mtp &= s->mtp_depth >= 0;
    for (const Matched& m : matched) any_mtp |= m.spec->mtp_depth >= 0;
    OCTET_CHECK(all_mtp && !any_mtp, dir.string(), ": ", missing_message(missing));
    for (const TensorSpec* s : missing) out.missing_mtp.push_back(s->name);
    out.warnings.push_back(
        dir.string() + ": no Multi-Token Prediction layers (num_nextn_predict_layers = " +
        std::to_string(out.config.num_nextn_predict_layers) +
        "; the transformers library does not save them): " + std::to_string(missing.size()) +
        " tensors to initialise afresh: " + shown_names(out.missing_mtp, kShownInWarning));
  }

  Context ctx = make_context(Device::kCpu);
  for (const Matched& m : matched) {
    out.stored_fp8 |= m.fp8();
    if (m.fp8() && options.fp8_weights == Fp8Weights::kKeep) {
      out.quantized.emplace(m.spec->name, as_quant(m));
      continue;
    }
    Tensor t = m.value;
    if (m.fp8() || options.cast == ReadCast::kToF32) t = to_float(ctx, m, DType::kF32);
    out.index_[m.spec->name] = out.tensors.size();
    out.tensors.emplace_back(m.spec->name, std::move(t));
  }
  return out;
}

}  // namespace octet
