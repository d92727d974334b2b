// Device code of the moe_permute family. Maps are integers (exact); payload moves are copies; sums
// use numerics/fp32_rn.h in the orders moe_permute.h states, so results are bit-identical to the
// CPU's.
#pragma once

#include <cstdint>

#include "numerics/fp32_rn.h"
#include "numerics/fp8.h"
#include "numerics/scale.h"
#include "ops/cast/cast_backends.h"  // add_element: add_into's element
#include "ops/quantize/quantize_kernels.cuh"

namespace octet::cuda::kernels {

inline constexpr int kRowThreads = 128;  // most threads per row of the row kernels

// Assignment a = t k + j -> sort key (expert id, or E for an invalid id: sorted last and dropped)
// and value a; valid ids are counted (integer atomics: order-independent), in a shared histogram per
// block when E <= kSharedHist (one global atomic per block and expert instead of one per
// assignment: thousands of atomics on one address serialise).
inline constexpr int kSharedHist = 4096;

__global__ void permute_keys_kernel(const int32_t* __restrict__ idx, int64_t n, int experts,
                                    uint32_t* __restrict__ keys, int32_t* __restrict__ vals,
                                    int32_t* __restrict__ counts) {
  extern __shared__ int32_t hist[];
  const bool local = experts <= kSharedHist;
  if (local) {
    for (int e = static_cast<int>(threadIdx.x); e < experts; e += static_cast<int>(blockDim.x))
      hist[e] = 0;
    __syncthreads();
  }
  for (int64_t a = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; a < n;
       a += int64_t{gridDim.x} * blockDim.x) {
    const int32_t e = idx[a];
    const bool valid = e >= 0 && e < experts;
    keys[a] = valid ? static_cast<uint32_t>(e) : static_cast<uint32_t>(experts);
    vals[a] = static_cast<int32_t>(a);
    if (valid) atomicAdd(local ? hist + e : counts + e, 1);
  }
  if (local) {
    __syncthreads();
    for (int e = static_cast<int>(threadIdx.x); e < experts; e += static_cast<int>(blockDim.x))
      if (hist[e] != 0) atomicAdd(counts + e, hist[e]);
  }
}

// One block: group sizes (padded or not), offsets, and where each expert starts in the sorted
// order, as block-wide exclusive scans (integers: exact in any order) over chunks of blockDim
// experts with a running carry. A serial loop would wait for one global load per expert.
__global__ void permute_offsets_kernel(const int32_t* __restrict__ counts, int experts, bool pad128,
                                       int32_t* __restrict__ sizes, int32_t* __restrict__ offsets,
                                       int32_t* __restrict__ sorted_start) {
  __shared__ int32_t warp_size[32], warp_count[32];
  __shared__ int32_t carry_size, carry_count;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int warps = static_cast<int>(blockDim.x / 32);
  if (threadIdx.x == 0) carry_size = carry_count = 0;
  __syncthreads();
  for (int base = 0; base < experts; base += static_cast<int>(blockDim.x)) {
    const int e = base + static_cast<int>(threadIdx.x);
    const int32_t c = e < experts ? counts[e] : 0;
    const int32_t size = pad128 ? (c + 127) / 128 * 128 : c;
    int32_t is = size, ic = c;  // inclusive scans within the warp
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t a = __shfl_up_sync(0xFFFFFFFFu, is, o), b = __shfl_up_sync(0xFFFFFFFFu, ic, o);
      if (lane >= o) is += a, ic += b;
    }
    if (lane == 31) warp_size[warp] = is, warp_count[warp] = ic;
    __syncthreads();
    if (warp == 0) {  // exclusive scan of the warp totals
      const int32_t ws = lane < warps ? warp_size[lane] : 0,
                    wc = lane < warps ? warp_count[lane] : 0;
      int32_t xs = ws, xc = wc;
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t a = __shfl_up_sync(0xFFFFFFFFu, xs, o),
                      b = __shfl_up_sync(0xFFFFFFFFu, xc, o);
        if (lane >= o) xs += a, xc += b;
      }
      if (lane < warps) warp_size[lane] = xs - ws, warp_count[lane] = xc - wc;
    }
    __syncthreads();
    const int32_t end_size = carry_size + warp_size[warp] + is;
    const int32_t end_count = carry_count + warp_count[warp] + ic;
    if (e < experts) {
      sizes[e] = size;
      offsets[e] = end_size - size;
      sorted_start[e] = end_count - c;
    }
    __syncthreads();  // every thread has read the carries
    if (threadIdx.x == blockDim.x - 1) carry_size = end_size, carry_count = end_count;
    __syncthreads();
  }
  if (threadIdx.x == 0) offsets[experts] = carry_size;
}

