// Device code of moe_permute_quantize_transposed (moe_permute.h): the fused FP8 dispatch together
// with the scaling-aware transpose of what it writes, one 128x128 tile of the permuted rows a
// block. Bit for bit moe_permute_quantize followed by moe_permute_transposed of the quantized rows
// (the CPU's reference):
//   - each row's 128 columns are quantized as permute_quantize_kernel quantizes a group: the max of
//     abs_bits, compute_scale, the FP32 product and the hardware's cvt.rn.satfinite;
//   - the codes stay in registers for the transpose (transpose_tile_store, the tile kernel's own
//     second half), so the row-wise copy is written once and never read back.
// A token's row is read by each of its k tiles (from L2 after the first).
#pragma once

#include <cstdint>

#include "ops/quantize/quantize_transpose_kernels.cuh"

namespace octet::cuda::kernels {

// Blocks (bx, by), by < rblocks: tile (by, bx) of the (rows, cols) permuted tensor. Thread t owns
// tile rows 4 m .. 4 m + 3 (m = t / 8) at columns 16 cq .. 16 cq + 15 (cq = t % 8): two 16-byte
// loads of BF16 a row; a row's 128 columns are the 8 lanes 8 (lane / 8) .. + 7 of one warp.
// Padding rows (token_of -1) get codes 0 and scale_inv 1.0, as the dispatch writes them. Blocks
// with by >= rblocks fold into amax the tokens none of whose k choices is kept (invalid ids), a
// thread per token, so that amax covers the whole of x as moe_permute_quantize's does.
// Contract (the launcher checks it): x BF16 with cols % 16 == 0, x, q and out 16-byte aligned,
// rows % 16 == 0.
template <Fp8Format kFmt>
__global__ void __launch_bounds__(kTileThreads, 4)
    permute_quantize_transpose_kernel(const uint16_t* __restrict__ x,
                                      const int32_t* __restrict__ token_of,
                                      const int32_t* __restrict__ row_of, int64_t tokens, int k,
                                      int64_t rows, int64_t cols, ScaleRule rule,
                                      uint8_t* __restrict__ q, float* __restrict__ scale_inv,
                                      uint32_t* __restrict__ amax_bits, uint8_t* __restrict__ out,
                                      float* __restrict__ out_scale_inv, bool per_row) {
  static_assert(kTile == 128 && kTileThreads == 256, "32 row quads x 8 column chunks");
  __shared__ TransposeSmem s;
  const int64_t rblocks = ceil_div(rows, kGroup), groups = ceil_div(cols, kGroup);
  if (blockIdx.y >= rblocks) {  // tokens dispatched nowhere: their |x| for amax only
    const int64_t t =
        (static_cast<int64_t>(blockIdx.y - rblocks) * gridDim.x + blockIdx.x) * kTileThreads +
        threadIdx.x;
    uint32_t seen = 0;
    if (t < tokens) {
      bool kept = false;
      for (int j = 0; j < k; ++j) kept = kept || row_of[t * k + j] >= 0;
      if (!kept)
        for (int64_t c = 0; c < cols; ++c)
          seen = max(seen, abs_bits(bf16_to_float(x[t * cols + c])));
    }
    block_amax_to_global(seen, amax_bits, s.warp_max);
    return;
  }
  const int cq = threadIdx.x % 8, m = threadIdx.x / 8;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTile + cq * 16;
  const bool on = c < cols;  // the chunk is wholly inside or outside (cols % 16 == 0)

  // Source tokens (-1: padding, -2: past the end), then all 8 loads before the first use.
  int64_t src[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + 4 * m + i;
    src[i] = r < rows ? int64_t{token_of[r]} : -2;
  }
  uint4 raw[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (src[i] >= 0 && on) {
      const uint4* p = reinterpret_cast<const uint4*>(x + src[i] * cols + c);
      raw[i][0] = p[0];
      raw[i][1] = p[1];
    } else {
      raw[i][0] = raw[i][1] = make_uint4(0, 0, 0, 0);
    }
  }

  // Quantize each row's group: its amax over the 8 lanes that hold it, the scale, the codes.
  uint4 code[4];
  float si[4];
  uint32_t seen = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float v[16];
    const uint32_t w[8] = {raw[i][0].x, raw[i][0].y, raw[i][0].z, raw[i][0].w,
                           raw[i][1].x, raw[i][1].y, raw[i][1].z, raw[i][1].w};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[2 * e] = bits_float(w[e] << 16);
      v[2 * e + 1] = bits_float(w[e] & 0xFFFF0000u);
    }
    uint32_t a = 0;
#pragma unroll
    for (int e = 0; e < 16; ++e) a = max(a, abs_bits(v[e]));
    for (int o = 4; o > 0; o /= 2) a = max(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
    seen = max(seen, a);
    const float scale = compute_scale(bits_float(a), rule);
    si[i] = src[i] >= 0 ? scale_inverse(scale) : (src[i] == -1 ? 1.0f : 0.0f);
    float p[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) p[e] = rn::mul(v[e], scale);
    code[i] = make_uint4(
        cvt_fp8x4<kFmt>(p[0], p[1], p[2], p[3]), cvt_fp8x4<kFmt>(p[4], p[5], p[6], p[7]),
        cvt_fp8x4<kFmt>(p[8], p[9], p[10], p[11]), cvt_fp8x4<kFmt>(p[12], p[13], p[14], p[15]));
    if (src[i] == -1) code[i] = make_uint4(0, 0, 0, 0);  // padding: zeros whatever the scale
    const int64_t r = r0 + 4 * m + i;
    if (src[i] != -2) {
      if (on) *reinterpret_cast<uint4*>(q + r * cols + c) = code[i];
      if (cq == 0) scale_inv[r * groups + blockIdx.x] = si[i];
    }
  }

  // transpose_tile_store's reads of s.warp_max are behind its last barrier: free to reuse here.
  transpose_tile_store<kFmt>(s, code, si, rows, cols, out, out_scale_inv, true, per_row);
  block_amax_to_global(seen, amax_bits, s.warp_max);
}

}  // namespace octet::cuda::kernels
