// Parameter initialisation: the tensor list of expected_tensors, transformers' distributions
// (normal with initializer_range, norms 1, router bias 0), the documented stream of every tensor,
// the MTP copies of the shared embedding and head, BF16 rounding, and determinism: same seed same
// bits, and a tensor's values independent of what else the config adds.
#include "model/init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "backend/backend.h"
#include "core/rng.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "numerics/fp8.h"
#include "ops/init/init_normal.h"
#include "test_util.h"
#include "tiny_model.h"

namespace octet {
namespace {

using test::bitwise_equal;

ModelConfig tiny_config() {
  return test::tiny_model_config();
}

std::map<std::string, Tensor> by_name(const io::NamedTensors& ts) {
  std::map<std::string, Tensor> m;
  for (const auto& [name, t] : ts) m.emplace(name, t);
  return m;
}

bool is_gaussian(TensorKind k) {
  return k != TensorKind::kNorm && k != TensorKind::kRouterBias;
}

TEST(Init, NamesShapesAndDtypesFollowExpectedTensors) {
  ModelConfig plain = tiny_config();
  plain.q_lora_rank = std::nullopt;
  ModelConfig tied = tiny_config();
  tied.tie_word_embeddings = true;
  tied.num_nextn_predict_layers = 2;
  ModelConfig no_mtp = tiny_config();
  no_mtp.num_nextn_predict_layers = 0;
  for (const ModelConfig& c : {tiny_config(), plain, tied, no_mtp}) {
    const std::vector<TensorSpec> specs = expected_tensors(c);
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const io::NamedTensors params = init_parameters(c, 1, dt);
      ASSERT_EQ(params.size(), specs.size());
      for (size_t i = 0; i < specs.size(); ++i) {
        SCOPED_TRACE(specs[i].name);
        EXPECT_EQ(params[i].first, specs[i].name);
        EXPECT_EQ(params[i].second.shape(), specs[i].shape);
        EXPECT_EQ(params[i].second.device(), Device::kCpu);
        EXPECT_EQ(params[i].second.dtype(),
                  specs[i].kind == TensorKind::kRouterBias ? DType::kF32 : dt);
      }
    }
  }
  EXPECT_THROW(init_parameters(tiny_config(), 1, DType::kE4M3), Error);
}

TEST(Init, NormalStatisticsNormsOneBiasZero) {
  ModelConfig c = tiny_config();
  c.initializer_range = 0.037;
  const io::NamedTensors params = init_parameters(c, 5);
  const std::map<std::string, Tensor> m = by_name(params);
  double all_sum = 0, all_sq = 0;
  int64_t all_n = 0, gaussian_tensors = 0;
  for (const TensorSpec& s : expected_tensors(c)) {
    SCOPED_TRACE(s.name);
    const Tensor& t = m.at(s.name);
    const float* v = t.data_as<float>();
    if (s.kind == TensorKind::kNorm || s.kind == TensorKind::kRouterBias) {
      const float want = s.kind == TensorKind::kNorm ? 1.0f : 0.0f;
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(v[i], want) << i;
      if (s.kind == TensorKind::kRouterBias) {
        for (int64_t i = 0; i < t.numel(); ++i) ASSERT_FALSE(std::signbit(v[i]));
      }
      continue;
    }
    ++gaussian_tensors;
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      sum += v[i];
      sq += double(v[i]) * v[i];
    }
    const double n = t.numel(), mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    // The standard error of a sample sd is sd / sqrt(2n): 5% is over 5 of them from 5000 values.
    if (n >= 5000) EXPECT_NEAR(sd, c.initializer_range, 0.05 * c.initializer_range);
    EXPECT_NEAR(mean, 0.0, 5 * c.initializer_range / std::sqrt(n));
    all_sum += sum;
    all_sq += sq;
    all_n += t.numel();
  }
  EXPECT_GT(gaussian_tensors, 20);
  const double mean = all_sum / all_n, sd = std::sqrt(all_sq / all_n - mean * mean);
  EXPECT_NEAR(sd, c.initializer_range, 0.01 * c.initializer_range) << all_n << " values";
}