// Sorted position p (stable by assignment index) -> its row in the layout.
__global__ void permute_rows_kernel(const uint32_t* __restrict__ keys,
                                    const int32_t* __restrict__ vals, int64_t n, int experts,
                                    int top_k, const int32_t* __restrict__ offsets,
                                    const int32_t* __restrict__ sorted_start,
                                    int32_t* __restrict__ row_of, int32_t* __restrict__ token_of) {
  const int64_t p = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (p >= n) return;
  const uint32_t e = keys[p];
  if (e >= static_cast<uint32_t>(experts)) return;
  const int32_t a = vals[p];
  const int32_t row = offsets[e] + static_cast<int32_t>(p - sorted_start[e]);
  row_of[a] = row;
  token_of[row] = a / top_k;
}

// out row r = src row token_of[r], or the fill pattern for padding rows. V: uint4 (16-byte rows and
// pointers) or uint8_t (any row size; byte b of a row takes byte b % 4 of the fill word). A thread
// per element of the output, grid-stride: consecutive threads take consecutive elements of a row
// and run on into the next row, so that narrow rows (an FP8 row's 1x128 scales: two 16-byte words)
// keep every lane busy. A block per row left most of its threads idle on those: 45 us for the 2 MB
// of scales of the baseline's dispatch, as long as its 67 MB of codes.
template <typename V>
__global__ void gather_rows_kernel(const V* __restrict__ src, const int32_t* __restrict__ token_of,
                                   int64_t rows, int64_t row_elems, uint32_t fill_word,
                                   V* __restrict__ out) {
  static_assert(sizeof(V) == 16 || sizeof(V) == 1, "16-byte vectors or bytes");
  const int64_t n = rows * row_elems;
  const bool small = n <= int64_t{0xFFFFFFFF};
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t r, c;
    if (small) {
      const uint32_t q = static_cast<uint32_t>(i) / static_cast<uint32_t>(row_elems);
      r = q, c = static_cast<uint32_t>(i) - q * static_cast<uint32_t>(row_elems);
    } else {
      r = i / row_elems, c = i - r * row_elems;
    }
    const int32_t t = token_of[r];
    if (t >= 0) {
      out[i] = src[t * row_elems + c];
    } else if constexpr (sizeof(V) == 16) {
      out[i] = make_uint4(fill_word, fill_word, fill_word, fill_word);
    } else {
      out[i] = static_cast<uint8_t>(fill_word >> (8 * (c % 4)));
    }
  }
}

// Vector access of 8 consecutive elements as FP32 (kVec: one 16-byte access per 8 BF16 or two per
// 8 F32, which needs 16-byte-aligned bases and a row length that is a multiple of 8; otherwise
// element by element with the row's bound). Element values are the same either way.
template <bool kVec, typename T>
__device__ __forceinline__ void load8(const T* __restrict__ row, int64_t c, int64_t cols,
                                      float (&v)[8]) {
  if constexpr (kVec) {
    if constexpr (sizeof(T) == 2) {
      const uint4 u = *reinterpret_cast<const uint4*>(row + c);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[2 * i] = bits_float(w[i] << 16);
        v[2 * i + 1] = bits_float(w[i] & 0xFFFF0000u);
      }
    } else {
      const float4 a = *reinterpret_cast<const float4*>(row + c);
      const float4 b = *reinterpret_cast<const float4*>(row + c + 4);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
      v[7] = b.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = c + i < cols ? load_float(row, c + i) : 0.0f;
  }
}

// v rounded to T and back (the value store8 would write): nearest even for BF16, v for FP32.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  if constexpr (sizeof(T) == 2) {
    return bits_float(static_cast<uint32_t>(float_to_bf16(v)) << 16);
  } else {
    return v;
  }
}

