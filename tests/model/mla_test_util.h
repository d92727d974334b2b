// Shared by mla_test.cpp and mla_gpu_test.cpp: MLA's forward and backward composed the way
// model/mla.cpp did before it read v (and wrote dv) in place in kv: explicit column copies into
// compact k, v and out of compact dk, dv. MlaLayer must give bitwise the same output, dx and weight
// gradients (its changes move data, never change arithmetic).
#pragma once

#include <map>
#include <string>

#include "backend/backend.h"
#include "model/init.h"
#include "model/model.h"
#include "ops/attention/attention.h"
#include "ops/cast/cast.h"
#include "ops/layout/layout.h"
#include "test_util.h"
#include "tiny_model.h"

namespace octet::test {

// The copy-based forward: compact k and v, both saved in s (s.v a compact tensor).
inline Tensor mla_reference_forward(Context& ctx, MlaLayer& a, const Precision& p,
                                    const RopeTable& rope_table, const Tensor& x, int64_t B,
                                    int64_t T, MlaLayer::Saved& s) {
  const int64_t N = B * T, H = a.heads, dqk = a.nope + a.rope;
  s.B = B;
  s.T = T;
  LinearLayer& first = a.has_q_lora ? a.q_a : a.q;
  QuantTensor shared_x;
  QuantTensor* sx = same_input_quantization(p.recipe.at(first.site), p.recipe.at(a.kv_a.site))
                        ? &shared_x
                        : nullptr;
  Tensor qf;
  if (a.has_q_lora) {
    const Tensor qa = a.q_a.forward(ctx, p, x, s.q_a, Storage::kFp8, sx);
    const Tensor qan = a.q_a_norm.forward(ctx, qa, s.q_a_norm);
    qf = a.q_b.forward(ctx, p, qan, s.q_b);
  } else {
    qf = a.q.forward(ctx, p, x, s.q, Storage::kFp8, sx);
  }
  s.q_rot = rope_forward(ctx, {.input = qf.reshape({B, T, H, dqk}),
                               .table = rope_table,
                               .pairing = a.pairing,
                               .offset = a.nope});
  const Tensor kva = a.kv_a.forward(ctx, p, x, s.kv_a, Storage::kFp8, sx);
  shared_x = QuantTensor{};
  const Tensor c = slice_columns(ctx, kva, 0, a.kv_lora, kva.dtype());
  const Tensor cn = a.kv_a_norm.forward(ctx, c, s.kv_a_norm);
  const Tensor kva_rot = rope_forward(ctx, {.input = kva.reshape({B, T, a.kv_lora + a.rope}),
                                            .table = rope_table,
                                            .pairing = a.pairing,
                                            .offset = a.kv_lora});
  const Tensor kv = a.kv_b.forward(ctx, p, cn, s.kv_b);
  const Tensor kv_h = kv.reshape({N * H, a.nope + a.v_dim});
  Tensor k = Tensor::empty(ctx, {B, T, H, dqk}, x.dtype());
  Tensor v = Tensor::empty(ctx, {B, T, H, a.v_dim}, x.dtype());
  copy_columns(ctx, {.src = kv_h, .dst = k, .width = a.nope});
  copy_columns(ctx, {.src = kva_rot.reshape({N, a.kv_lora + a.rope}),
                     .src_col = a.kv_lora,
                     .dst = k,
                     .dst_col = a.nope,
                     .width = a.rope,
                     .repeat = H,
                     .mode = CopyMode::kBroadcast});
  copy_columns(ctx, {.src = kv_h, .src_col = a.nope, .dst = v, .width = a.v_dim});
  AttentionForwardResult att = attention_forward(ctx, {.q = s.q_rot, .k = k, .v = v});
  s.k = k;
  s.v = v;
  s.out = att.o;
  s.lse = att.lse;
  return a.o.forward(ctx, p, att.o.reshape({N, H * a.v_dim}), s.o, p.recipe.attn_out_input);
}

// The copy-based backward: dk and dv from the attention as compact tensors, copied into dkv.
inline Tensor mla_reference_backward(Context& ctx, MlaLayer& a, const Precision& p,
                                     const RopeTable& rope_table, const Tensor& dy,
                                     const MlaLayer::Saved& s) {
  const int64_t B = s.B, T = s.T, N = B * T, H = a.heads, dqk = a.nope + a.rope;
  const Tensor d_out = a.o.backward(ctx, p, dy, s.o).reshape({B, T, H, a.v_dim});
  const AttentionGrads g = attention_backward(ctx, {.q = s.q_rot,
                                                    .k = s.k,
                                                    .v = s.v,
                                                    .o = s.out,
                                                    .lse = s.lse,
                                                    .grad_o = d_out,
                                                    .deterministic = a.deterministic});
  Tensor dkv = Tensor::empty(ctx, {N * H, a.nope + a.v_dim}, dy.dtype());
  copy_columns(ctx, {.src = g.grad_k, .dst = dkv, .width = a.nope});
  copy_columns(ctx, {.src = g.grad_v, .dst = dkv, .dst_col = a.nope, .width = a.v_dim});
  Tensor dkva = Tensor::empty(ctx, {N, a.kv_lora + a.rope}, dy.dtype());
  copy_columns(ctx, {.src = g.grad_k,
                     .src_col = a.nope,
                     .dst = dkva,
                     .dst_col = a.kv_lora,
                     .width = a.rope,
                     .repeat = H,
                     .mode = CopyMode::kSum});
  const Tensor dcn = a.kv_b.backward(ctx, p, dkv.reshape({N, H * (a.nope + a.v_dim)}), s.kv_b);
  const Tensor dc = a.kv_a_norm.backward(ctx, dcn, s.kv_a_norm);
  copy_columns(ctx, {.src = dc, .dst = dkva, .width = a.kv_lora});
  const Tensor dkva_pre = rope_backward(ctx, {.input = dkva.reshape({B, T, a.kv_lora + a.rope}),
                                              .table = rope_table,
                                              .pairing = a.pairing,
                                              .offset = a.kv_lora});
  Tensor dx = a.kv_a.backward(ctx, p, dkva_pre.reshape({N, a.kv_lora + a.rope}), s.kv_a);
  const Tensor dq =
      rope_backward(
          ctx, {.input = g.grad_q, .table = rope_table, .pairing = a.pairing, .offset = a.nope})
          .reshape({N, H * dqk});
  if (a.has_q_lora) {
    const Tensor dqan = a.q_b.backward(ctx, p, dq, s.q_b);
    const Tensor dqa = a.q_a_norm.backward(ctx, dqan, s.q_a_norm);
    add_into(ctx, dx, a.q_a.backward(ctx, p, dqa, s.q_a));
  } else {
    add_into(ctx, dx, a.q.backward(ctx, p, dq, s.q));
  }
  return dx;
}

struct MlaResult {
  Tensor out, dx;                       // host
  std::map<std::string, Tensor> grads;  // host f32: layer 0's attention parameters
};

// Layer 0's attention of a model of `c` in `recipe`: one forward and backward on fixed random x
// and dy, through MlaLayer (reference = false; k kept or rebuilt as recompute_k says) or the
// copy-based composition above.
inline MlaResult run_mla(Context& ctx, const ModelConfig& c, const std::string& recipe,
                         bool reference, bool recompute_k = true, int64_t B = 2, int64_t T = 24) {
  Model m(ctx, c, {recipe_preset(recipe), DType::kBF16});
  m.load(ctx, init_parameters(c, 5));
  m.prepare(ctx);
  m.zero_grad(ctx);
  MlaLayer& a = m.layer(0).attn;
  a.recompute_k = recompute_k;
  const int64_t D = c.hidden_size;
  const Tensor x =
      cast(ctx, random_tensor({B * T, D}, DType::kF32, 21).to(ctx, ctx.device), DType::kBF16);
  const Tensor dy =
      cast(ctx, random_tensor({B * T, D}, DType::kF32, 22).to(ctx, ctx.device), DType::kBF16);
  MlaLayer::Saved s;
  MlaResult r;
  if (reference) {
    r.out = mla_reference_forward(ctx, a, m.precision(), m.rope(), x, B, T, s).to_host(ctx);
    r.dx = mla_reference_backward(ctx, a, m.precision(), m.rope(), dy, s).to_host(ctx);
  } else {
    r.out = a.forward(ctx, m.precision(), m.rope(), x, B, T, s).to_host(ctx);
    r.dx = a.backward(ctx, m.precision(), m.rope(), dy, s).to_host(ctx);
  }
  for (Parameter* p : m.parameters())
    if (p->trainable && p->name.find("model.layers.0.self_attn.") == 0)
      r.grads[p->name] = p->grad.to_host(ctx);
  return r;
}

// MlaLayer against the copy-based composition, bitwise.
inline void expect_mla_matches_reference(Context& ctx, const ModelConfig& c,
                                         const std::string& recipe, bool recompute_k = true) {
  const MlaResult got = run_mla(ctx, c, recipe, false, recompute_k);
  const MlaResult want = run_mla(ctx, c, recipe, true);
  const std::string where = recipe + (recompute_k ? " (k rebuilt in backward)" : " (k kept)");
  EXPECT_TRUE(bitwise_equal(want.out, got.out)) << where << ": output";
  EXPECT_TRUE(bitwise_equal(want.dx, got.dx)) << where << ": dx";
  ASSERT_EQ(got.grads.size(), want.grads.size());
  EXPECT_GE(got.grads.size(), 6u) << "layer 0's attention parameters were not found";
  for (const auto& [name, g] : want.grads)
    EXPECT_TRUE(bitwise_equal(g, got.grads.at(name))) << where << ": " << name;
}

}  // namespace octet::test