// The contract of init.h: element k of tensor `name` is float(range * z_k) of the stream
// (seed, stream_id(name)).
TEST(Init, EachTensorDrawsFromItsNamedStream) {
  const ModelConfig c = tiny_config();
  const uint64_t seed = 0xDEADBEEFCAFEull;
  const std::map<std::string, Tensor> m = by_name(init_parameters(c, seed));
  for (const char* name : {"model.layers.2.mlp.experts.7.down_proj.weight",
                           "model.layers.1.mlp.gate.weight", "model.embed_tokens.weight"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(init_stream(name), stream_id(name));
    const Rng rng(seed, stream_id(name));
    const Tensor& t = m.at(name);
    double z[4];
    for (int64_t k = 0; k < t.numel(); ++k) {
      if (k % 4 == 0) rng.normal4(k / 4, z);
      ASSERT_EQ(t.data_as<float>()[k], static_cast<float>(c.initializer_range * z[k % 4])) << k;
    }
  }
}

TEST(Init, MtpModulesCopyTheSharedEmbeddingAndHead) {
  ModelConfig c = tiny_config();
  c.num_nextn_predict_layers = 2;
  std::map<std::string, Tensor> m = by_name(init_parameters(c, 3));
  for (const char* layer : {"model.layers.3.", "model.layers.4."}) {
    SCOPED_TRACE(layer);
    EXPECT_TRUE(bitwise_equal(m.at("model.embed_tokens.weight"),
                              m.at(std::string(layer) + "embed_tokens.weight")));
    EXPECT_TRUE(bitwise_equal(m.at("lm_head.weight"),
                              m.at(std::string(layer) + "shared_head.head.weight")));
    // Copies, not shared buffers: updating one must not move the other.
    EXPECT_NE(m.at("lm_head.weight").data(),
              m.at(std::string(layer) + "shared_head.head.weight").data());
  }
  // Untied, the embedding and the head are distinct parameters.
  EXPECT_NE(std::memcmp(m.at("model.embed_tokens.weight").data(), m.at("lm_head.weight").data(),
                        m.at("lm_head.weight").nbytes()),
            0);

  c.tie_word_embeddings = true;
  m = by_name(init_parameters(c, 3));
  EXPECT_TRUE(bitwise_equal(m.at("model.embed_tokens.weight"),
                            m.at("model.layers.3.shared_head.head.weight")));
}

TEST(Init, SameSeedSameBitsOtherSeedOtherValues) {
  const ModelConfig c = tiny_config();
  const io::NamedTensors a = init_parameters(c, 42), b = init_parameters(c, 42);
  const io::NamedTensors other = init_parameters(c, 43);
  const std::vector<TensorSpec> specs = expected_tensors(c);
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    EXPECT_TRUE(bitwise_equal(a[i].second, b[i].second));
    if (!is_gaussian(specs[i].kind)) continue;
    const Tensor &x = a[i].second, &y = other[i].second;
    int64_t equal = 0;
    for (int64_t k = 0; k < x.numel(); ++k) equal += x.data_as<float>()[k] == y.data_as<float>()[k];
    EXPECT_LE(equal, x.numel() / 1000 + 1);
  }
  // Distinct tensors of one seed are not copies of each other either.
  const std::map<std::string, Tensor> m = by_name(a);
  EXPECT_NE(std::memcmp(m.at("model.layers.1.mlp.experts.0.up_proj.weight").data(),
                        m.at("model.layers.1.mlp.experts.1.up_proj.weight").data(),
                        m.at("model.layers.1.mlp.experts.0.up_proj.weight").nbytes()),
            0);
}

// A tensor's values depend on the seed, its name and its shape only.
TEST(Init, TensorValuesIndependentOfOtherTensors) {
  const ModelConfig base = tiny_config();
  ModelConfig more = tiny_config();
  more.num_hidden_layers = 5;
  more.num_nextn_predict_layers = 3;
  ModelConfig no_mtp = tiny_config();
  no_mtp.num_nextn_predict_layers = 0;
  const std::map<std::string, Tensor> a = by_name(init_parameters(base, 9));
  for (const ModelConfig& c : {more, no_mtp}) {
    const std::map<std::string, Tensor> b = by_name(init_parameters(c, 9));
    int64_t common = 0;
    for (const auto& [name, t] : a) {
      const auto it = b.find(name);
      if (it == b.end()) continue;
      ++common;
      EXPECT_TRUE(bitwise_equal(t, it->second)) << name;
    }
    EXPECT_GT(common, 40);
  }
  // Names alone key the streams: the 3-layer model's MTP decoder layer 3 and the 5-layer model's
  // main layer 3 have the same names and shapes, hence the same values (compared above).
}

