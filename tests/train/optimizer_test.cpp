#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

#include "backend/backend.h"
#include "core/context.h"
#include "io/safetensors.h"
#include "numerics/fp8.h"
#include "test_util.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"

namespace octet::train {
namespace {

using test::bitwise_equal;
using test::random_tensor;

Tensor copy(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), t.dtype());
  std::memcpy(out.data(), t.data(), static_cast<size_t>(t.nbytes()));
  return out;
}

void fill_from(Tensor& dst, const Tensor& src) {
  ASSERT_EQ(dst.nbytes(), src.nbytes());
  std::memcpy(dst.data(), src.data(), static_cast<size_t>(src.nbytes()));
}

// Owns parameters for a test: stable addresses, as the optimizer keeps pointers.
struct Model {
  std::vector<std::unique_ptr<Parameter>> params;

  Parameter& add(const std::string& name, const Shape& shape, uint64_t seed, bool decay = true) {
    auto p = std::make_unique<Parameter>();
    p->name = name;
    p->value = random_tensor(shape, DType::kF32, seed);
    p->grad = random_tensor(shape, DType::kF32, seed + 1000);
    p->weight_decay = decay;
    params.push_back(std::move(p));
    return *params.back();
  }
  std::vector<Parameter*> ptrs() {
    std::vector<Parameter*> out;
    for (auto& p : params) out.push_back(p.get());
    return out;
  }
};

// Two parameters of odd shapes (one without weight decay) and a frozen one.
Model small_model(uint64_t seed) {
  Model m;
  m.add("model.layers.0.mlp.gate_proj.weight", {37, 5}, seed);
  m.add("model.norm.weight", {131}, seed + 1, /*decay=*/false);
  Parameter& bias = m.add("model.layers.1.mlp.gate.e_score_correction_bias", {8}, seed + 2, false);
  bias.trainable = false;
  bias.grad = Tensor();
  return m;
}

float read_scalar(const Tensor& t) {
  return t.data_as<float>()[0];
}

TEST(Optimizer, QuadraticToyProblemConverges) {
  Context ctx = make_context(Device::kCpu);
  Model m = small_model(11);
  const Tensor target_a = random_tensor({37, 5}, DType::kF32, 91);
  const Tensor target_b = random_tensor({131}, DType::kF32, 92);
  const Tensor targets[] = {target_a, target_b};
  AdamWConfig cfg;
  cfg.weight_decay = 0.0f;  // the minimum of the plain quadratic is the target
  AdamWOptimizer opt(ctx, m.ptrs(), cfg);
  LrSchedule sched;
  sched.lr = 0.1;
  sched.min_lr = 1e-3;
  sched.warmup_steps = 10;
  sched.total_steps = 300;
  // loss = sum 0.5 * (p - target)^2, grad = p - target.
  auto loss_and_grad = [&]() {
    double loss = 0;
    for (int i = 0; i < 2; ++i) {
      Parameter& p = *m.params[static_cast<size_t>(i)];
      const float* x = p.value.data_as<float>();
      const float* t = targets[i].data_as<float>();
      float* g = p.grad.data_as<float>();
      for (int64_t j = 0; j < p.value.numel(); ++j) {
        g[j] = x[j] - t[j];
        loss += 0.5 * double(g[j]) * g[j];
      }
    }
    return loss;
  };
  const double initial = loss_and_grad();
  for (int64_t s = 0; s < sched.total_steps; ++s) {
    opt.zero_grad(ctx);
    loss_and_grad();
    opt.step(ctx, static_cast<float>(lr_at(sched, s)));
    ASSERT_FALSE(opt.finish_step(ctx).skipped);
  }
  const double final_loss = loss_and_grad();
  EXPECT_LT(final_loss, 1e-4 * initial) << "initial " << initial << " final " << final_loss;
  EXPECT_EQ(opt.steps_taken(), sched.total_steps);
}

