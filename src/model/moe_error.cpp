// measure_moe_error: a MoE layer under a recipe against its FP64 recomputation (moe_error.h).
#include "model/moe_error.h"

#include <cmath>
#include <random>

#include "backend/backend.h"
#include "model/init.h"
#include "model/model.h"
#include "ops/cast/cast.h"

namespace octet {
namespace {

using Vec = std::vector<double>;

Vec to_f64(Context& ctx, const Tensor& t) {
  const Tensor f = cast(ctx, t, DType::kF32);
  Vec v(static_cast<size_t>(f.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = f.data_as<const float>()[i];
  return v;
}

double silu(double g) {
  return g / (1.0 + std::exp(-g));
}

// One SwiGLU MLP in FP64 on one row: out += w * down(silu(gate x) * up x) and, in backward with
// d_out, the gradients (dx +=, dW +=) and d w = <d_out, down(...)>. wgu (2F, D), wd (D, F).
struct Mlp64 {
  const double* wgu;
  const double* wd;
  int64_t d, f;
  double* dwgu;
  double* dwd;

  // Returns d w (the dot product of d_out with the unweighted output).
  double run(const double* x, double w, const double* d_out, double* out, double* dx) const {
    Vec a(2 * f, 0.0), h(f), o(d, 0.0);
    for (int64_t i = 0; i < 2 * f; ++i)
      for (int64_t j = 0; j < d; ++j) a[i] += wgu[i * d + j] * x[j];
    for (int64_t i = 0; i < f; ++i) h[i] = silu(a[i]) * a[f + i];
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < f; ++j) o[i] += wd[i * f + j] * h[j];
    double dw = 0;
    for (int64_t i = 0; i < d; ++i) {
      out[i] += w * o[i];
      dw += d_out[i] * o[i];
    }
    Vec dh(f, 0.0), da(2 * f);
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < f; ++j) {
        const double dout = w * d_out[i];
        dh[j] += wd[i * f + j] * dout;
        dwd[i * f + j] += dout * h[j];
      }
    for (int64_t i = 0; i < f; ++i) {
      const double g = a[i], u = a[f + i], s = 1.0 / (1.0 + std::exp(-g));
      da[f + i] = dh[i] * g * s;
      da[i] = dh[i] * u * s * (1.0 + g * (1.0 - s));
    }
    for (int64_t i = 0; i < 2 * f; ++i)
      for (int64_t j = 0; j < d; ++j) {
        dx[j] += wgu[i * d + j] * da[i];
        dwgu[i * d + j] += da[i] * x[j];
      }
    return dw;
  }
};

double rel(const Vec& a, const Vec& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

MoeErrors measure_one(const Recipe& recipe, const MoeErrorConfig& m, uint64_t seed) {
  Context ctx = make_context(Device::kCpu);
  const ModelConfig c = moe_probe_config(m);
  Model model(ctx, c, {recipe, DType::kBF16});
  model.load(ctx, init_parameters(c, seed));
  model.prepare(ctx);
  MoeLayer& moe = *model.layer(1).moe;
  const int64_t T = m.tokens, D = m.hidden, F = m.expert_ffn, E = m.experts, K = m.top_k;
  const Tensor x = random_bf16({T, D}, seed * 7 + 1), dy = random_bf16({T, D}, seed * 7 + 2);
  MoeLayer::Saved s;
  const Tensor y = moe.forward(ctx, model.precision(), x, 1, s);
  const Tensor dx = moe.backward(ctx, model.precision(), dy, s);

  // FP64 recomputation.
  const Vec xs = to_f64(ctx, x), dys = to_f64(ctx, dy);
  const Vec wg = to_f64(ctx, moe.gate->value), wgu = to_f64(ctx, moe.gate_up.param->value),
            wd = to_f64(ctx, moe.down.param->value),
            sgu = to_f64(ctx, moe.shared->gate_up.param->value),
            sd = to_f64(ctx, moe.shared->down.param->value);
  Vec dwg(wg.size(), 0.0), dwgu(wgu.size(), 0.0), dwd(wd.size(), 0.0), dsgu(sgu.size(), 0.0),
      dsd(sd.size(), 0.0);
  Vec ry(T * D, 0.0), rdx(T * D, 0.0);
  const int32_t* idx = s.route.topk_idx.data_as<const int32_t>();
  const double rsf = moe.router.routed_scaling_factor;
  const bool norm = moe.router.norm == TopkNorm::kSumToOne;
  for (int64_t t = 0; t < T; ++t) {
    const double* xt = &xs[t * D];
    const double* dyt = &dys[t * D];
    double* yt = &ry[t * D];
    double* dxt = &rdx[t * D];
    Vec logit(E, 0.0), sc(E);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t j = 0; j < D; ++j) logit[e] += wg[e * D + j] * xt[j];
      sc[e] = 1.0 / (1.0 + std::exp(-logit[e]));
    }
    double denom = 1e-20;
    for (int64_t j = 0; j < K; ++j) denom += sc[idx[t * K + j]];
    Vec dw(K);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = idx[t * K + j];
      const double w = rsf * sc[e] / (norm ? denom : 1.0);
      const Mlp64 mlp{&wgu[e * 2 * F * D],  &wd[e * D * F], D, F,
                      &dwgu[e * 2 * F * D], &dwd[e * D * F]};
      dw[j] = mlp.run(xt, w, dyt, yt, dxt);
    }
    const Mlp64 shared{sgu.data(), sd.data(), D, F, dsgu.data(), dsd.data()};
    shared.run(xt, 1.0, dyt, yt, dxt);
    // Router backward through the normalised weights (moe_router.h's math in FP64).
    double dot = 0;
    for (int64_t j = 0; j < K; ++j) dot += dw[j] * sc[idx[t * K + j]] / denom;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = idx[t * K + j];
      const double ds = norm ? rsf * (dw[j] - dot) / denom : rsf * dw[j];
      const double dl = ds * sc[e] * (1.0 - sc[e]);
      for (int64_t i = 0; i < D; ++i) {
        dxt[i] += wg[e * D + i] * dl;
        dwg[e * D + i] += dl * xt[i];
      }
    }
  }
  MoeErrors out;
  out.y = rel(to_f64(ctx, y), ry);
  out.dx = rel(to_f64(ctx, dx), rdx);
  out.dw_gate_up = rel(to_f64(ctx, moe.gate_up.param->grad), dwgu);
  out.dw_down = rel(to_f64(ctx, moe.down.param->grad), dwd);
  Vec all, ref;
  for (const auto& [p, r] : {std::pair{moe.gate_up.param, &dwgu}, std::pair{moe.down.param, &dwd},
                             std::pair{moe.shared->gate_up.param, &dsgu},
                             std::pair{moe.shared->down.param, &dsd}, std::pair{moe.gate, &dwg}}) {
    const Vec g = to_f64(ctx, p->grad);
    all.insert(all.end(), g.begin(), g.end());
    ref.insert(ref.end(), r->begin(), r->end());
  }
  out.dw = rel(all, ref);
  return out;
}

}  // namespace

