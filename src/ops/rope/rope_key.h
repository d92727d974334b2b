// MLA's key (model/mla.h) in one pass: each head's nope columns of kv next to the shared rope key,
// rotated once per head, and the backward that routes the key's gradient back. Bitwise the
// composition it replaces (ops/rope/rope.h and ops/layout/layout.h):
//
//   forward   kr = rope_forward(kr_in viewed (B, T, Wr), offset = kr_col)
//             k[b, t, h, :dn]        = kv[b, t, h, :dn]                       (copy_columns)
//             k[b, t, h, dn : dn + d] = kr[b, t, kr_col : kr_col + d]  for every h   (kBroadcast)
//   backward  grad_kv[b, t, h, :dn]  = dk[b, t, h, :dn]                       (copy_columns)
//             s[b, t, :] = sum_h dk[b, t, h, dn:]   FP32 in increasing h from 0, rounded once to
//                                                   the dtype (copy_columns kSum)
//             grad_kr[b, t, kr_col : kr_col + d] = rope_backward(s)   (the rotation of rope.h)
//
// d = table.rope_dim, dn = nope; kv is (B, T, H, Wkv) with dn <= Wkv (MLA: kv_b's output, Wkv =
// dn + dv), kr_in is (B, T, Wr) with kr_col + d <= Wr (MLA: kv_a's output, kr_col = kv_lora). The
// backward writes only the named columns of grad_kv and grad_kr (=); the rest stay as they were.
// One dtype throughout: F32 or BF16. CPU and CUDA agree bit for bit (rope_math.h).
#pragma once

#include "ops/rope/rope.h"

namespace octet {

// The CUDA forward kernel (the same bits either way): kAuto the token-block kernel where the
// shapes allow it (rope_key_cuda.cu), kPerChunk the previous one-thread-per-8-columns kernel
// (kept for `octet bench attention`, and the fallback for odd shapes).
enum class RopeKeyKernel : uint8_t { kAuto, kPerChunk };

struct RopeKeyArgs {
  Tensor kv;           // (B, T, H, Wkv) f32 | bf16: columns [0, nope) read
  int64_t nope = 0;    // dn, 0 <= dn <= Wkv
  Tensor kr;           // (B, T, Wr) same dtype: columns [kr_col, kr_col + d) read (before RoPE)
  int64_t kr_col = 0;  // kr_col + d <= Wr
  RopeTable table;     // positions >= T
  RopePairing pairing = RopePairing::kHalf;
  RopeKeyKernel kernel = RopeKeyKernel::kAuto;
};

// k = [kv[..., :dn] ; rope(kr) broadcast over heads], (B, T, H, dn + d) in kv's dtype (`=`).
Tensor rope_key_forward(Context& ctx, const RopeKeyArgs& args);

struct RopeKeyBackwardArgs {
  Tensor grad_k;       // (B, T, H, dn + d) f32 | bf16: the key's gradient
  Tensor grad_kv;      // (B, T, H, Wkv) same dtype, dn <= Wkv: columns [0, dn) written (=)
  Tensor grad_kr;      // (B, T, Wr) same dtype: columns [kr_col, kr_col + d) written (=)
  int64_t kr_col = 0;  // kr_col + d <= Wr
  RopeTable table;
  RopePairing pairing = RopePairing::kHalf;
};

// The gradients of kv's nope columns and of the shared rope key before RoPE, as above.
void rope_key_backward(Context& ctx, const RopeKeyBackwardArgs& args);

}  // namespace octet