TEST(Optimizer, ClippingScalesTheGradientsAsComputedByHand) {
  Context ctx = make_context(Device::kCpu);
  Model m;
  Parameter& p = m.add("w", {64, 3}, 5);
  AdamWConfig cfg;
  cfg.grad_clip = 0.5f;
  cfg.eps = 0.05f;  // comparable to the clipped gradients, so the update depends on their scale
  cfg.weight_decay = 0.1f;
  const float lr = 0.01f;
  const Tensor p0 = copy(p.value);
  AdamWOptimizer opt(ctx, m.ptrs(), cfg);
  opt.step(ctx, lr);
  const StepStats st = opt.finish_step(ctx);

  const float* g = p.grad.data_as<float>();
  double sumsq = 0;
  for (int64_t i = 0; i < p.grad.numel(); ++i) sumsq += double(g[i]) * g[i];
  const double norm = std::sqrt(sumsq);
  const double coef = cfg.grad_clip / (norm + 1e-6);
  ASSERT_LT(coef, 0.1);  // clipping is active
  EXPECT_NEAR(st.grad_norm, norm, 1e-6 * norm);
  EXPECT_NEAR(st.clip_coef, coef, 1e-6 * coef);
  EXPECT_FALSE(st.skipped);
  EXPECT_EQ(st.step, 1);

  const io::NamedTensors state = opt.state_dict(ctx);
  ASSERT_EQ(state[0].first, "w.exp_avg");
  const uint16_t* m_bf16 = state[0].second.data_as<uint16_t>();
  const double b1 = cfg.beta1, b2 = cfg.beta2;
  for (int64_t i = 0; i < p.value.numel(); ++i) {
    const double gc = g[i] * coef;
    const double mi = (1 - b1) * gc;
    const double vi = (1 - b2) * gc * gc;
    // Step 1: step_size = lr / (1 - beta1), the second-moment correction sqrt(1 - beta2).
    const double expect = double(p0.data_as<float>()[i]) * (1 - double(lr) * cfg.weight_decay) -
                          lr / (1 - b1) * mi / (std::sqrt(vi) / std::sqrt(1 - b2) + cfg.eps);
    ASSERT_NEAR(p.value.data_as<float>()[i], expect, 1e-6) << "element " << i;
    ASSERT_NEAR(bf16_to_float(m_bf16[i]), mi, std::abs(mi) / 128) << "element " << i;
  }

  // Without clipping the same step moves the weights further.
  Model m2;
  Parameter& q = m2.add("w", {64, 3}, 5);
  cfg.grad_clip = 0.0f;
  AdamWOptimizer unclipped(ctx, m2.ptrs(), cfg);
  unclipped.step(ctx, lr);
  const StepStats st2 = unclipped.finish_step(ctx);
  EXPECT_EQ(st2.clip_coef, 1.0f);
  double moved_clipped = 0, moved_unclipped = 0;
  for (int64_t i = 0; i < p.value.numel(); ++i) {
    moved_clipped += std::abs(p.value.data_as<float>()[i] - p0.data_as<float>()[i]);
    moved_unclipped += std::abs(q.value.data_as<float>()[i] - p0.data_as<float>()[i]);
  }
  EXPECT_GT(moved_unclipped, 1.5 * moved_clipped);
}

TEST(Optimizer, NonFiniteGradientSkipsTheStepAndChangesNothing) {
  Context ctx = make_context(Device::kCpu);
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -1e30f}) {
    Model m = small_model(21);
    AdamWOptimizer opt(ctx, m.ptrs(), AdamWConfig{});
    opt.step(ctx, 1e-2f);  // one real step, so the moments are not zero
    EXPECT_EQ(opt.finish_step(ctx).step, 1);
    const io::NamedTensors before = opt.state_dict(ctx);
    const Tensor w0 = copy(m.params[0]->value), n0 = copy(m.params[1]->value);

    // -1e30 is finite, but its square overflows FP32: the norm is inf and the step is skipped too.
    m.params[1]->grad.data_as<float>()[77] = bad;
    const StepResult r = opt.step(ctx, 1e-2f);
    EXPECT_EQ(r.step, 2);
    const StepStats st = opt.finish_step(ctx);
    EXPECT_TRUE(st.skipped) << bad;
    EXPECT_FALSE(std::isfinite(st.grad_norm));
    EXPECT_EQ(opt.steps_taken(), 1);
    EXPECT_TRUE(bitwise_equal(w0, m.params[0]->value));
    EXPECT_TRUE(bitwise_equal(n0, m.params[1]->value));
    const io::NamedTensors after = opt.state_dict(ctx);
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < after.size(); ++i)
      EXPECT_TRUE(bitwise_equal(before[i].second, after[i].second)) << after[i].first;

    // The next finite step is step 2 of the bias correction.
    m.params[1]->grad.data_as<float>()[77] = 0.5f;
    EXPECT_EQ(opt.step(ctx, 1e-2f).step, 2);
    EXPECT_FALSE(opt.finish_step(ctx).skipped);
    EXPECT_EQ(opt.steps_taken(), 2);
  }
}

