#include "model/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "backend/backend.h"
#include "io/atomic_file.h"
#include "io/json_keys.h"
#include "numerics/fp8.h"
#include "ops/cast/cast.h"
#include "ops/quantize/quantize.h"

namespace octet {

using io::DuplicateKey;
using io::find_duplicate_key;
using io::NamedTensors;
using io::read_safetensors;
using io::write_safetensors;
using io::write_text_file_atomic;

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;  // std::map-backed: keys sorted, as transformers' sort_keys=True

constexpr const char* kConfigName = "config.json";
constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";
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

struct Located {
  Tensor tensor;
  std::string file;  // for messages: the shard, or "params"
};

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

// ---- The staging directory and its swap into place ----

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // durability is best effort for directories; the renames are what is atomic
  ::fsync(fd);
  ::close(fd);
}

// Files of an existing checkpoint directory `dir` that the new checkpoint replaces: its config,
// its index and the weight files the index names, model.safetensors, and stale staging files.
// Everything else (tokenizer, generation config, README, other .safetensors files, ...) is carried
// over, except a file with the name of one the new checkpoint writes, which the new one replaces.
std::set<std::string> old_checkpoint_files(const fs::path& dir) {
  std::set<std::string> files = {kConfigName, kIndexName, kSingleName};
  std::ifstream in(dir / kIndexName);
  const Json index = in ? Json::parse(in, nullptr, false) : Json();
  if (index.is_object() && index.contains("weight_map") && index["weight_map"].is_object())
    for (const auto& [name, file] : index["weight_map"].items())
      if (file.is_string()) files.insert(file.get<std::string>());
  return files;
}

// Whether `name` is an AtomicFile temporary (`<file>.tmp.<pid>.<random>`) of one of `files`: left
// by a writer of that file that crashed. Other names with ".tmp." in them are the user's.
bool is_stale_temporary_of(const std::string& name, const std::set<std::string>& files) {
  const size_t at = name.find(".tmp.");
  return at != std::string::npos && files.count(name.substr(0, at)) != 0;
}

void carry_over(const fs::path& from, const fs::path& to) {
  const std::set<std::string> replaced = old_checkpoint_files(from);
  for (const auto& e : fs::directory_iterator(from)) {
    const std::string name = e.path().filename().string();
    if (replaced.count(name) || is_stale_temporary_of(name, replaced) ||
        fs::exists(fs::symlink_status(to / name)))
      continue;
    std::error_code ec;
    if (e.is_regular_file() && !e.is_symlink()) fs::create_hard_link(e.path(), to / name, ec);
    if (ec || !e.is_regular_file() || e.is_symlink())
      fs::copy(e.path(), to / name, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  }
}

// A new, empty directory `<base>.<tag>.XXXXXX` made by mkdtemp: a name no file or link had, so
// nothing of anyone else's is written through or removed. mkdtemp makes it 0700; it gets what
// mkdir would give it (it becomes the checkpoint directory).
fs::path make_temp_dir(const fs::path& base, const char* tag) {
  std::string name = base.string() + "." + tag + ".XXXXXX";
  OCTET_CHECK(::mkdtemp(name.data()) != nullptr, base.string(),
              ": cannot create a temporary directory beside it: ", std::strerror(errno));
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::chmod(name.c_str(), 0777 & ~mask);
  return name;
}

// Puts the complete `staging` directory at `target`, replacing what is there.
void swap_into_place(const fs::path& staging, const fs::path& target) {
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::exists(fs::symlink_status(target))) {
    OCTET_CHECK(std::rename(staging.c_str(), target.c_str()) == 0, target.string(),
                ": cannot rename ", staging.string(), " onto it: ", std::strerror(errno));
    fsync_path(parent);
    return;
  }
#if defined(__linux__) && defined(RENAME_EXCHANGE)
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_path(parent);
    std::error_code ec;  // the new checkpoint is in place: leftovers of the old one are no error
    fs::remove_all(staging, ec);
    return;
  }
  OCTET_CHECK(errno == EINVAL || errno == ENOSYS, target.string(), ": cannot exchange it with ",
              staging.string(), ": ", std::strerror(errno));
