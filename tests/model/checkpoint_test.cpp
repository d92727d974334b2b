// Checkpoints: the tensor list of DeepSeek-V3's naming (hand-written for a tiny config, counted for
// the released model), round trips in every format, the release's FP8 layout, sharding, the no-MTP
// warning, one test per kind of corruption (each error must name what is wrong), and atomic
// replacement when a write is interrupted.
#include "model/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "backend/backend.h"
#include "io/safetensors_dir.h"
#include "numerics/fp8.h"
#include "ops/quantize/quantize.h"
#include "test_util.h"
#include "tiny_model.h"

namespace octet {

using io::NamedTensors;
using io::read_safetensors;
using io::SafetensorsFile;
using io::write_safetensors;

namespace {

namespace fs = std::filesystem;
using test::bitwise_equal;

enum class QLora : uint8_t { kLowRank, kNone };
enum class Tie : uint8_t { kSeparateHead, kTied };

ModelConfig tiny_config(QLora q = QLora::kLowRank, int64_t mtp = 1, Tie tie = Tie::kSeparateHead) {
  ModelConfig c = test::tiny_model_config();
  if (q != QLora::kLowRank) c.q_lora_rank.reset();
  c.tie_word_embeddings = tie == Tie::kTied;
  c.num_nextn_predict_layers = mtp;
  return c;
}

Tensor to_f32(const Tensor& bf16) {
  Tensor out = Tensor::empty(bf16.shape(), DType::kF32);
  for (int64_t i = 0; i < bf16.numel(); ++i)
    out.data_as<float>()[i] = bf16_to_float(bf16.data_as<uint16_t>()[i]);
  return out;
}
Tensor to_bf16(const Tensor& f32) {
  Tensor out = Tensor::empty(f32.shape(), DType::kBF16);
  for (int64_t i = 0; i < f32.numel(); ++i)
    out.data_as<uint16_t>()[i] = float_to_bf16(f32.data_as<float>()[i]);
  return out;
}

enum class Values : uint8_t { kF32, kBf16Exact };

// Random parameters for every expected tensor (F32; BF16-representable with kBf16Exact).
NamedTensors random_params(const ModelConfig& c, Values v, uint64_t seed = 1) {
  NamedTensors out;
  for (const TensorSpec& s : expected_tensors(c)) {
    Tensor t = v == Values::kF32 ? test::random_tensor(s.shape, DType::kF32, seed++)
                                 : to_f32(test::random_tensor(s.shape, DType::kBF16, seed++));
    out.emplace_back(s.name, t);
  }
  return out;
}

QuantTensor quantize_128(const Tensor& w) {
  Context ctx = make_context(Device::kCpu);
  QuantizeArgs a;
  a.input = w;
  a.granularity = Granularity::k128x128;
  return quantize(ctx, a);
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("octet_checkpoint_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string dir(const std::string& name = "ckpt") const { return (root_ / name).string(); }
  std::string file(const std::string& name, const std::string& d = "ckpt") const {
    return (root_ / d / name).string();
  }
  std::vector<std::string> listing(const std::string& d) const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(d)) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }

  fs::path root_;
};

std::map<std::string, Tensor> as_map(const NamedTensors& t) {
  return {t.begin(), t.end()};
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}
void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(2);
}

// Rewrites a safetensors file through `edit`.
template <typename F>
void rewrite(const std::string& path, F edit) {
  SafetensorsFile f = read_safetensors(path);
  edit(f.tensors);
  write_safetensors(path, f.tensors, f.metadata);
}

// Expects read_checkpoint(d) to throw with every fragment in the message.
void expect_read_error(const std::string& d, std::initializer_list<std::string> fragments) {
  try {
    read_checkpoint(d);
    ADD_FAILURE() << "no error reading " << d;
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
  }
}

