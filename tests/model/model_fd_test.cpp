// Finite-difference gradient checks of every block and of the whole model, in the FP32 checking
// mode on the CPU (bf16 recipe with F32 activations: every GEMM, norm, attention and combine in
// FP32), at tiny sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "backend/backend.h"
#include "model/init.h"
#include "model/model.h"
#include "ops/cross_entropy/cross_entropy.h"
#include "test_util.h"

namespace octet {
namespace {

ModelConfig fd_config() {
  ModelConfig c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.moe_intermediate_size = 16;
  c.num_hidden_layers = 2;
  c.first_k_dense_replace = 1;
  c.num_attention_heads = 2;
  c.max_position_embeddings = 16;
  c.q_lora_rank = 24;
  c.kv_lora_rank = 16;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 16;
  c.n_routed_experts = 4;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 2;
  c.n_group = 2;
  c.topk_group = 1;
  c.num_nextn_predict_layers = 1;
  c.initializer_range = 0.2;  // large enough that every path carries a visible gradient
  c.seq_aux_loss_alpha = 0.01;
  return c;
}

Precision fp32_mode() {
  return {recipe_preset("bf16"), DType::kF32};
}

struct Fixture {
  Context ctx = make_context(Device::kCpu);
  ModelConfig config;
  Model model;
  explicit Fixture(const ModelConfig& c, const Precision& p = fp32_mode())
      : config(c), model(ctx, c, p) {
    model.load(ctx, init_parameters(c, 7));
    model.prepare(ctx);
  }
};

ModelBatch random_batch(const ModelConfig& c, int64_t B, int64_t T, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
  ModelBatch b{Tensor::empty({B, T}, DType::kI32), Tensor::empty({B, T}, DType::kI32)};
  for (int64_t i = 0; i < B * T; ++i) {
    b.inputs.data_as<int32_t>()[i] = tok(rng);
    b.targets.data_as<int32_t>()[i] = tok(rng);
  }
  b.targets.data_as<int32_t>()[1] = kIgnoreIndex;
  return b;
}

double dot(const Tensor& a, const Tensor& r) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    s += static_cast<double>(a.data_as<const float>()[i]) * r.data_as<const float>()[i];
  return s;
}

// Compares d loss / d v[i] with central differences at `samples` elements of v.
void check_gradient(const std::string& what, float* v, const float* analytic, int64_t n,
                    const std::function<double()>& loss, int samples = 4, double eps = 1e-2) {
  std::mt19937 rng(static_cast<uint32_t>(n * 31 + what.size()));
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  double largest = 0;
  for (int s = 0; s < std::min<int64_t>(samples, n); ++s) {
    const int64_t i = samples >= n ? s : pick(rng);
    const float keep = v[i];
    v[i] = keep + static_cast<float>(eps);
    const double up = loss();
    v[i] = keep - static_cast<float>(eps);
    const double down = loss();
    v[i] = keep;
    const double fd = (up - down) / (2 * eps);
    EXPECT_NEAR(analytic[i], fd, 3e-3 + 3e-2 * std::fabs(fd)) << what << " element " << i;
    largest = std::max(largest, std::fabs(fd));
  }
  // A check of zeros against zeros proves nothing: the sampled elements must carry a gradient.
  EXPECT_GT(largest, 1e-3) << what << ": no sampled element has a visible gradient";
}

// A block y = f(x): checks dx and the gradient of every parameter it owns, against the loss
// <y, R> for a fixed random R.
void check_block(Fixture& f, const std::string& name, Tensor x,
                 const std::function<Tensor(const Tensor&)>& forward,
                 const std::function<Tensor(const Tensor&)>& backward,
                 const std::vector<Parameter*>& params) {
  const Tensor y0 = forward(x);
  const Tensor r = test::random_tensor(y0.shape(), DType::kF32, 99);
  f.model.zero_grad(f.ctx);
  const Tensor dx = backward(r);
  auto loss = [&] {
    f.model.prepare(f.ctx);
    return dot(forward(x), r);
  };
  check_gradient(name + " dx", x.data_as<float>(), dx.data_as<const float>(), x.numel(), loss, 6);
  for (Parameter* p : params) {
    ASSERT_NE(p, nullptr);
    const Tensor g = p->grad.to_host(f.ctx);  // copy: the FD forwards do not touch grads anyway
    check_gradient(name + " " + p->name, p->value.data_as<float>(), g.data_as<const float>(),
                   p->value.numel(), loss);
  }
}

std::vector<Parameter*> mla_params(MlaLayer& a) {
  return {a.q_a.param,       a.q_a_norm.param, a.q_b.param, a.kv_a.param,
          a.kv_a_norm.param, a.kv_b.param,     a.o.param};
}

constexpr int64_t kB = 2, kT = 5;

TEST(ModelFd, Mla) {
  Fixture f(fd_config());
  MlaLayer& a = f.model.layer(0).attn;
  MlaLayer::Saved s;
  check_block(
      f, "mla", test::random_tensor({kB * kT, 32}, DType::kF32, 1),
      [&](const Tensor& x) {
        return a.forward(f.ctx, f.model.precision(), f.model.rope(), x, kB, kT, s);
      },
      [&](const Tensor& dy) {
        return a.backward(f.ctx, f.model.precision(), f.model.rope(), dy, s);
      },
      mla_params(a));
}

TEST(ModelFd, MlaInterleavedRopeAndPlainQProj) {
  ModelConfig c = fd_config();
  c.q_lora_rank.reset();
  c.rope_interleave = false;
  Fixture f(c);
  MlaLayer& a = f.model.layer(0).attn;
  MlaLayer::Saved s;
  check_block(
      f, "mla", test::random_tensor({kB * kT, 32}, DType::kF32, 2),
      [&](const Tensor& x) {
        return a.forward(f.ctx, f.model.precision(), f.model.rope(), x, kB, kT, s);
      },
      [&](const Tensor& dy) {
        return a.backward(f.ctx, f.model.precision(), f.model.rope(), dy, s);
      },
      {a.q.param, a.kv_a.param, a.kv_a_norm.param, a.kv_b.param, a.o.param});
}

TEST(ModelFd, DenseMlp) {
  Fixture f(fd_config());
  SwigluMlp& m = *f.model.layer(0).mlp;
  SwigluMlp::Saved s;
  check_block(
      f, "dense mlp", test::random_tensor({kB * kT, 32}, DType::kF32, 3),
      [&](const Tensor& x) { return m.forward(f.ctx, f.model.precision(), x, s); },
      [&](const Tensor& dy) { return m.backward(f.ctx, f.model.precision(), dy, s); },
      {m.gate_up.param, m.down.param});
}

TEST(ModelFd, Moe) {
  Fixture f(fd_config());
  MoeLayer& m = *f.model.layer(1).moe;
  MoeLayer::Saved s;
  // The balance loss is part of the block's output here: loss = <y, R> + aux.
  check_block(
      f, "moe", test::random_tensor({kB * kT, 32}, DType::kF32, 4),
      [&](const Tensor& x) { return m.forward(f.ctx, f.model.precision(), x, kB, s); },
      [&](const Tensor& dy) {
        m.aux_grad_scale = 0.0f;  // <y, R> only: the balance loss has its own test below
        return m.backward(f.ctx, f.model.precision(), dy, s);
      },
      {m.gate, m.gate_up.param, m.down.param, m.shared->gate_up.param, m.shared->down.param});
}

TEST(ModelFd, DecoderLayerWithMoe) {
  Fixture f(fd_config());
  DecoderLayer& l = f.model.layer(1);
  DecoderLayer::Saved s;
  l.moe->aux_grad_scale = 0.0f;
  check_block(
      f, "decoder layer", test::random_tensor({kB * kT, 32}, DType::kF32, 5),
      [&](const Tensor& x) {
        return l.forward(f.ctx, f.model.precision(), f.model.rope(), x, kB, kT, s);
      },
      [&](const Tensor& dy) {
        return l.backward(f.ctx, f.model.precision(), f.model.rope(), dy, s);
      },
      {l.input_norm.param, l.post_norm.param, l.attn.o.param, l.moe->gate});
}

TEST(ModelFd, MtpModule) {
  Fixture f(fd_config());
  MtpModule& m = f.model.mtp(0);
  m.layer.moe->aux_grad_scale = 0.0f;
  MtpModule::Saved s;
  const Tensor emb = test::random_tensor({kB * kT, 32}, DType::kF32, 6);
  MtpModule::Grads g;
  check_block(
      f, "mtp", test::random_tensor({kB * kT, 32}, DType::kF32, 7),
      [&](const Tensor& h) {
        return m.forward(f.ctx, f.model.precision(), f.model.rope(), emb, h, kB, kT, s);
      },
      [&](const Tensor& dy) {
        g = m.backward(f.ctx, f.model.precision(), f.model.rope(), dy, s);
        return g.d_h_prev;
      },
      {m.enorm.param, m.hnorm.param, m.eh_proj.param, m.layer.attn.q_b.param});
}

TEST(ModelFd, WholeModel) {
  Fixture f(fd_config());
  const ModelBatch batch = random_batch(f.config, kB, kT, 11);
  f.model.zero_grad(f.ctx);
  const ModelLosses l = f.model.step(f.ctx, batch, Pass::kForwardBackward);
  EXPECT_EQ(l.mtp.size(), 1u);
  EXPECT_EQ(l.aux.size(), 2u);  // layer 1 and the MTP layer
  auto loss = [&] {
    f.model.prepare(f.ctx);
    return f.model.read_losses(f.ctx, f.model.step(f.ctx, batch, Pass::kForward)).total;
  };
  for (Parameter* p : f.model.parameters()) {
    if (!p->trainable) continue;
    const Tensor g = p->grad.to_host(f.ctx);
    check_gradient(p->name, p->value.data_as<float>(), g.data_as<const float>(), p->value.numel(),
                   loss, p->name == "model.embed_tokens.weight" ? 12 : 2);  // unused rows: 0
  }
}

}  // namespace
}  // namespace octet
