// Device code of the moe_permute family. Maps are integers (exact); payload moves are copies; sums
// use numerics/fp32_rn.h in the orders moe_permute.h states, so results are bit-identical to the
// CPU's.
#pragma once

#include <cstdint>

#include "numerics/fp32_rn.h"
#include "numerics/fp8.h"
#include "numerics/scale.h"

namespace octet::cuda::kernels {

inline constexpr int kRowThreads = 128;  // threads per row of the row-copy and row-sum kernels

// Assignment a = t k + j -> sort key (expert id, or E for an invalid id: sorted last and dropped)
// and value a; valid ids are counted (integer atomics: order-independent).
__global__ void permute_keys_kernel(const int32_t* __restrict__ idx, int64_t n, int experts,
                                    uint32_t* __restrict__ keys, int32_t* __restrict__ vals,
                                    int32_t* __restrict__ counts) {
  const int64_t a = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (a >= n) return;
  const int32_t e = idx[a];
  const bool valid = e >= 0 && e < experts;
  keys[a] = valid ? static_cast<uint32_t>(e) : static_cast<uint32_t>(experts);
  vals[a] = static_cast<int32_t>(a);
  if (valid) atomicAdd(counts + e, 1);
}

// One thread: group sizes (padded or not), offsets, and where each expert starts in the sorted
// order. E is small (256 for DeepSeek-V3), so a serial scan costs less than a launch of a parallel
// one.
__global__ void permute_offsets_kernel(const int32_t* __restrict__ counts, int experts, bool pad128,
                                       int32_t* __restrict__ sizes, int32_t* __restrict__ offsets,
                                       int32_t* __restrict__ sorted_start) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int32_t off = 0, pos = 0;
  for (int e = 0; e < experts; ++e) {
    const int32_t c = counts[e];
    const int32_t size = pad128 ? (c + 127) / 128 * 128 : c;
    sizes[e] = size;
    offsets[e] = off;
    sorted_start[e] = pos;
    off += size;
    pos += c;
  }
  offsets[experts] = off;
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
// pointers) or uint8_t (any row size; byte b of a row takes byte b % 4 of the fill word).
template <typename V>
__global__ void gather_rows_kernel(const V* __restrict__ src, const int32_t* __restrict__ token_of,
                                   int64_t rows, int64_t row_elems, uint32_t fill_word,
                                   V* __restrict__ out) {
  static_assert(sizeof(V) == 16 || sizeof(V) == 1, "16-byte vectors or bytes");
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t t = token_of[r];
    V* dst = out + r * row_elems;
    if (t >= 0) {
      const V* s = src + t * row_elems;
      for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) dst[i] = s[i];
    } else {
      for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) {
        if constexpr (sizeof(V) == 16)
          dst[i] = make_uint4(fill_word, fill_word, fill_word, fill_word);
        else
          dst[i] = static_cast<uint8_t>(fill_word >> (8 * (i % 4)));
      }
    }
  }
}

// out[t, d] = sum_j w[t, j] * src[row_of[t, j], d] (w = 1 when weight is null), FP32 in slot order.
// One block per token, kCols consecutive columns per thread. InT/OutT: float or uint16_t (BF16
// bits).
template <typename InT, typename OutT, int kCols>
__global__ void weighted_gather_kernel(const InT* __restrict__ src,
                                       const float* __restrict__ weight,
                                       const int32_t* __restrict__ row_of, int64_t tokens,
                                       int top_k, int64_t cols, OutT* __restrict__ out) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    for (int64_t c0 = int64_t{threadIdx.x} * kCols; c0 < cols; c0 += int64_t{blockDim.x} * kCols) {
      float acc[kCols];
#pragma unroll
      for (int v = 0; v < kCols; ++v) acc[v] = 0.0f;
      for (int j = 0; j < top_k; ++j) {
        const int32_t row = row_of[t * top_k + j];
        if (row < 0) continue;  // a dropped (invalid) choice; the CPU rejects those
        const float w = weight ? weight[t * top_k + j] : 1.0f;
        const InT* s = src + int64_t{row} * cols + c0;
#pragma unroll
        for (int v = 0; v < kCols; ++v) {
          if (c0 + v >= cols) break;
          const float x = load_float(s, v);
          acc[v] = rn::add(acc[v], weight ? rn::mul(w, x) : x);
        }
      }
#pragma unroll
      for (int v = 0; v < kCols; ++v)
        if (c0 + v < cols) store_float(out, t * cols + c0 + v, acc[v]);
    }
  }
}