TEST_F(CheckpointTest, ExpectedTensorsMatchHandWrittenList) {
  // 2 layers (the first dense), 2 experts, 1 shared expert, q_lora 48, 1 MTP layer, separate head.
  ModelConfig c = tiny_config();
  c.num_hidden_layers = 2;
  c.n_routed_experts = 2;
  c.n_group = 1;
  c.num_experts_per_tok = 1;
  using K = TensorKind;
  std::vector<std::tuple<std::string, Shape, K>> want = {
      {"model.embed_tokens.weight", {160, 64}, K::kEmbedding}};
  auto attention = [&](const std::string& p) {
    want.insert(want.end(), {{p + "input_layernorm.weight", {64}, K::kNorm},
                             {p + "self_attn.q_a_proj.weight", {48, 64}, K::kLinear},
                             {p + "self_attn.q_a_layernorm.weight", {48}, K::kNorm},
                             {p + "self_attn.q_b_proj.weight", {192, 48}, K::kLinear},
                             {p + "self_attn.kv_a_proj_with_mqa.weight", {48, 64}, K::kLinear},
                             {p + "self_attn.kv_a_layernorm.weight", {32}, K::kNorm},
                             {p + "self_attn.kv_b_proj.weight", {256, 32}, K::kLinear},
                             {p + "self_attn.o_proj.weight", {64, 128}, K::kLinear},
                             {p + "post_attention_layernorm.weight", {64}, K::kNorm}});
  };
  auto moe = [&](const std::string& p) {
    want.insert(want.end(), {{p + "mlp.gate.weight", {2, 64}, K::kRouterGate},
                             {p + "mlp.gate.e_score_correction_bias", {2}, K::kRouterBias},
                             {p + "mlp.experts.0.gate_proj.weight", {32, 64}, K::kLinear},
                             {p + "mlp.experts.0.up_proj.weight", {32, 64}, K::kLinear},
                             {p + "mlp.experts.0.down_proj.weight", {64, 32}, K::kLinear},
                             {p + "mlp.experts.1.gate_proj.weight", {32, 64}, K::kLinear},
                             {p + "mlp.experts.1.up_proj.weight", {32, 64}, K::kLinear},
                             {p + "mlp.experts.1.down_proj.weight", {64, 32}, K::kLinear},
                             {p + "mlp.shared_experts.gate_proj.weight", {32, 64}, K::kLinear},
                             {p + "mlp.shared_experts.up_proj.weight", {32, 64}, K::kLinear},
                             {p + "mlp.shared_experts.down_proj.weight", {64, 32}, K::kLinear}});
  };
  attention("model.layers.0.");
  want.insert(want.end(), {{"model.layers.0.mlp.gate_proj.weight", {200, 64}, K::kLinear},
                           {"model.layers.0.mlp.up_proj.weight", {200, 64}, K::kLinear},
                           {"model.layers.0.mlp.down_proj.weight", {64, 200}, K::kLinear}});
  attention("model.layers.1.");
  moe("model.layers.1.");
  want.insert(want.end(), {{"model.norm.weight", {64}, K::kNorm},
                           {"lm_head.weight", {160, 64}, K::kHead},
                           {"model.layers.2.embed_tokens.weight", {160, 64}, K::kEmbedding},
                           {"model.layers.2.enorm.weight", {64}, K::kNorm},
                           {"model.layers.2.hnorm.weight", {64}, K::kNorm},
                           {"model.layers.2.eh_proj.weight", {64, 128}, K::kMtpProjection}});
  attention("model.layers.2.");
  moe("model.layers.2.");
  want.insert(want.end(), {{"model.layers.2.shared_head.norm.weight", {64}, K::kNorm},
                           {"model.layers.2.shared_head.head.weight", {160, 64}, K::kHead}});

  const std::vector<TensorSpec> got = expected_tensors(c);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].name, std::get<0>(want[i])) << i;
    EXPECT_EQ(got[i].shape, std::get<1>(want[i])) << got[i].name;
    EXPECT_EQ(got[i].kind, std::get<2>(want[i])) << got[i].name;
    const bool mtp = got[i].name.rfind("model.layers.2.", 0) == 0;
    EXPECT_EQ(got[i].mtp_depth, mtp ? 0 : -1) << got[i].name;
  }
}

TEST_F(CheckpointTest, ExpectedTensorsWithoutQLoraTiedAndDeeperMtp) {
  const ModelConfig c = tiny_config(QLora::kNone, 2, Tie::kTied);
  std::map<std::string, TensorSpec> by_name;
  for (const TensorSpec& s : expected_tensors(c)) by_name[s.name] = s;
  EXPECT_EQ(by_name.at("model.layers.0.self_attn.q_proj.weight").shape, (Shape{192, 64}));
  EXPECT_EQ(by_name.count("model.layers.0.self_attn.q_a_proj.weight"), 0u);
  EXPECT_EQ(by_name.count("model.layers.0.self_attn.q_a_layernorm.weight"), 0u);
  EXPECT_EQ(by_name.count("lm_head.weight"), 0u);
  EXPECT_EQ(by_name.at("model.layers.4.mlp.experts.7.down_proj.weight").mtp_depth, 1);
  EXPECT_EQ(by_name.at("model.layers.4.shared_head.head.weight").shape, (Shape{160, 64}));
  EXPECT_EQ(by_name.count("model.layers.5.enorm.weight"), 0u);
  // embed, a dense layer of 10, two MoE layers of 36, norm (no lm_head); per MTP layer 4 + 36 + 2.
  EXPECT_EQ(by_name.size(), 1u + 10u + 2u * 36u + 1u + 2u * (4u + 36u + 2u));
}