TEST(Optimizer, ZeroGradAndFrozenParameters) {
  Context ctx = make_context(Device::kCpu);
  Model m = small_model(31);
  Parameter& frozen = *m.params[2];
  frozen.grad = random_tensor({8}, DType::kF32, 77);
  const Tensor frozen0 = copy(frozen.value);
  AdamWOptimizer opt(ctx, m.ptrs(), AdamWConfig{});
  opt.step(ctx, 1e-2f);
  EXPECT_TRUE(bitwise_equal(frozen0, frozen.value));
  opt.zero_grad(ctx);
  for (const auto& p : m.params)
    for (int64_t i = 0; i < p->grad.numel(); ++i) ASSERT_EQ(p->grad.data_as<float>()[i], 0.0f);
  // No state for the frozen parameter: two moments for each trainable one, and the step.
  const io::NamedTensors state = opt.state_dict(ctx);
  ASSERT_EQ(state.size(), 5u);
  EXPECT_EQ(state[2].first, "model.norm.weight.exp_avg");
  EXPECT_EQ(state[4].first, AdamWOptimizer::kStepTensorName);
  EXPECT_EQ(state[4].second.data_as<int64_t>()[0], 1);  // finished by state_dict()
}

TEST(Optimizer, StateRoundTripContinuesBitIdentically) {
  Context ctx = make_context(Device::kCpu);
  const Tensor g1a = random_tensor({37, 5}, DType::kF32, 41);
  const Tensor g1b = random_tensor({131}, DType::kF32, 42);
  const Tensor g2a = random_tensor({37, 5}, DType::kF32, 43);
  const Tensor g2b = random_tensor({131}, DType::kF32, 44);
  AdamWConfig cfg;
  cfg.grad_clip = 2.0f;

  // Reference: two steps in one optimizer.
  Model a = small_model(51);
  AdamWOptimizer opt_a(ctx, a.ptrs(), cfg);
  fill_from(a.params[0]->grad, g1a);
  fill_from(a.params[1]->grad, g1b);
  opt_a.step(ctx, 3e-3f);
  fill_from(a.params[0]->grad, g2a);
  fill_from(a.params[1]->grad, g2b);
  opt_a.step(ctx, 2e-3f);
  opt_a.finish_step(ctx);

  // One step, save weights and state through a safetensors file, a fresh optimizer, one step.
  Model b = small_model(51);
  AdamWOptimizer opt_b(ctx, b.ptrs(), cfg);
  fill_from(b.params[0]->grad, g1a);
  fill_from(b.params[1]->grad, g1b);
  opt_b.step(ctx, 3e-3f);
  const auto path = std::filesystem::temp_directory_path() /
                    ("octet_optim_" + std::to_string(::getpid()) + ".safetensors");
  io::write_safetensors(path.string(), opt_b.state_dict(ctx));
  const io::SafetensorsFile file = io::read_safetensors(path.string());
  std::filesystem::remove(path);

  Model c = small_model(999);  // different initial values: everything must come from the save
  for (size_t i = 0; i < 3; ++i) fill_from(c.params[i]->value, b.params[i]->value);
  AdamWOptimizer opt_c(ctx, c.ptrs(), cfg);
  opt_c.load_state_dict(ctx, file.tensors);
  EXPECT_EQ(opt_c.steps_taken(), 1);
  fill_from(c.params[0]->grad, g2a);
  fill_from(c.params[1]->grad, g2b);
  EXPECT_EQ(opt_c.step(ctx, 2e-3f).step, 2);

  for (size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(bitwise_equal(a.params[i]->value, c.params[i]->value)) << a.params[i]->name;
  const io::NamedTensors sa = opt_a.state_dict(ctx), sc = opt_c.state_dict(ctx);
  ASSERT_EQ(sa.size(), sc.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sc[i].first);
    EXPECT_TRUE(bitwise_equal(sa[i].second, sc[i].second)) << sa[i].first;
  }
}