#endif
  const fs::path holder = make_temp_dir(target, "old");
  const fs::path old = holder / target.filename();
  if (std::rename(target.c_str(), old.c_str()) != 0) {
    const int err = errno;
    fs::remove(holder);
    OCTET_THROW(target.string(), ": cannot move it to ", old.string(), ": ", std::strerror(err));
  }
  if (std::rename(staging.c_str(), target.c_str()) != 0) {
    const int err = errno;
    std::rename(old.c_str(), target.c_str());
    OCTET_THROW(target.string(), ": cannot rename ", staging.string(),
                " onto it: ", std::strerror(err));
  }
  fsync_path(parent);
  std::error_code ec;
  fs::remove_all(holder, ec);
}

fs::path normalized_dir(const std::string& dir) {
  OCTET_CHECK(!dir.empty(), "checkpoint: the directory name is empty");
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
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

// config.json, the shards, then the index: a directory with an index has all its shards.
void write_files(const fs::path& staging, const ModelConfig& config, const WritePlan& plan,
                 const CheckpointWriteOptions& options) {
  auto done = [&](const fs::path& file, int64_t bytes) {
    if (options.progress) options.progress(file.string(), bytes, plan.total);
  };
  write_model_config((staging / kConfigName).string(),
                     config_for(config, plan.any_fp8, plan.dtype));
  done(staging / kConfigName, 0);

  Context ctx = make_context(Device::kCpu);
  Json weight_map = Json::object();
  int64_t written = 0;
  const size_t n = plan.shards.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string file = n == 1 ? kSingleName : shard_name(i, n);
    NamedTensors tensors;  // converted one shard at a time, so at most one shard is held twice
    for (size_t e : plan.shards[i]) {
      const WritePlan::Entry& entry = plan.entries[e];
      for (auto& nt : convert(ctx, *entry.m, entry.storage)) {
        weight_map[nt.first] = file;
        tensors.push_back(std::move(nt));
      }
      written += entry.bytes;
    }
    write_safetensors((staging / file).string(), tensors, {{"format", "pt"}});
    done(staging / file, written);
  }
  if (n > 1) {
    const Json index = {{"metadata", {{"total_size", plan.total}}}, {"weight_map", weight_map}};
    write_text_file_atomic((staging / kIndexName).string(), index.dump(2) + "\n");
    done(staging / kIndexName, written);
  }
}

}  // namespace

void write_checkpoint(const std::string& dir, const ModelConfig& config, const NamedTensors& params,
                      const CheckpointWriteOptions& options) {
  const fs::path target = normalized_dir(dir);
  const WritePlan plan = plan_write(config, params, options, target.string());
  OCTET_CHECK(!fs::exists(target) || fs::is_directory(target), target.string(),
              ": exists and is not a directory");
  if (target.has_parent_path()) fs::create_directories(target.parent_path());
  const fs::path staging = make_temp_dir(target, "tmp");
  try {
    write_files(staging, config, plan, options);
    if (fs::exists(target)) carry_over(target, staging);
    fsync_path(staging);
    swap_into_place(staging, target);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(staging, ec);  // the previous checkpoint, if any, is untouched
    throw;
  }
}

namespace {

// The whole of a small text file (an index): a FIFO or device would block or never end.
std::string read_small_text(const fs::path& path) {
  std::error_code ec;
  OCTET_CHECK(fs::is_regular_file(path, ec), path.string(), ": cannot open: not a regular file");
  std::ifstream in(path, std::ios::binary);
  OCTET_CHECK(in, path.string(), ": cannot open: ", std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The index's name -> file map.
std::map<std::string, std::string> read_index(const fs::path& index) {
  return parse_checkpoint_index(read_small_text(index), index.string());
}

}  // namespace

std::map<std::string, std::string> parse_checkpoint_index(std::string_view text,
                                                          const std::string& source) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    OCTET_THROW(source, ": not valid JSON: ", e.what());
  }
  auto wm = j.is_object() ? j.find("weight_map") : j.end();
  OCTET_CHECK(wm != j.end() && wm->is_object(), source,
              ": expected an object with a \"weight_map\" object");
  // The parsed object kept one of two equal keys: a tensor listed twice is seen in the text.
  if (const std::optional<DuplicateKey> d = find_duplicate_key(text)) {
    OCTET_CHECK(d->depth != 2 || d->parent != "weight_map", source, ": weight_map lists tensor '",
                d->key, "' twice");
    OCTET_THROW(source, ": duplicate key '", d->key, "'");
  }
  std::map<std::string, std::string> map;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    OCTET_CHECK(it.value().is_string(), source, ": weight_map['", it.key(),
                "'] must be a file name, got ", it.value().dump());
    const std::string file = it.value().get<std::string>();
    OCTET_CHECK(!file.empty() && file.find('/') == std::string::npos &&
                    file.find('\0') == std::string::npos && file != "." && file != "..",
                source, ": weight_map['", it.key(), "'] = '", file,
                "' is not a file name inside the checkpoint directory");
    map[it.key()] = file;
  }
  return map;
}