// DeepSeek-V3's released index lists 91991 tensors: every parameter plus one weight_scale_inv per
// FP8 Linear weight.
TEST_F(CheckpointTest, ExpectedTensorsCountMatchesTheDeepSeekV3Release) {
  const std::vector<TensorSpec> specs = expected_tensors(ModelConfig{});
  size_t linear = 0;
  for (const TensorSpec& s : specs) linear += s.kind == TensorKind::kLinear;
  EXPECT_EQ(specs.size() + linear, 91991u);
}

// The model's fused parameters derive from the same list as the checkpoint names: every fused
// parameter is tiled exactly once by the tensors that name it, with one shape.
TEST(ExpectedTensors, FusedLocationsTileTheFusedParameters) {
  const ModelConfig c = test::tiny_model_config();
  std::map<std::string, Shape> shapes;
  std::map<std::string, std::vector<int>> cover;
  for (const TensorSpec& s : expected_tensors(c)) {
    if (s.fused_name.empty()) continue;
    auto [it, fresh] = shapes.emplace(s.fused_name, s.fused_shape);
    EXPECT_EQ(it->second, s.fused_shape) << s.name;
    std::vector<int>& v = cover[s.fused_name];
    v.resize(static_cast<size_t>(shape_numel(s.fused_shape)));
    ASSERT_LE(s.fused_offset + shape_numel(s.shape), shape_numel(s.fused_shape)) << s.name;
    for (int64_t i = 0; i < shape_numel(s.shape); ++i) ++v[static_cast<size_t>(s.fused_offset + i)];
  }
  for (const auto& [name, v] : cover)
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], 1) << name << " element " << i;
  // One of each kind, by hand: a dense MLP, a routed expert's up_proj, a shared expert.
  const int64_t D = c.hidden_size, I = c.intermediate_size, F = c.moe_intermediate_size;
  const int64_t E = c.n_routed_experts;
  std::map<std::string, const TensorSpec*> by;
  const std::vector<TensorSpec> specs = expected_tensors(c);
  for (const TensorSpec& s : specs) by[s.name] = &s;
  const TensorSpec& up0 = *by.at("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(up0.fused_name, "model.layers.0.mlp.gate_up_proj.weight");
  EXPECT_EQ(up0.fused_offset, I * D);
  EXPECT_EQ(up0.fused_shape, (Shape{2 * I, D}));
  const TensorSpec& e3 = *by.at("model.layers.1.mlp.experts.3.up_proj.weight");
  EXPECT_EQ(e3.fused_name, "model.layers.1.mlp.experts.gate_up_proj");
  EXPECT_EQ(e3.fused_offset, 7 * F * D);
  EXPECT_EQ(e3.fused_shape, (Shape{E, 2 * F, D}));
  EXPECT_EQ(by.at("model.layers.1.mlp.experts.3.down_proj.weight")->fused_offset, 3 * D * F);
  EXPECT_EQ(by.at("model.layers.1.mlp.shared_experts.gate_proj.weight")->fused_name,
            "model.layers.1.mlp.shared_experts.gate_up_proj.weight");
  EXPECT_TRUE(by.at("model.layers.0.mlp.down_proj.weight")->fused_name.empty());
  EXPECT_TRUE(by.at("model.layers.0.self_attn.o_proj.weight")->fused_name.empty());
}

TEST_F(CheckpointTest, RoundTripAsIsIsBitExact) {
  const ModelConfig c = tiny_config(QLora::kLowRank, 1, Tie::kSeparateHead);
  NamedTensors params = random_params(c, Values::kF32);
  params[3].second = to_bf16(params[3].second);  // kAsIs keeps each tensor's own dtype
  write_checkpoint(dir(), c, params);
  EXPECT_EQ(listing(dir()), (std::vector<std::string>{"config.json", "model.safetensors"}));
  const LoadedCheckpoint got = read_checkpoint(dir());
  EXPECT_TRUE(got.warnings.empty());
  EXPECT_FALSE(got.stored_fp8);
  ASSERT_EQ(got.tensors.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(got.tensors[i].first, params[i].first);
    EXPECT_TRUE(bitwise_equal(params[i].second, got.tensors[i].second)) << params[i].first;
  }
  EXPECT_EQ(got.config.q_lora_rank, c.q_lora_rank);
  EXPECT_EQ(got.config.extra.at("torch_dtype"), "float32");
  EXPECT_FALSE(got.config.extra.contains("quantization_config"));
}