// Combine backward, part 1: d_expert_out row r = w[t, j] * d_out[t] for the (t, j) that owns r;
// padding rows 0.
template <typename DyT, typename OutT>
__global__ void combine_backward_rows_kernel(const DyT* __restrict__ d_out,
                                             const float* __restrict__ weight,
                                             const int32_t* __restrict__ row_of,
                                             const int32_t* __restrict__ token_of, int64_t rows,
                                             int top_k, int64_t cols, OutT* __restrict__ d_expert) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t t = token_of[r];
    float w = 0.0f;
    bool owned = false;
    if (t >= 0) {
      for (int j = 0; j < top_k; ++j) {
        if (row_of[int64_t{t} * top_k + j] == r) {
          w = weight[int64_t{t} * top_k + j];
          owned = true;
          break;
        }
      }
    }
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      store_float(d_expert, r * cols + c,
                  owned ? rn::mul(w, load_float(d_out, int64_t{t} * cols + c)) : 0.0f);
  }
}

// Combine backward, part 2: one warp per assignment (t, j): <d_out[t], expert_out[row_of[t, j]]>
// with 32 lane-strided partial sums and an xor butterfly (the order moe_permute.h states).
template <typename DyT, typename XT>
__global__ void combine_backward_weight_kernel(const DyT* __restrict__ d_out,
                                               const XT* __restrict__ expert_out,
                                               const int32_t* __restrict__ row_of,
                                               int64_t assignments, int top_k, int64_t cols,
                                               float* __restrict__ d_weight) {
  const int lane = threadIdx.x % 32;
  const int64_t a = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  if (a >= assignments) return;  // whole warps leave together: blockDim is a multiple of 32
  const int32_t row = row_of[a];
  const int64_t t = a / top_k;
  float partial = 0.0f;
  if (row >= 0) {
    for (int64_t c = lane; c < cols; c += 32)
      partial = rn::add(partial, rn::mul(load_float(d_out, t * cols + c),
                                         load_float(expert_out, int64_t{row} * cols + c)));
  }
  for (int h = 16; h > 0; h >>= 1)
    partial = rn::add(partial, __shfl_xor_sync(0xFFFFFFFFu, partial, h));
  if (lane == 0) d_weight[a] = partial;
}

// The fused FP8 dispatch (moe_permute_quantize): one block per token (grid-stride), one warp per
// group of 128 columns (4 per lane). The token's group is read once, its amax, scale and FP8 codes
// computed once (numerics/scale.h, as the quantize kernels do), and written to each of the token's
// k rows. Every thread keeps the max |x| bits it saw; one atomicMax per warp gives the amax.
__device__ inline float load_element(const float* x, int64_t i) {
  return x[i];
}
__device__ inline float load_element(const uint16_t* x, int64_t i) {
  return bf16_to_float(x[i]);
}

template <typename InT>
__global__ void permute_quantize_kernel(const InT* __restrict__ x,
                                        const int32_t* __restrict__ row_of, int64_t tokens, int k,
                                        int64_t cols, ScaleRule rule, uint8_t* __restrict__ q,
                                        float* __restrict__ scale_inv, uint32_t* amax_bits) {
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int warps = static_cast<int>(blockDim.x / 32);
  const int64_t groups = (cols + 127) / 128;
  uint32_t seen = 0;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    for (int64_t g = warp; g < groups; g += warps) {
      float v[4];
      uint32_t m = 0;
      for (int i = 0; i < 4; ++i) {
        const int64_t c = g * 128 + lane + 32 * i;
        v[i] = c < cols ? load_element(x, t * cols + c) : 0.0f;
        m = max(m, abs_bits(v[i]));
      }
      for (int s = 16; s > 0; s /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, s));
      seen = max(seen, m);
      const float scale = compute_scale(bits_float(m), rule);
      uint8_t code[4];
      for (int i = 0; i < 4; ++i) code[i] = quantize_value(v[i], scale, rule.format);
      for (int j = 0; j < k; ++j) {
        const int32_t row = row_of[t * k + j];
        if (row < 0) continue;  // a dropped (invalid) choice
        for (int i = 0; i < 4; ++i) {
          const int64_t c = g * 128 + lane + 32 * i;
          if (c < cols) q[row * cols + c] = code[i];
        }
        if (lane == 0) scale_inv[row * groups + g] = scale_inverse(scale);
      }
    }
  }
  for (int s = 16; s > 0; s /= 2) seen = max(seen, __shfl_xor_sync(0xFFFFFFFFu, seen, s));
  if (lane == 0) atomicMax(amax_bits, seen);
}

// The padding rows of the fused dispatch (token_of -1): payload 0, scale_inv 1.0.
__global__ void permute_quantize_padding_kernel(const int32_t* __restrict__ token_of, int64_t rows,
                                                int64_t cols, uint8_t* __restrict__ q,
                                                float* __restrict__ scale_inv) {
  const int64_t groups = (cols + 127) / 128;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if (token_of[r] >= 0) continue;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) q[r * cols + c] = 0;
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) scale_inv[r * groups + g] = 1.0f;
  }
}

}  // namespace octet::cuda::kernels