template <bool kVec, typename T>
__device__ __forceinline__ void store8(T* __restrict__ row, int64_t c, int64_t cols,
                                       const float (&v)[8]) {
  if constexpr (kVec) {
    if constexpr (sizeof(T) == 2) {
      uint32_t w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        w[i] = float_to_bf16(v[2 * i]) | (static_cast<uint32_t>(float_to_bf16(v[2 * i + 1])) << 16);
      *reinterpret_cast<uint4*>(row + c) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      *reinterpret_cast<float4*>(row + c) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(row + c + 4) = make_float4(v[4], v[5], v[6], v[7]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (c + i < cols) store_float(row, c + i, v[i]);
  }
}

// Padding rows (token_of < 0) among rows [first, first + 32): one warp finds them with a ballot and
// calls fill(r) for each, all 32 lanes together. The kernels that write every permuted row give a
// few trailing blocks to this (ceil(R / 32) warps in all) instead of a launch per row.
template <typename Fill>
__device__ __forceinline__ void for_padding_rows(const int32_t* __restrict__ token_of, int64_t rows,
                                                 int64_t first, Fill&& fill) {
  const int64_t r = first + static_cast<int>(threadIdx.x % 32);
  unsigned pad = __ballot_sync(0xFFFFFFFFu, r < rows && token_of[r] < 0);
  while (pad != 0) {
    const int b = __ffs(static_cast<int>(pad)) - 1;
    pad &= pad - 1;
    fill(first + b);
  }
}

// out[t, d] = sum_j w[t, j] * src[row_of[t, j], d] (w = 1 when weight is null), FP32 in slot order.
// One block per token (grid-stride), 8 consecutive columns per thread (kVec: 16-byte accesses).
// With d_topk set, also d_topk[t, j] = d_rows[row_of[t, j]] (0 for a dropped choice).
// InT/OutT: float or uint16_t (BF16 bits).
template <typename InT, typename OutT, bool kVec>
__global__ void weighted_gather_kernel(const InT* __restrict__ src,
                                       const float* __restrict__ weight,
                                       const int32_t* __restrict__ row_of, int64_t tokens,
                                       int top_k, int64_t cols, OutT* __restrict__ out,
                                       const float* __restrict__ d_rows, float* __restrict__ d_topk,
                                       const OutT* __restrict__ add0,
                                       const OutT* __restrict__ add1) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const int32_t* rows = row_of + t * top_k;
    if (d_topk != nullptr)  // moe_permute_weights_backward's copy, token t's slots
      for (int j = static_cast<int>(threadIdx.x); j < top_k; j += static_cast<int>(blockDim.x))
        d_topk[t * top_k + j] = rows[j] >= 0 ? d_rows[rows[j]] : 0.0f;
    for (int64_t c = int64_t{threadIdx.x} * 8; c < cols; c += int64_t{blockDim.x} * 8) {
      float acc[8];
#pragma unroll
      for (int v = 0; v < 8; ++v) acc[v] = 0.0f;
#pragma unroll 4
      for (int j = 0; j < top_k; ++j) {
        const int32_t row = rows[j];
        if (row < 0) continue;  // a dropped (invalid) choice; the CPU rejects those
        float x[8];
        load8<kVec>(src + int64_t{row} * cols, c, cols, x);
        if (weight) {
          const float w = weight[t * top_k + j];
#pragma unroll
          for (int v = 0; v < 8; ++v) acc[v] = rn::add(acc[v], rn::mul(w, x[v]));
        } else {
#pragma unroll
          for (int v = 0; v < 8; ++v) acc[v] = rn::add(acc[v], x[v]);
        }
      }
      // The addends as add_into adds them: each to the value rounded to OutT.
      const auto add = [&](const OutT* __restrict__ a) {
        float x[8];
        load8<kVec>(a + t * cols, c, cols, x);
#pragma unroll
        for (int v = 0; v < 8; ++v) acc[v] = add_element(round_to<OutT>(acc[v]), x[v]);
      };
      if (add0 != nullptr) add(add0);
      if (add1 != nullptr) add(add1);
      store8<kVec>(out + t * cols, c, cols, acc);
    }
  }
}