TEST_F(CheckpointTest, RoundTripBf16IsBitExactAndKeepsTheBiasInF32) {
  const ModelConfig c = tiny_config(QLora::kNone, 2, Tie::kTied);
  const NamedTensors params = random_params(c, Values::kBf16Exact);
  write_checkpoint(dir(), c, params, {.format = CheckpointFormat::kBf16});
  const LoadedCheckpoint stored = read_checkpoint(dir());
  for (const auto& [name, t] : stored.tensors) {
    const bool bias = name.find("e_score_correction_bias") != std::string::npos;
    EXPECT_EQ(t.dtype(), bias ? DType::kF32 : DType::kBF16) << name;
  }
  const LoadedCheckpoint wide = read_checkpoint(dir(), {.cast = ReadCast::kToF32});
  ASSERT_EQ(wide.tensors.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(bitwise_equal(params[i].second, wide.tensors[i].second)) << params[i].first;
  EXPECT_EQ(wide.config.extra.at("torch_dtype"), "bfloat16");
}

TEST_F(CheckpointTest, Fp8RoundTripEqualsQuantizeDequantizeInTheReleaseLayout) {
  const ModelConfig c = tiny_config(QLora::kLowRank, 1, Tie::kSeparateHead);
  const NamedTensors params = random_params(c, Values::kF32);
  const std::map<std::string, Tensor> original = as_map(params);
  write_checkpoint(dir(), c, params, {.format = CheckpointFormat::kFp8});

  // The files: F8_E4M3 + F32 weight_scale_inv for Linear weights, the release's dtypes otherwise.
  const SafetensorsFile f = read_safetensors(file("model.safetensors"));
  EXPECT_EQ(f.metadata.at("format"), "pt");
  Context ctx = make_context(Device::kCpu);
  for (const TensorSpec& s : expected_tensors(c)) {
    const Tensor& w = f.at(s.name);
    if (s.kind != TensorKind::kLinear) {
      EXPECT_FALSE(f.contains(fp8_scale_name(s.name))) << s.name;
      EXPECT_EQ(w.dtype(), s.kind == TensorKind::kRouterBias ? DType::kF32 : DType::kBF16)
          << s.name;
      continue;
    }
    const QuantTensor q = quantize_128(original.at(s.name));
    EXPECT_TRUE(bitwise_equal(q.data, w)) << s.name;
    const Tensor& scale = f.at(fp8_scale_name(s.name));
    EXPECT_EQ(scale.shape(), (Shape{(s.shape[0] + 127) / 128, (s.shape[1] + 127) / 128})) << s.name;
    EXPECT_TRUE(bitwise_equal(q.scale_inv, scale)) << s.name;
  }
  EXPECT_EQ(f.at("model.layers.0.mlp.gate_proj.weight_scale_inv").shape(), (Shape{2, 1}));
  EXPECT_EQ(f.at("model.layers.0.self_attn.kv_b_proj.weight_scale_inv").shape(), (Shape{2, 1}));
  const nlohmann::json qc = read_json(file("config.json")).at("quantization_config");
  EXPECT_EQ(qc, nlohmann::json::parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3",
      "quant_method": "fp8", "weight_block_size": [128, 128]})"));

  // Read back dequantized: bitwise quantize + dequantize of the original.
  const LoadedCheckpoint got = read_checkpoint(dir());
  EXPECT_TRUE(got.stored_fp8);
  for (const TensorSpec& s : expected_tensors(c)) {
    const Tensor& t = got.at(s.name);
    if (s.kind == TensorKind::kLinear) {
      const Tensor want = dequantize(ctx, quantize_128(original.at(s.name)), DType::kF32);
      EXPECT_TRUE(bitwise_equal(want, t)) << s.name;
    } else if (s.kind != TensorKind::kRouterBias) {
      EXPECT_TRUE(bitwise_equal(to_bf16(original.at(s.name)), t)) << s.name;
    }
  }

  // Kept in FP8, then written again as given: the same files, byte for byte.
  const LoadedCheckpoint kept = read_checkpoint(dir(), {.fp8_weights = Fp8Weights::kKeep});
  NamedTensors again = kept.tensors;
  for (const auto& [name, q] : kept.quantized) {
    EXPECT_EQ(q.granularity, Granularity::k128x128);
    again.emplace_back(name, q.data);
    again.emplace_back(fp8_scale_name(name), q.scale_inv);
  }
  EXPECT_EQ(kept.quantized.size() + kept.tensors.size(), expected_tensors(c).size());
  write_checkpoint(dir("again"), kept.config, again, {.format = CheckpointFormat::kFp8});
  std::ifstream a(file("model.safetensors")), b(file("model.safetensors", "again"));
  EXPECT_TRUE(std::equal(std::istreambuf_iterator<char>(a), {}, std::istreambuf_iterator<char>(b)));
  // And as BF16: the release's FP8 weights are dequantized (fp8_cast_bf16.py), the config unmarked.
  write_checkpoint(dir("bf16"), kept.config, again, {.format = CheckpointFormat::kBf16});
  const LoadedCheckpoint bf = read_checkpoint(dir("bf16"));
  EXPECT_FALSE(bf.stored_fp8);
  EXPECT_FALSE(bf.config.extra.contains("quantization_config"));
  const Tensor w =
      dequantize(ctx, kept.quantized.at("model.layers.1.self_attn.o_proj.weight"), DType::kBF16);
  EXPECT_TRUE(bitwise_equal(w, bf.at("model.layers.1.self_attn.o_proj.weight")));
}

