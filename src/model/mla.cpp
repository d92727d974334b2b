// Multi-head Latent Attention: forward, then backward in reverse order (mla.h has the math).
#include "model/mla.h"

#include "ops/attention/attention.h"
#include "ops/cast/cast.h"
#include "ops/layout/layout.h"

namespace octet {

Tensor MlaLayer::forward(Context& ctx, const Precision& p, const RopeTable& rope_table,
                         const Tensor& x, int64_t B, int64_t T, Saved& s) {
  const int64_t N = B * T, H = heads, dqk = nope + rope;
  s.B = B;
  s.T = T;
  // q_a (or q) and kv_a read the same x: one quantization and one saved FP8 copy when both sites
  // quantize it alike (linear.h same_input_quantization); freed (its row-wise half) after kv_a.
  LinearLayer& first = has_q_lora ? q_a : q;
  QuantTensor shared_x;
  QuantTensor* sx = same_input_quantization(p.recipe.at(first.site), p.recipe.at(kv_a.site))
                        ? &shared_x
                        : nullptr;
  Tensor qf;
  if (has_q_lora) {
    const Tensor qa = q_a.forward(ctx, p, x, s.q_a, Storage::kFp8, sx);
    const Tensor qan = q_a_norm.forward(ctx, qa, s.q_a_norm);
    qf = q_b.forward(ctx, p, qan, s.q_b);
  } else {
    qf = q.forward(ctx, p, x, s.q, Storage::kFp8, sx);
  }
  s.q_rot = rope_forward(ctx, {.input = qf.reshape({B, T, H, dqk}),
                               .table = rope_table,
                               .pairing = pairing,
                               .offset = nope});

  const Tensor kva = kv_a.forward(ctx, p, x, s.kv_a, Storage::kFp8, sx);  // (N, kv_lora + dr)
  shared_x = QuantTensor{};
  const Tensor c = slice_columns(ctx, kva, 0, kv_lora, kva.dtype());
  const Tensor cn = kv_a_norm.forward(ctx, c, s.kv_a_norm);
  const Tensor kva_rot = rope_forward(ctx, {.input = kva.reshape({B, T, kv_lora + rope}),
                                            .table = rope_table,
                                            .pairing = pairing,
                                            .offset = kv_lora});
  const Tensor kv = kv_b.forward(ctx, p, cn, s.kv_b);  // (N, H (dn + dv))
  const Tensor kv_h = kv.reshape({N * H, nope + v_dim});
  Tensor k = Tensor::empty(ctx, {B, T, H, dqk}, x.dtype());
  Tensor v = Tensor::empty(ctx, {B, T, H, v_dim}, x.dtype());
  copy_columns(ctx, {.src = kv_h, .dst = k, .width = nope});
  // The rope key is shared by all heads (MQA-style): row n of kva_rot goes to rows n H .. n H +
  // H-1.
  copy_columns(ctx, {.src = kva_rot.reshape({N, kv_lora + rope}),
                     .src_col = kv_lora,
                     .dst = k,
                     .dst_col = nope,
                     .width = rope,
                     .repeat = H,
                     .mode = CopyMode::kBroadcast});
  copy_columns(ctx, {.src = kv_h, .src_col = nope, .dst = v, .width = v_dim});

  AttentionForwardResult att = attention_forward(ctx, {.q = s.q_rot, .k = k, .v = v});
  s.k = k;
  s.v = v;
  s.out = att.o;
  s.lse = att.lse;
  return o.forward(ctx, p, att.o.reshape({N, H * v_dim}), s.o, p.recipe.attn_out_input);
}

Tensor MlaLayer::backward(Context& ctx, const Precision& p, const RopeTable& rope_table,
                          const Tensor& dy, const Saved& s) {
  const int64_t B = s.B, T = s.T, N = B * T, H = heads, dqk = nope + rope;
  const Tensor d_out = o.backward(ctx, p, dy, s.o).reshape({B, T, H, v_dim});
  const AttentionGrads g = attention_backward(ctx, {.q = s.q_rot,
                                                    .k = s.k,
                                                    .v = s.v,
                                                    .o = s.out,
                                                    .lse = s.lse,
                                                    .grad_o = d_out,
                                                    .deterministic = deterministic});

  // k and v came from kv (per head) and the shared rope key: route their gradients back.
  Tensor dkv = Tensor::empty(ctx, {N * H, nope + v_dim}, dy.dtype());
  copy_columns(ctx, {.src = g.grad_k, .dst = dkv, .width = nope});
  copy_columns(ctx, {.src = g.grad_v, .dst = dkv, .dst_col = nope, .width = v_dim});
  Tensor dkva = Tensor::empty(ctx, {N, kv_lora + rope}, dy.dtype());
  copy_columns(ctx, {.src = g.grad_k,
                     .src_col = nope,
                     .dst = dkva,
                     .dst_col = kv_lora,
                     .width = rope,
                     .repeat = H,
                     .mode = CopyMode::kSum});  // sum over heads

  const Tensor dcn = kv_b.backward(ctx, p, dkv.reshape({N, H * (nope + v_dim)}), s.kv_b);
  const Tensor dc = kv_a_norm.backward(ctx, dcn, s.kv_a_norm);
  copy_columns(ctx, {.src = dc, .dst = dkva, .width = kv_lora});
  // RoPE touched only the rope channels; its backward rotates them back and copies the rest.
  const Tensor dkva_pre = rope_backward(ctx, {.input = dkva.reshape({B, T, kv_lora + rope}),
                                              .table = rope_table,
                                              .pairing = pairing,
                                              .offset = kv_lora});
  Tensor dx = kv_a.backward(ctx, p, dkva_pre.reshape({N, kv_lora + rope}), s.kv_a);

  const Tensor dq =
      rope_backward(ctx,
                    {.input = g.grad_q, .table = rope_table, .pairing = pairing, .offset = nope})
          .reshape({N, H * dqk});
  if (has_q_lora) {
    const Tensor dqan = q_b.backward(ctx, p, dq, s.q_b);
    const Tensor dqa = q_a_norm.backward(ctx, dqan, s.q_a_norm);
    add_into(ctx, dx, q_a.backward(ctx, p, dqa, s.q_a));
  } else {
    add_into(ctx, dx, q.backward(ctx, p, dq, s.q));
  }
  return dx;
}

}  // namespace octet