ModelConfig moe_probe_config(const MoeErrorConfig& m) {
  ModelConfig c;
  c.vocab_size = 128;
  c.hidden_size = m.hidden;
  c.intermediate_size = 2 * m.expert_ffn;
  c.moe_intermediate_size = m.expert_ffn;
  c.num_hidden_layers = 2;
  c.first_k_dense_replace = 1;
  c.num_attention_heads = 2;
  c.max_position_embeddings = 64;
  c.q_lora_rank = 64;
  c.kv_lora_rank = 64;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 32;
  c.n_routed_experts = m.experts;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = m.top_k;
  c.n_group = 1;
  c.topk_group = 1;
  c.num_nextn_predict_layers = 0;
  c.seq_aux_loss_alpha = 0.0;  // the balance loss is not part of the dataflow measured
  return c;
}

Tensor random_bf16(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::kBF16);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<uint16_t>()[i] = float_to_bf16(n(gen));
  return t;
}

MoeErrors measure_moe_error(const Recipe& recipe, const MoeErrorConfig& cfg) {
  OCTET_CHECK(!cfg.seeds.empty(), "measure_moe_error: no seeds");
  MoeErrors sum;
  for (const uint64_t seed : cfg.seeds) {
    const MoeErrors e = measure_one(recipe, cfg, seed);
    sum.y += e.y, sum.dx += e.dx, sum.dw += e.dw, sum.dw_gate_up += e.dw_gate_up,
        sum.dw_down += e.dw_down;
  }
  const double n = static_cast<double>(cfg.seeds.size());
  return {sum.y / n, sum.dx / n, sum.dw / n, sum.dw_gate_up / n, sum.dw_down / n};
}

}  // namespace octet
