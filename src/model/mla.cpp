// Multi-head Latent Attention: forward, then backward in reverse order (mla.h has the math).
#include "model/mla.h"

#include "ops/attention/attention.h"
#include "ops/cast/cast.h"
#include "ops/layout/layout.h"
#include "ops/rope/rope_key.h"

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
  const Tensor kv = kv_b.forward(ctx, p, cn, s.kv_b);  // (N, H (dn + dv))
  // k in one pass: each head's nope columns of kv next to RoPE(kr), the rope key shared by all
  // heads (MQA-style), rotated straight out of kva (ops/rope/rope_key.h).
  const Tensor k = rope_key_forward(ctx, {.kv = kv.reshape({B, T, H, nope + v_dim}),
                                          .nope = nope,
                                          .kr = kva.reshape({B, T, kv_lora + rope}),
                                          .kr_col = kv_lora,
                                          .table = rope_table,
                                          .pairing = pairing});
  if (v_in_place()) {
    s.v = HeadView(kv.reshape({B, T, H, nope + v_dim}), nope, v_dim);
  } else {
    Tensor v = Tensor::empty(ctx, {B, T, H, v_dim}, x.dtype());
    copy_columns(
        ctx, {.src = kv.reshape({N * H, nope + v_dim}), .src_col = nope, .dst = v, .width = v_dim});
    s.v = v;
  }

  AttentionForwardResult att = attention_forward(ctx, {.q = s.q_rot, .k = k, .v = s.v});
  s.k = Tensor();
  s.kva = Tensor();
  if (recompute_k && v_in_place())
    s.kva = kva;
  else
    s.k = k;
  s.out = att.o;
  s.lse = att.lse;
  return o.forward(ctx, p, att.o.reshape({N, H * v_dim}), s.o, p.recipe.attn_out_input);
}

Tensor MlaLayer::backward(Context& ctx, const Precision& p, const RopeTable& rope_table,
                          const Tensor& dy, const Saved& s) {
  const int64_t B = s.B, T = s.T, N = B * T, H = heads, dqk = nope + rope;
  const Tensor d_out = o.backward(ctx, p, dy, s.o).reshape({B, T, H, v_dim});
  // k and v came from kv (per head) and the shared rope key: route their gradients back. dv lands
  // in dkv's v columns straight from the attention backward (v_in_place).
  const Tensor k = s.kva.rank() > 0
                       ? rope_key_forward(ctx, {.kv = s.v.base,
                                                .nope = nope,
                                                .kr = s.kva.reshape({B, T, kv_lora + rope}),
                                                .kr_col = kv_lora,
                                                .table = rope_table,
                                                .pairing = pairing})
                       : s.k;
  Tensor dkv = Tensor::empty(ctx, {N * H, nope + v_dim}, dy.dtype());
  const AttentionGrads g = attention_backward(
      ctx,
      {.q = s.q_rot,
       .k = k,
       .v = s.v,
       .o = s.out,
       .lse = s.lse,
       .grad_o = d_out,
       .deterministic = deterministic,
       .grad_v_into =
           v_in_place() ? HeadView(dkv.reshape({B, T, H, nope + v_dim}), nope, v_dim) : HeadView(),
       .max_workspace_bytes = backward_workspace_cap});
  if (!v_in_place())
    copy_columns(ctx, {.src = g.grad_v, .dst = dkv, .dst_col = nope, .width = v_dim});
  // dk's nope columns into dkv; its rope columns summed over heads and rotated back into the rope
  // key's columns of dkva (ops/rope/rope_key.h); the latent's columns from the norm's backward.
  Tensor dkva = Tensor::empty(ctx, {N, kv_lora + rope}, dy.dtype());
  rope_key_backward(ctx, {.grad_k = g.grad_k,
                          .grad_kv = dkv.reshape({B, T, H, nope + v_dim}),
                          .grad_kr = dkva.reshape({B, T, kv_lora + rope}),
                          .kr_col = kv_lora,
                          .table = rope_table,
                          .pairing = pairing});
  const Tensor dcn = kv_b.backward(ctx, p, dkv.reshape({N, H * (nope + v_dim)}), s.kv_b);
  const Tensor dc = kv_a_norm.backward(ctx, dcn, s.kv_a_norm);
  copy_columns(ctx, {.src = dc, .dst = dkva, .width = kv_lora});
  Tensor dx = kv_a.backward(ctx, p, dkva, s.kv_a);

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