TEST_F(CheckpointTest, ShardsWithAnIndex) {
  const ModelConfig c = tiny_config(QLora::kLowRank, 1, Tie::kSeparateHead);
  const NamedTensors params = random_params(c, Values::kF32);
  const int64_t shard_bytes = 100'000;
  write_checkpoint(dir(), c, params,
                   {.format = CheckpointFormat::kFp8, .shard_bytes = shard_bytes});
  const nlohmann::json index = read_json(file("model.safetensors.index.json"));
  const auto& wm = index.at("weight_map");
  std::set<std::string> files;
  for (const auto& [name, f] : wm.items()) files.insert(f.get<std::string>());
  ASSERT_GE(files.size(), 4u);
  const size_t n = files.size();
  int64_t total = 0;
  size_t listed = 0;
  for (size_t i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    ASSERT_TRUE(files.count(name)) << name;
    const SafetensorsFile f = read_safetensors(file(name));
    int64_t bytes = 0;
    for (const auto& [t, v] : f.tensors) {
      EXPECT_EQ(wm.at(t), name) << t;
      if (t.find("_scale_inv") != std::string::npos)  // a weight and its scales share a shard
        EXPECT_TRUE(f.contains(t.substr(0, t.size() - 10))) << t;
      bytes += v.nbytes();
      ++listed;
    }
    EXPECT_TRUE(bytes <= shard_bytes || f.tensors.size() <= 2) << name;
    total += bytes;
  }
  EXPECT_EQ(listed, wm.size());
  EXPECT_EQ(index.at("metadata").at("total_size").get<int64_t>(), total);
  // Name order as given: shard numbers never decrease along params.
  std::string last;
  for (const auto& [name, t] : params) {
    EXPECT_GE(wm.at(name).get<std::string>(), last) << name;
    last = wm.at(name).get<std::string>();
  }
  const LoadedCheckpoint got = read_checkpoint(dir());
  EXPECT_EQ(got.tensors.size(), params.size());
}

TEST_F(CheckpointTest, NoMtpLayersLoadWithAWarning) {
  const ModelConfig with_mtp = tiny_config(QLora::kLowRank, 1, Tie::kSeparateHead);
  const ModelConfig without = tiny_config(QLora::kLowRank, 0, Tie::kSeparateHead);
  write_checkpoint(dir(), without, random_params(without, Values::kF32));
  write_model_config(file("config.json"), with_mtp);  // as transformers saves a DeepSeek-V3 model
  const LoadedCheckpoint got = read_checkpoint(dir());
  ASSERT_EQ(got.warnings.size(), 1u);
  EXPECT_NE(got.warnings[0].find("no Multi-Token Prediction layers"), std::string::npos);
  EXPECT_NE(got.warnings[0].find("model.layers.3.embed_tokens.weight"), std::string::npos);
  std::vector<std::string> mtp;
  for (const TensorSpec& s : expected_tensors(with_mtp))
    if (s.mtp_depth >= 0) mtp.push_back(s.name);
  EXPECT_EQ(got.missing_mtp, mtp);
  // The warning names the count and the first three, not dozens of names.
  ASSERT_GT(mtp.size(), 3u);
  EXPECT_NE(got.warnings[0].find(std::to_string(mtp.size()) + " tensors to initialise afresh"),
            std::string::npos)
      << got.warnings[0];
  EXPECT_NE(got.warnings[0].find(mtp[2] + " and " + std::to_string(mtp.size() - 3) + " more"),
            std::string::npos)
      << got.warnings[0];
  EXPECT_EQ(got.warnings[0].find(mtp[3] + ","), std::string::npos) << got.warnings[0];
  EXPECT_EQ(got.tensors.size(), expected_tensors(without).size());

  // Some MTP tensors but not all: an error naming the missing one.
  write_checkpoint(dir(), with_mtp, random_params(with_mtp, Values::kF32));
  rewrite(file("model.safetensors"), [](NamedTensors& t) {
    std::erase_if(t, [](const auto& nt) { return nt.first == "model.layers.3.hnorm.weight"; });
  });
  expect_read_error(dir(), {"missing tensor", "model.layers.3.hnorm.weight [64]"});

  // MTP tensors a config with num_nextn_predict_layers = 0 does not declare: an error with a hint.
  write_checkpoint(dir(), with_mtp, random_params(with_mtp, Values::kF32));
  write_model_config(file("config.json"), without);
  expect_read_error(dir(), {"unexpected tensors", "model.layers.3.", "undeclared MTP layers"});
}

class CheckpointCorruptionTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    c_ = tiny_config();
    write_checkpoint(dir(), c_, random_params(c_, Values::kF32),
                     {.format = CheckpointFormat::kFp8, .shard_bytes = 100'000});
    index_ = read_json(file("model.safetensors.index.json"));
  }
  std::string shard_of(const std::string& name) const {
    return index_.at("weight_map").at(name).get<std::string>();
  }
  ModelConfig c_;
  nlohmann::json index_;
};

TEST_F(CheckpointCorruptionTest, ReadsCleanly) {
  EXPECT_NO_THROW(read_checkpoint(dir()));
}

TEST_F(CheckpointCorruptionTest, MissingTensor) {
  const std::string name = "model.layers.1.mlp.experts.5.up_proj.weight";
  rewrite(file(shard_of(name)), [&](NamedTensors& t) {
    std::erase_if(t, [&](const auto& nt) { return nt.first.rfind(name, 0) == 0; });
  });
  index_["weight_map"].erase(name);
  index_["weight_map"].erase(fp8_scale_name(name));
  write_json(file("model.safetensors.index.json"), index_);
  expect_read_error(dir(), {"missing tensor", name + " [32, 64]"});
}

TEST_F(CheckpointCorruptionTest, ExtraTensor) {
  const std::string shard = shard_of("model.norm.weight");
  rewrite(file(shard), [](NamedTensors& t) {
    t.emplace_back("model.layers.0.mlp.experts.0.up_proj.weight",
                   test::random_tensor({32, 64}, DType::kBF16, 5));
  });
  index_["weight_map"]["model.layers.0.mlp.experts.0.up_proj.weight"] = shard;
  write_json(file("model.safetensors.index.json"), index_);
  expect_read_error(dir(),
                    {"unexpected tensor", shard, "model.layers.0.mlp.experts.0.up_proj.weight"});
}

TEST_F(CheckpointCorruptionTest, WrongShape) {
  const std::string name = "model.layers.2.self_attn.kv_a_layernorm.weight";
  rewrite(file(shard_of(name)), [&](NamedTensors& t) {
    for (auto& [n, v] : t)
      if (n == name) v = test::random_tensor({31}, DType::kBF16, 6);
  });
  expect_read_error(dir(), {name, "expected shape [32], got [31]", shard_of(name)});
}

TEST_F(CheckpointCorruptionTest, Fp8WeightWithoutScales) {
  const std::string name = "model.layers.0.self_attn.o_proj.weight";
  rewrite(file(shard_of(name)), [&](NamedTensors& t) {
    std::erase_if(t, [&](const auto& nt) { return nt.first == fp8_scale_name(name); });
  });
  index_["weight_map"].erase(fp8_scale_name(name));
  write_json(file("model.safetensors.index.json"), index_);
  expect_read_error(dir(), {name, "F8_E4M3 but its scales", fp8_scale_name(name), "missing"});
}

TEST_F(CheckpointCorruptionTest, MissingShard) {
  const std::string shard = shard_of("model.layers.2.mlp.gate.weight");
  fs::remove(file(shard));
  expect_read_error(dir(), {shard, "missing", "maps tensor"});
}