TEST(Init, Bf16IsTheRoundedF32) {
  const ModelConfig c = tiny_config();
  const io::NamedTensors f = init_parameters(c, 11), h = init_parameters(c, 11, DType::kBF16);
  for (size_t i = 0; i < f.size(); ++i) {
    SCOPED_TRACE(f[i].first);
    const Tensor &x = f[i].second, &y = h[i].second;
    if (y.dtype() == DType::kF32) {
      EXPECT_TRUE(bitwise_equal(x, y));
      continue;
    }
    for (int64_t k = 0; k < x.numel(); ++k)
      ASSERT_EQ(y.data_as<uint16_t>()[k], float_to_bf16(x.data_as<float>()[k])) << k;
  }
}

TEST(Init, PadTokenRowIsZero) {
  ModelConfig c = tiny_config();
  c.extra["pad_token_id"] = 7;
  const std::map<std::string, Tensor> m = by_name(init_parameters(c, 2));
  const std::map<std::string, Tensor> unpadded = by_name(init_parameters(tiny_config(), 2));
  for (const char* name : {"model.embed_tokens.weight", "model.layers.3.embed_tokens.weight"}) {
    SCOPED_TRACE(name);
    const Tensor& t = m.at(name);
    const int64_t D = t.cols();
    for (int64_t r = 0; r < t.rows(); ++r) {
      for (int64_t j = 0; j < D; ++j) {
        const float v = t.data_as<float>()[r * D + j];
        if (r == 7)
          ASSERT_EQ(v, 0.0f);
        else
          ASSERT_EQ(v, unpadded.at(name).data_as<float>()[r * D + j]);
      }
    }
  }
  // lm_head has no padding row.
  EXPECT_TRUE(bitwise_equal(unpadded.at("lm_head.weight"), m.at("lm_head.weight")));
  c.extra["pad_token_id"] = -1;  // PyTorch's padding_idx counts from the end
  EXPECT_EQ(
      by_name(init_parameters(c, 2)).at("model.embed_tokens.weight").data_as<float>()[159 * 64],
      0.0f);
  c.extra["pad_token_id"] = nullptr;
  EXPECT_TRUE(bitwise_equal(unpadded.at("model.embed_tokens.weight"),
                            by_name(init_parameters(c, 2)).at("model.embed_tokens.weight")));
  c.extra["pad_token_id"] = 160;
  try {
    init_parameters(c, 2);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pad_token_id must be in [-160, 160)"), std::string::npos)
        << e.what();
  }
}

// init_model on the CPU writes init_parameters' values (today's, pinned by the test above) into
// a model's parameters, fused ones included, bit for bit; the padding row too.
TEST(Init, InitModelOnCpuIsInitParameters) {
  ModelConfig c = tiny_config();
  c.extra["pad_token_id"] = 3;
  Context cpu = make_context(Device::kCpu);
  Model m(cpu, c, Precision{recipe_preset("bf16"), DType::kBF16});
  init_model(cpu, m, 99);
  const io::NamedTensors want = init_parameters(c, 99), got = m.export_tensors(cpu);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].first, got[i].first);
    EXPECT_TRUE(bitwise_equal(want[i].second, got[i].second)) << want[i].first;
  }
}

// The host loop splits a large tensor over threads: every element is still its own definition.
TEST(Init, ThreadedHostFillIsElementwiseDefinition) {
  Context cpu = make_context(Device::kCpu);
  const int64_t n = (int64_t{1} << 20) + 3;  // several threads, a partial last block
  Tensor t = Tensor::empty({n}, DType::kF32);
  const InitNormalStats st = init_normal(cpu, {.out = t, .seed = 5, .stream = 77, .std = 0.02});
  EXPECT_EQ(st.host_elements, n);
  const Rng rng(5, 77);
  double z[4];
  for (int64_t k = 0; k < n; ++k) {
    if (k % 4 == 0) rng.normal4(k / 4, z);
    ASSERT_EQ(t.data_as<float>()[k], static_cast<float>(0.02 * z[k % 4])) << k;
    if (k % 4099 == 0) ASSERT_EQ(t.data_as<float>()[k], init_normal_value(5, 77, 0.02, k)) << k;
  }
}

}  // namespace
}  // namespace octet
