#include "model/init.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "backend/backend.h"
#include "core/rng.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "numerics/fp8.h"
#include "ops/init/init_normal.h"

namespace octet {
namespace {

// nn.Embedding's padding_idx, as transformers' DeepseekV3Model passes config.pad_token_id (a
// negative index counts from the end, as PyTorch allows).
std::optional<int64_t> padding_row(const ModelConfig& c) {
  const auto it = c.extra.find("pad_token_id");
  if (it == c.extra.end() || it->is_null()) return std::nullopt;
  OCTET_CHECK(it->is_number_integer(), "config: pad_token_id must be an integer or null, got ",
              it->dump());
  const int64_t id = it->get<int64_t>();
  const int64_t V = c.vocab_size;
  OCTET_CHECK(id >= -V && id < V, "config: pad_token_id must be in [", -V, ", ", V,
              ") for vocab_size ", V, ", got ", id);
  return id < 0 ? id + V : id;
}

bool is_gaussian(TensorKind k) {
  return k != TensorKind::kNorm && k != TensorKind::kRouterBias;
}

Tensor filled(const Shape& shape, float value) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::fill_n(t.data_as<float>(), t.numel(), value);
  return t;
}

Tensor init_one(const TensorSpec& s, const ModelConfig& c, uint64_t seed) {
  switch (s.kind) {
    case TensorKind::kNorm:
      return filled(s.shape, 1.0f);
    case TensorKind::kRouterBias:
      return filled(s.shape, 0.0f);
    case TensorKind::kLinear:
    case TensorKind::kEmbedding:
    case TensorKind::kHead:
    case TensorKind::kRouterGate:
    case TensorKind::kMtpProjection:
      break;
  }
  Tensor t = Tensor::empty(s.shape, DType::kF32);
  Context host = make_context(Device::kCpu);
  init_normal(host,
              {.out = t, .seed = seed, .stream = init_stream(s.name), .std = c.initializer_range});
  if (s.kind == TensorKind::kEmbedding) {
    if (const auto row = padding_row(c)) {
      const int64_t D = t.cols();
      std::fill_n(t.data_as<float>() + *row * D, D, 0.0f);
    }
  }
  return t;
}

Tensor copy_of(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), t.dtype());
  if (t.nbytes() > 0) std::memcpy(out.data(), t.data(), t.nbytes());
  return out;
}

Tensor to_bf16(const Tensor& f32) {
  Tensor out = Tensor::empty(f32.shape(), DType::kBF16);
  const float* in = f32.data_as<float>();
  uint16_t* o = out.data_as<uint16_t>();
  for (int64_t i = 0; i < f32.numel(); ++i) o[i] = float_to_bf16(in[i]);
  return out;
}

// Where `model` holds checkpoint tensor `s` (not an MTP copy): an F32 view of its elements, or an
// undefined optional when it is another expert-parallel rank's expert.
std::optional<Tensor> held_view(Model& model, const TensorSpec& s) {
  float* at = model.held_elements(s.name);
  if (at == nullptr) return std::nullopt;
  const Parameter& p = model.parameter(s.fused_name.empty() ? s.name : s.fused_name);
  return Tensor::wrap(at, s.shape, DType::kF32, p.value.device());
}

}  // namespace

uint64_t init_stream(const std::string& name) {
  return stream_id(name);
}

io::NamedTensors init_parameters(const ModelConfig& config, uint64_t seed, DType dtype) {
  OCTET_CHECK(dtype == DType::kF32 || dtype == DType::kBF16,
              "init_parameters: dtype must be F32 or BF16, got ", dtype_name(dtype));
  const std::vector<TensorSpec> specs = expected_tensors(config);  // validates the config
  // The main model's embedding and head, for the MTP modules' copies; they come first in specs.
  std::map<std::string, Tensor> shared;
  io::NamedTensors out;
  out.reserve(specs.size());
  for (const TensorSpec& s : specs) {
    Tensor t;
    if (!s.copy_of.empty()) {  // an MTP module's copy of the shared embedding or head
      const auto it = shared.find(s.copy_of);
      OCTET_CHECK(it != shared.end(), "init_parameters: '", s.name, "' copies '", s.copy_of,
                  "', which expected_tensors did not list before it");
      t = copy_of(it->second);
    } else {
      t = init_one(s, config, seed);
      if (s.role == ParamRole::kEmbedding || s.role == ParamRole::kLmHead)
        shared.emplace(s.name, t);
    }
    if (dtype == DType::kBF16 && s.kind != TensorKind::kRouterBias) t = to_bf16(t);
    out.emplace_back(s.name, std::move(t));
  }
  return out;
}

void init_model(Context& ctx, Model& model, uint64_t seed) {
  const ModelConfig& c = model.config();
  const std::vector<TensorSpec> specs = expected_tensors(c);
  for (const TensorSpec& s : specs) {
    if (!s.copy_of.empty()) continue;  // the MTP modules read the shared embedding and head
    std::optional<Tensor> held = held_view(model, s);
    if (!held) continue;  // another expert-parallel rank's expert: initialised there
    Tensor& t = *held;
    if (!is_gaussian(s.kind)) {
      init_fill(ctx, t, s.kind == TensorKind::kNorm ? 1.0f : 0.0f);
      continue;
    }
    init_normal(
        ctx, {.out = t, .seed = seed, .stream = init_stream(s.name), .std = c.initializer_range});
    if (s.kind == TensorKind::kEmbedding) {
      if (const auto row = padding_row(c)) {
        const int64_t D = t.cols();
        ctx.be().memset(t.data_as<float>() + *row * D, 0, D * 4);
      }
    }
  }
}

}  // namespace octet