TEST_F(CheckpointCorruptionTest, IndexListsATensorItsShardLacks) {
  const std::string name = "model.layers.1.mlp.gate.weight";
  const std::string other = shard_of("model.embed_tokens.weight");
  ASSERT_NE(other, shard_of(name));
  index_["weight_map"][name] =
      other;  // the tensor is in its real shard, the index points elsewhere
  write_json(file("model.safetensors.index.json"), index_);
  expect_read_error(dir(), {name, other});
}

TEST_F(CheckpointCorruptionTest, ShardHoldsATensorTheIndexLacks) {
  const std::string name = "model.layers.2.post_attention_layernorm.weight";
  const std::string shard = shard_of(name);
  index_["weight_map"].erase(name);
  write_json(file("model.safetensors.index.json"), index_);
  expect_read_error(dir(), {name, shard, "not listed in model.safetensors.index.json"});
}

TEST_F(CheckpointCorruptionTest, DuplicateAcrossShards) {
  const std::string name = "model.norm.weight";
  const std::string other = shard_of("model.embed_tokens.weight");
  ASSERT_NE(other, shard_of(name));
  const Tensor copy = read_safetensors(file(shard_of(name))).at(name);
  rewrite(file(other), [&](NamedTensors& t) { t.emplace_back(name, copy); });
  expect_read_error(dir(), {name, "duplicate", other, shard_of(name)});
}

// A file name the file system cannot hold (longer than NAME_MAX) reads as a file that cannot be
// opened, one octet::Error naming it, not a std::filesystem_error (found by
// fuzz/fuzz_checkpoint_index: the input kept as fuzz/corpus/checkpoint_index/crash_name_too_long).
TEST_F(CheckpointCorruptionTest, AFileNameTooLongForTheFileSystemIsOneError) {
  const std::string name = "model.norm.weight", file_name = std::string(300, 'n') + ".safetensors";
  index_["weight_map"][name] = file_name;
  write_json(file("model.safetensors.index.json"), index_);
  expect_read_error(dir(), {file_name, "cannot open (File name too long)", "maps tensor '" + name});
  // And a checkpoint directory whose own name is too long.
  expect_read_error(dir() + "/" + std::string(300, 'd'), {"not a checkpoint directory"});
}

TEST_F(CheckpointCorruptionTest, TruncatedShard) {
  const std::string shard = shard_of("model.layers.1.self_attn.o_proj.weight");
  fs::resize_file(file(shard), fs::file_size(file(shard)) - 7);
  expect_read_error(dir(), {shard});
}

// The index as read_checkpoint reads it (io::parse_safetensors_index, also the fuzz harness's
// entry): a tensor listed twice and a file name that is not a plain name inside the directory are
// refused, naming the index; a FIFO in the index's place is refused instead of blocking the reader.
TEST_F(CheckpointCorruptionTest, IndexListsATensorTwiceOrAFileOutsideTheDirectory) {
  const std::string name = "model.norm.weight";
  std::string text = index_.dump();
  const std::string entry = "\"" + name + "\":\"" + shard_of(name) + "\"";
  ASSERT_NE(text.find(entry), std::string::npos);
  text.insert(text.find(entry), "\"" + name + "\":\"" + shard_of("lm_head.weight") + "\",");
  std::ofstream(file("model.safetensors.index.json"), std::ios::trunc) << text;
  expect_read_error(dir(), {"model.safetensors.index.json", "lists tensor '" + name + "' twice"});

  const std::map<std::string, std::string> map =
      io::parse_safetensors_index(index_.dump(), "index.json");
  EXPECT_EQ(map.size(), index_.at("weight_map").size());
  EXPECT_EQ(map.at(name), shard_of(name));
  for (const std::string& bad : {std::string("../x.safetensors"), std::string(".."),
                                 std::string("."), std::string(), std::string("a\0b", 3)}) {
    nlohmann::json j = index_;
    j["weight_map"][name] = bad;
    try {
      io::parse_safetensors_index(j.dump(), "index.json");
      ADD_FAILURE() << "accepted file name '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("index.json: weight_map['" + name + "']"),
                std::string::npos)
          << e.what();
    }
  }

  fs::remove(file("model.safetensors.index.json"));
  ASSERT_EQ(::mkfifo(file("model.safetensors.index.json").c_str(), 0600), 0);
  expect_read_error(dir(), {"model.safetensors.index.json", "not a regular file"});
}