TEST(Optimizer, LoadStateRejectsMismatchesNamingTheTensor) {
  Context ctx = make_context(Device::kCpu);
  Model m = small_model(61);
  AdamWOptimizer opt(ctx, m.ptrs(), AdamWConfig{});
  const io::NamedTensors good = opt.state_dict(ctx);
  auto message = [&](const io::NamedTensors& s) {
    try {
      opt.load_state_dict(ctx, s);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message(good), "");
  io::NamedTensors missing(good.begin() + 1, good.end());
  EXPECT_NE(message(missing).find(good[0].first + " is missing"), std::string::npos);
  io::NamedTensors reshaped = good;
  reshaped[1].second = reshaped[1].second.reshape({5, 37});
  EXPECT_NE(message(reshaped).find("exp_avg_sq must have shape [37, 5]"), std::string::npos)
      << message(reshaped);
  io::NamedTensors extra = good;
  extra.emplace_back("model.layers.1.mlp.gate.e_score_correction_bias.exp_avg",
                     Tensor::empty({8}, DType::kBF16));
  EXPECT_NE(message(extra).find("unexpected tensor model.layers.1"), std::string::npos)
      << message(extra);
}

// With a BF16 weight output, the update also writes the updated weights in BF16 (round to nearest
// even of the new master); outputs naming a parameter the optimizer does not hold, or a copy of
// the wrong size, are refused naming the parameter.
TEST(Optimizer, WeightOutputsReceiveTheUpdatedWeights) {
  Context ctx = make_context(Device::kCpu);
  Model m = small_model(81);
  AdamWOptimizer opt(ctx, m.ptrs(), AdamWConfig{});
  Parameter& w = *m.params[0];
  WeightOutput out{.param = &w, .bf16 = Tensor::empty(w.value.shape(), DType::kBF16)};
  opt.set_weight_outputs(ctx, {out});
  opt.step(ctx, 1e-2f);
  ASSERT_FALSE(opt.finish_step(ctx).skipped);
  const uint16_t* b = out.bf16.data_as<const uint16_t>();
  for (int64_t i = 0; i < w.value.numel(); ++i)
    ASSERT_EQ(b[i], float_to_bf16(w.value.data_as<const float>()[i])) << "element " << i;

  Model other = small_model(82);
  EXPECT_THROW(opt.set_weight_outputs(ctx, {{.param = other.params[0].get()}}), Error);
  try {
    opt.set_weight_outputs(ctx, {{.param = &w, .bf16 = Tensor::empty({3}, DType::kBF16)}});
    FAIL() << "expected a throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(w.name + ": bf16 copy"), std::string::npos) << e.what();
  }
}

TEST(Optimizer, ConstructorChecksParameters) {
  Context ctx = make_context(Device::kCpu);
  Model m = small_model(71);
  m.params[1]->grad = random_tensor({130}, DType::kF32, 3);
  try {
    AdamWOptimizer opt(ctx, m.ptrs(), AdamWConfig{});
    FAIL() << "expected a throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.norm.weight: grad"), std::string::npos) << e.what();
  }
  Model dup = small_model(72);
  dup.params[1]->name = dup.params[0]->name;
  EXPECT_THROW(AdamWOptimizer(ctx, dup.ptrs(), AdamWConfig{}), Error);
  AdamWConfig bad;
  bad.beta2 = 1.0f;
  Model ok = small_model(73);
  try {
    AdamWOptimizer opt(ctx, ok.ptrs(), bad);
    FAIL() << "expected a throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("beta2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace octet::train