// Combine backward in one pass, token-major: block t (one per token) gives slot j to warp j % 4,
// which writes d_expert_out row row_of[t, j] = w[t, j] * d_out[t] and forms <d_out[t], x[row]>.
// The dot product keeps moe_permute.h's order (lane l sums the products of columns l, l + 32, ...):
// each 256-column chunk is loaded with 16-byte accesses, its products staged in shared memory, and
// lane l adds entries l + 32 i (i = 0..7) in order; then the xor butterfly. Blocks from `tokens` on
// zero the padding rows (for_padding_rows).
inline constexpr int kCombineWarps = 4;

template <typename DyT, typename XT, typename OutT, bool kVec>
__global__ void combine_backward_kernel(const DyT* __restrict__ d_out,
                                        const XT* __restrict__ expert_out,
                                        const float* __restrict__ weight,
                                        const int32_t* __restrict__ row_of,
                                        const int32_t* __restrict__ token_of, int64_t tokens,
                                        int top_k, int64_t rows, int64_t cols,
                                        OutT* __restrict__ d_expert, float* __restrict__ d_weight) {
  __shared__ float prod[kCombineWarps][256];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  if (blockIdx.x >= tokens) {
    const int64_t first = ((int64_t{blockIdx.x} - tokens) * kCombineWarps + warp) * 32;
    for_padding_rows(token_of, rows, first, [&](int64_t r) {
      const float zero[8] = {};
      for (int64_t c = int64_t{lane} * 8; c < cols; c += 256)
        store8<kVec>(d_expert + r * cols, c, cols, zero);
    });
    return;
  }
  const int64_t t = blockIdx.x;
  const DyT* dy_row = d_out + t * cols;
  for (int j = warp; j < top_k; j += kCombineWarps) {
    const int64_t a = t * top_k + j;
    const int32_t row = row_of[a];
    float partial = 0.0f;
    if (row >= 0) {
      const float w = weight[a];
      const XT* x_row = expert_out + int64_t{row} * cols;
      OutT* dst = d_expert + int64_t{row} * cols;
      for (int64_t c0 = 0; c0 < cols; c0 += 256) {
        const int64_t c = c0 + lane * 8;
        if (c < cols) {
          float dy[8], x[8], o[8];
          load8<kVec>(dy_row, c, cols, dy);
          load8<kVec>(x_row, c, cols, x);
#pragma unroll
          for (int v = 0; v < 8; ++v) {
            o[v] = rn::mul(w, dy[v]);
            prod[warp][lane * 8 + v] = rn::mul(dy[v], x[v]);
          }
          store8<kVec>(dst, c, cols, o);
        }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (c0 + lane + 32 * i < cols) partial = rn::add(partial, prod[warp][lane + 32 * i]);
        __syncwarp();
      }
    }
    for (int h = 16; h > 0; h >>= 1)
      partial = rn::add(partial, __shfl_xor_sync(0xFFFFFFFFu, partial, h));
    if (lane == 0) d_weight[a] = partial;
  }
}

// The fused FP8 dispatch (moe_permute_quantize; with tq, also the token rows themselves, tq (T,
// cols) and tscale (T, groups): moe_permute_quantize_keeping_rows). Blocks [0, main_blocks) stride
// over the tokens;
// each warp takes two groups of 128 columns at a time, a half-warp per group and 8 consecutive
// columns per lane (kVec: one 16-byte load of BF16, one 8-byte store of codes per destination
// row). The token's group is read once, its amax, scale and FP8 codes computed once
// (numerics/scale.h, as the quantize kernels do), and written to each of the token's k rows. The
// amax is a max of bit patterns (order-free): one atomicMax per block. Blocks from main_blocks on
// write the padding rows (payload 0, scale_inv 1.0). With w_rows set, the token's routing weights
// go onto its rows too (moe_permute_weights: w_rows[row_of[t, j]] = topk_w[t, j], padding rows 0).
inline constexpr int kQuantWarps = 4;

__device__ inline float load_element(const float* x, int64_t i) {
  return x[i];
}
__device__ inline float load_element(const uint16_t* x, int64_t i) {
  return bf16_to_float(x[i]);
}

