// Rotary position embedding (RoPE) as the transformers library's DeepseekV3 applies it to the rope
// part of q (per head) and to the shared rope key k_pe.
//
// A table holds, for positions t = 0..P-1 and pairs j = 0..d/2-1 (d = qk_rope_head_dim):
//   inv_freq_j = 1 / theta^(2j / d),  cos[t][j] = cos(t * inv_freq_j),  sin[t][j] = sin(t *
//   inv_freq_j)
// computed in FP64 on the host once and rounded to FP32 (transformers computes the angle in FP32;
// the two tables differ by about 1e-4 at t ~ 8k, where FP32's angle t * inv_freq loses that much).
//
// Rows of the input are (b, t, h); position = t (positions 0..T-1 per sequence). Within a row,
// channels [offset, offset + d) are the rope part x; the rest of the row is copied unchanged. With
// h = d/2, c = cos[t][j], s = sin[t][j], j < h:
//   kHalf (rope_interleave = false, rotate_half):  p = x[j],  q = x[j + h]
//   kInterleave (rope_interleave = true): x is first de-interleaved to [x0, x2, .., x1, x3, ..]
//                                         (apply_rotary_pos_emb_interleave), so p = x[2j], q = x[2j
//                                         + 1]
//   y[j] = p*c - q*s,   y[j + h] = q*c + p*s
// The output stays in the rotate_half layout in both modes, as in transformers (the de-interleave
// is not undone). Backward is the transpose: dp = dy[j]*c + dy[j+h]*s, dq = dy[j+h]*c - dy[j]*s,
// written back to the positions p and q came from.
//
// Arithmetic: FP32, each output one fma of one rounded product, u = fma(p, c, -(q*s)),
// v = fma(q, c, p*s); BF16 outputs round that to nearest even. CPU and CUDA agree bit for bit.
// Outputs are freshly allocated (`=`), dtype and shape of the input.
#pragma once

#include "core/context.h"

namespace octet {

enum class RopePairing : uint8_t {
  kHalf,        // rotate_half on channels (j, j + d/2); config rope_interleave = false
  kInterleave,  // pairs (2j, 2j + 1) de-interleaved first;  config rope_interleave = true
};

struct RopeTable {
  Tensor cos;             // (positions, rope_dim / 2) f32 on the context's device
  Tensor sin;             // (positions, rope_dim / 2) f32
  int64_t rope_dim = 0;   // d, even
  int64_t positions = 0;  // P: the longest sequence the table serves
  double theta = 0;
};

// Builds the table on the host (FP64) and copies it to the context's device.
RopeTable make_rope_table(Context& ctx, int64_t positions, int64_t rope_dim, double theta);

// The checks every rope op makes of its table: even rope_dim > 0, F32 cos/sin of shape
// (positions, rope_dim / 2) on the context's device, and positions >= the sequence length seq.
void check_rope_table(Context& ctx, const RopeTable& table, int64_t seq, const char* op);

struct RopeArgs {
  Tensor input;     // (B, T, H, W) or (B, T, W) f32 | bf16; forward: x, backward: dy
  RopeTable table;  // positions >= T, rope_dim = d
  RopePairing pairing = RopePairing::kHalf;
  int64_t offset = 0;  // first rope channel in W; offset + d <= W
};

// y = rope(x): rotated channels as above, the rest of each row copied.
Tensor rope_forward(Context& ctx, const RopeArgs& args);
// dx = rope^T(dy): the inverse rotation (and re-interleave for kInterleave); other channels copied.
Tensor rope_backward(Context& ctx, const RopeArgs& args);

}  // namespace octet