namespace {

// Every tensor of the checkpoint, checked against the index: each listed tensor in its file, each
// file's tensors listed there, no tensor twice.
std::map<std::string, Located> read_tensors(const fs::path& dir) {
  const fs::path index = dir / kIndexName, single = dir / kSingleName;
  std::error_code ec;  // the error_code forms: a name too long is a missing file, not a throw
  const bool has_index = fs::exists(index, ec), has_single = fs::exists(single, ec);
  OCTET_CHECK(!(has_index && has_single), dir.string(), ": holds both ", kIndexName, " and ",
              kSingleName, "; which one is the checkpoint is ambiguous");
  OCTET_CHECK(has_index || has_single, dir.string(), ": no checkpoint (neither ", kIndexName,
              " nor ", kSingleName, ")");
  std::map<std::string, Located> found;
  if (has_single) {
    for (auto& [name, t] : read_safetensors(single.string()).tensors)
      found.emplace(name, Located{std::move(t), single.string()});
    return found;
  }
  const std::map<std::string, std::string> weight_map = read_index(index);
  std::map<std::string, std::vector<std::string>> files;  // file -> names the index puts there
  for (const auto& [name, file] : weight_map) files[file].push_back(name);
  // All files first, so that a tensor in two shards reads as a duplicate whatever the file order.
  std::map<std::string, std::vector<Located>> held;
  for (const auto& [file, names] : files) {
    const fs::path path = dir / file;
    const bool regular = fs::is_regular_file(path, ec);
    OCTET_CHECK(regular, path.string(), ": ",
                ec && ec != std::errc::no_such_file_or_directory
                    ? "cannot open (" + ec.message() + ")"
                    : std::string("missing"),
                " (", kIndexName, " maps tensor '", names.front(), "'",
                names.size() > 1 ? " and others" : "", " to it)");
    for (auto& [name, t] : read_safetensors(path.string()).tensors)
      held[name].push_back(Located{std::move(t), path.string()});
  }
  for (auto& [name, locs] : held) {
    OCTET_CHECK(locs.size() == 1, tensor_in(locs[0].file, name), ": also in ", locs[1].file,
                " (duplicate tensors across shards)");
    const std::string& path = locs[0].file;
    auto listed = weight_map.find(name);
    OCTET_CHECK(listed != weight_map.end(), tensor_in(path, name), ": not listed in ", kIndexName);
    OCTET_CHECK(dir / listed->second == fs::path(path), tensor_in(path, name), ": ", kIndexName,
                " maps it to ", listed->second);
    found.emplace(name, std::move(locs[0]));
  }
  for (const auto& [name, file] : weight_map)
    OCTET_CHECK(found.count(name), tensor_in((dir / file).string(), name), ": listed in ",
                kIndexName, " but absent from the file");
  return found;
}

}  // namespace

LoadedCheckpoint read_checkpoint(const std::string& dir_name,
                                 const CheckpointReadOptions& options) {
  const fs::path dir = normalized_dir(dir_name);
  std::error_code ec;
  OCTET_CHECK(fs::is_directory(dir, ec), dir.string(), ": not a checkpoint directory");
  LoadedCheckpoint out;
  out.config = read_model_config((dir / kConfigName).string());
  const std::map<std::string, Located> found = read_tensors(dir);

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