template <typename InT, bool kVec>
__global__ void permute_quantize_kernel(
    const InT* __restrict__ x, const int32_t* __restrict__ row_of,
    const int32_t* __restrict__ token_of, int64_t tokens, int k, int64_t rows, int64_t cols,
    unsigned main_blocks, ScaleRule rule, uint8_t* __restrict__ q, float* __restrict__ scale_inv,
    uint32_t* amax_bits, uint8_t* __restrict__ tq, float* __restrict__ tscale,
    const float* __restrict__ topk_w, float* __restrict__ w_rows) {
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t groups = (cols + 127) / 128;
  if (blockIdx.x >= main_blocks) {
    const int64_t first = ((int64_t{blockIdx.x} - main_blocks) * kQuantWarps + warp) * 32;
    for_padding_rows(token_of, rows, first, [&](int64_t r) {
      uint8_t* dst = q + r * cols;
      for (int64_t c = int64_t{lane} * 8; c < cols; c += 256) {
        if constexpr (kVec) {
          *reinterpret_cast<uint2*>(dst + c) = make_uint2(0u, 0u);
        } else {
          for (int i = 0; i < 8; ++i)
            if (c + i < cols) dst[c + i] = 0;
        }
      }
      for (int64_t g = lane; g < groups; g += 32) scale_inv[r * groups + g] = 1.0f;
      if (w_rows != nullptr && lane == 0) w_rows[r] = 0.0f;
    });
    return;
  }
  __shared__ uint32_t block_amax;
  if (threadIdx.x == 0) block_amax = 0;
  __syncthreads();
  const int half = lane / 16, hl = lane % 16;
  uint32_t seen = 0;
  for (int64_t t = blockIdx.x; t < tokens; t += main_blocks) {
    if (w_rows != nullptr)  // moe_permute_weights' copy: token t's weights onto its rows
      for (int j = static_cast<int>(threadIdx.x); j < k; j += static_cast<int>(blockDim.x)) {
        const int32_t row = row_of[t * k + j];
        if (row >= 0) w_rows[row] = topk_w[t * k + j];
      }
    for (int64_t gp = warp; 2 * gp < groups; gp += kQuantWarps) {
      const int64_t g = 2 * gp + half;
      const int64_t c = g * 128 + hl * 8;
      const bool active = g < groups && c < cols;
      float v[8] = {};
      if (active) load8<kVec>(x + t * cols, c, cols, v);
      uint32_t m = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) m = max(m, abs_bits(v[i]));
      for (int s = 8; s > 0; s /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, s));
      seen = max(seen, m);
      const float scale = compute_scale(bits_float(m), rule);
      const float inverse = scale_inverse(scale);
      // quantize_value's codes: the product rounded to FP32, then the hardware's cvt.rn.satfinite
      // (the software rounding's bits, quantize_kernels.cuh), a pair of elements an instruction.
      float p[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) p[i] = rn::mul(v[i], scale);
      const uint32_t lo = cvt_fp8x2(p[0], p[1], rule.format) |
                          static_cast<uint32_t>(cvt_fp8x2(p[2], p[3], rule.format)) << 16;
      const uint32_t hi = cvt_fp8x2(p[4], p[5], rule.format) |
                          static_cast<uint32_t>(cvt_fp8x2(p[6], p[7], rule.format)) << 16;
      // Slot j = -1: the token's own row of tq (when asked for), then its k dispatched rows.
      for (int j = tq != nullptr ? -1 : 0; j < k; ++j) {
        const int32_t row = j < 0 ? 0 : row_of[t * k + j];
        if (row < 0) continue;  // a dropped (invalid) choice
        uint8_t* dst = j < 0 ? tq + t * cols : q + int64_t{row} * cols;
        float* sdst = j < 0 ? tscale + t * groups : scale_inv + int64_t{row} * groups;
        if (active) {
          if constexpr (kVec) {
            *reinterpret_cast<uint2*>(dst + c) = make_uint2(lo, hi);
          } else {
            for (int i = 0; i < 8; ++i)
              if (c + i < cols)
                dst[c + i] = static_cast<uint8_t>((i < 4 ? lo : hi) >> (8 * (i % 4)));
          }
        }
        if (hl == 0 && g < groups) sdst[g] = inverse;
      }
    }
  }
  for (int s = 16; s > 0; s /= 2) seen = max(seen, __shfl_xor_sync(0xFFFFFFFFu, seen, s));
  if (lane == 0) atomicMax(&block_amax, seen);
  __syncthreads();
  if (threadIdx.x == 0 && amax_bits != nullptr) atomicMax(amax_bits, block_amax);
}

}  // namespace octet::cuda::kernels