TEST_F(CheckpointTest, WriteRejectsMissingMisshapenAndDuplicateParams) {
  const ModelConfig c = tiny_config(QLora::kNone, 0, Tie::kTied);
  NamedTensors params = random_params(c, Values::kF32);
  auto expect_write_error = [&](const NamedTensors& p, const std::string& fragment) {
    try {
      write_checkpoint(dir(), c, p);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir()));
  };
  NamedTensors missing(params.begin() + 1, params.end());
  expect_write_error(missing, "missing tensor model.embed_tokens.weight [160, 64]");
  NamedTensors bad = params;
  bad[1].second = test::random_tensor({65}, DType::kF32, 7);
  expect_write_error(bad, "expected shape [64], got [65]");
  NamedTensors twice = params;
  twice.push_back(params[0]);
  expect_write_error(twice, "given twice");
  NamedTensors extra = params;
  extra.emplace_back("lm_head.weight",
                     test::random_tensor({160, 64}, DType::kF32, 8));  // tied: no lm_head
  expect_write_error(extra, "unexpected tensor params: tensor 'lm_head.weight'");
}

TEST_F(CheckpointTest, InterruptedWriteLeavesThePreviousCheckpoint) {
  const ModelConfig c = tiny_config();
  const NamedTensors first = random_params(c, Values::kF32, 1);
  const NamedTensors second = random_params(c, Values::kF32, 1000);
  const CheckpointWriteOptions sharded{.format = CheckpointFormat::kAsIs, .shard_bytes = 200'000};
  write_checkpoint(dir(), c, first, sharded);
  const std::vector<std::string> before = listing(dir());
  auto expect_first = [&] {
    const LoadedCheckpoint got = read_checkpoint(dir());
    ASSERT_EQ(got.tensors.size(), first.size());
    for (size_t i = 0; i < first.size(); ++i)
      ASSERT_TRUE(bitwise_equal(first[i].second, got.tensors[i].second)) << first[i].first;
    EXPECT_EQ(listing(dir()), before);
    EXPECT_EQ(listing(root_.string()), std::vector<std::string>{"ckpt"});  // no staging left
  };

  // A directory in the way of the second shard: its rename fails mid-write.
  CheckpointWriteOptions blocked = sharded;
  blocked.progress = [](const std::string& f, int64_t, int64_t) {
    const fs::path p(f);
    std::string next = p.filename().string();
    if (next.rfind("model-00001-of-", 0) != 0) return;
    next.replace(0, 11, "model-00002");
    fs::create_directories(p.parent_path() / next / "x");
  };
  EXPECT_THROW(write_checkpoint(dir(), c, second, blocked), Error);
  expect_first();

  // Failing after the index, just before the swap.
  CheckpointWriteOptions late = sharded;
  late.progress = [](const std::string& f, int64_t, int64_t) {
    if (fs::path(f).filename() == "model.safetensors.index.json") OCTET_THROW("simulated crash");
  };
  EXPECT_THROW(write_checkpoint(dir(), c, second, late), Error);
  expect_first();
}

TEST_F(CheckpointTest, OverwriteReplacesShardsAndKeepsOtherFiles) {
  const ModelConfig c = tiny_config();
  write_checkpoint(dir(), c, random_params(c, Values::kF32, 1), {.shard_bytes = 200'000});
  std::ofstream(file("tokenizer.json")) << "{}";
  // A user's file with ".tmp." in its name is kept; a temporary that a crashed AtomicFile writer
  // of one of the checkpoint's own files left is not carried over.
  std::ofstream(file("notes.tmp.txt")) << "mine";
  std::ofstream(file("config.json.tmp.123.0badf00d")) << "half";
  // A directory that looks like a staging directory of this pid is not ours: the writer's staging
  // gets a fresh name (mkdtemp) and never reuses, reads or removes it.
  const std::string lookalike = "ckpt.tmp." + std::to_string(::getpid());
  fs::create_directories(root_ / lookalike / "junk");
  const NamedTensors second = random_params(c, Values::kBf16Exact, 77);
  write_checkpoint(dir() + "/", c, second, {.format = CheckpointFormat::kBf16});
  EXPECT_EQ(listing(dir()), (std::vector<std::string>{"config.json", "model.safetensors",
                                                      "notes.tmp.txt", "tokenizer.json"}));
  EXPECT_EQ(listing(root_.string()), (std::vector<std::string>{"ckpt", lookalike}));
  EXPECT_TRUE(fs::is_directory(root_ / lookalike / "junk"));
  const LoadedCheckpoint got = read_checkpoint(dir(), {.cast = ReadCast::kToF32});
  for (size_t i = 0; i < second.size(); ++i)
    EXPECT_TRUE(bitwise_equal(second[i].second, got.tensors[i].second)) << second[i].first;
}

}  // namespace
}  // namespace octet
