// Device code of the moe_router family. Scores, keys and weight formulas are the host/device
// functions of moe_router_math.h and numerics/fp32_rn.h that the CPU reference calls, in the same
// order, so the results are bit-identical to moe_router_cpu.cpp.
#pragma once

#include <cstdint>

#include "ops/moe_router/moe_router.h"
#include "ops/moe_router/moe_router_math.h"

namespace octet::cuda::kernels {

inline constexpr int kRouterWarps = 4;  // tokens per block of the forward kernel, one warp each
inline constexpr int kMaxExperts = 1024;
static_assert(kMaxExperts <= 32 * 32,
              "a lane's candidate mask is one 32-bit word (32 experts per lane)");

struct RouterParams {
  int experts;  // E
  int top_k;    // k <= 32
  int n_group;  // <= 32
  int topk_group;
  bool norm;      // TopkNorm::kSumToOne
  bool exclude;   // GroupMaskFill::kExclude
  float scaling;  // routed_scaling_factor
};

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t w = __shfl_xor_sync(0xFFFFFFFFu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// One warp per token (blocks stride over the tokens). Lane l owns experts l, l + 32, ...; bit i of
// `removed` says expert l + 32 i is no longer a candidate. Shared memory: per warp the unbiased
// scores s and the candidate values (E each), then the block's histogram of chosen experts (E
// ints; integer counts are order-free, and one global atomic per block and expert replaces one per
// choice, which would serialise on the few addresses).
__global__ void router_forward_kernel(const float* __restrict__ logits,
                                      const float* __restrict__ bias, int64_t tokens,
                                      RouterParams p, int32_t* __restrict__ idx_out,
                                      float* __restrict__ w_out, int32_t* __restrict__ counts) {
  extern __shared__ float router_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int E = p.experts, G = E / p.n_group;
  float* s = router_smem + warp * 2 * E;
  float* cand = s + E;
  auto* hist = reinterpret_cast<int32_t*>(router_smem + kRouterWarps * 2 * E);
  for (int e = static_cast<int>(threadIdx.x); e < E; e += static_cast<int>(blockDim.x)) hist[e] = 0;
  __syncthreads();
  for (int64_t t = int64_t{blockIdx.x} * kRouterWarps + warp; t < tokens;
       t += int64_t{gridDim.x} * kRouterWarps) {
    const float* row = logits + t * E;
    for (int e = lane; e < E; e += 32) {
      const float sv = rn::sigmoid_rn(row[e]);
      s[e] = sv;
      cand[e] = router::canonical(rn::add(sv, bias[e]));
    }
    __syncwarp();
    // Group scores: lane g scans group g for its two largest selection scores.
    uint64_t gkey = 0;
    if (lane < p.n_group) {
      float score = 0.0f;
      if (p.n_group > 1) {
        uint64_t k1 = 0, k2 = 0;
        for (int e = lane * G; e < (lane + 1) * G; ++e) {
          const uint64_t key = router::select_key(cand[e], static_cast<uint32_t>(e));
          if (key > k1) {
            k2 = k1;
            k1 = key;
          } else if (key > k2) {
            k2 = key;
          }
        }
        score = rn::add(cand[router::key_index(k1)], cand[router::key_index(k2)]);
      }
      gkey = router::select_key(score, static_cast<uint32_t>(lane));
    }
    uint32_t kept = 0;
    for (int i = 0; i < p.topk_group; ++i) {
      const uint32_t g = router::key_index(warp_max_u64(gkey));
      kept |= 1u << g;
      if (lane == static_cast<int>(g)) gkey = 0;
    }
    __syncwarp();  // every lane has read the group scans' cand values before they change
    uint32_t removed = 0;
    for (int i = 0, e = lane; e < E; ++i, e += 32) {
      if ((kept >> (e / G)) & 1u) continue;
      if (p.exclude)
        removed |= 1u << i;
      else
        cand[e] = 0.0f;
    }
    int my_idx = 0;
    for (int j = 0; j < p.top_k; ++j) {
      uint64_t best = 0;
      for (int i = 0, e = lane; e < E; ++i, e += 32) {
        if ((removed >> i) & 1u) continue;
        const uint64_t key = router::select_key(cand[e], static_cast<uint32_t>(e));
        best = key > best ? key : best;
      }
      const int e = static_cast<int>(router::key_index(warp_max_u64(best)));
      if (lane == e % 32) removed |= 1u << (e / 32);
      if (lane == j) my_idx = e;
    }
    const float sj = lane < p.top_k ? s[my_idx] : 0.0f;
    float denom = 0.0f;
    for (int j = 0; j < p.top_k; ++j) denom = rn::add(denom, __shfl_sync(0xFFFFFFFFu, sj, j));
    denom = rn::add(denom, router::kNormEpsilon);
    if (lane < p.top_k) {
      const float w = p.norm ? rn::mul(rn::div(sj, denom), p.scaling) : rn::mul(sj, p.scaling);
      idx_out[t * p.top_k + lane] = my_idx;
      w_out[t * p.top_k + lane] = w;
      atomicAdd(hist + my_idx, 1);  // integer: order-independent
    }
    __syncwarp();  // the next token overwrites s and cand
  }
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < E; e += static_cast<int>(blockDim.x))
    if (hist[e] != 0) atomicAdd(counts + e, hist[e]);
}

// One thread per token; d_logits was zeroed. Expert ids outside [0, E) are skipped (the CPU
// throws).
__global__ void router_backward_kernel(const float* __restrict__ logits,
                                       const int32_t* __restrict__ idx, const float* __restrict__ g,
                                       int64_t tokens, RouterParams p,
                                       float* __restrict__ d_logits) {
  const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const int E = p.experts, k = p.top_k;
  float s[32];
  float denom = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int e = idx[t * k + j];
    s[j] = (e >= 0 && e < E) ? rn::sigmoid_rn(logits[t * E + e]) : 0.0f;
    denom = rn::add(denom, s[j]);
  }
  denom = rn::add(denom, router::kNormEpsilon);
  float dot = 0.0f;
  for (int j = 0; j < k; ++j) dot = rn::add(dot, rn::mul(g[t * k + j], rn::div(s[j], denom)));
  for (int j = 0; j < k; ++j) {
    const int e = idx[t * k + j];
    if (e < 0 || e >= E) continue;
    const float gj = g[t * k + j];
    const float ds =
        p.norm ? rn::div(rn::mul(p.scaling, rn::sub(gj, dot)), denom) : rn::mul(p.scaling, gj);
    d_logits[t * E + e] = rn::mul(ds, rn::mul(s[j], rn::sub(1.0f, s[j])));
  }
}

// One block: the total load, then each expert's sign step (integer comparison with the mean).
__global__ void router_bias_update_kernel(float* __restrict__ bias,
                                          const int32_t* __restrict__ counts, int experts,
                                          float rate) {
  __shared__ long long total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  long long mine = 0;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) mine += counts[e];
  atomicAdd(reinterpret_cast<unsigned long long*>(&total), static_cast<unsigned long long>(mine));
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    const long long diff = total - static_cast<long long>(experts) * counts[e];
    const float sign = diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f);
    bias[e] = rn::add(bias[e], rn::mul(rate, sign));
  }
}

// Balance loss kernels. A block of kBalanceThreads takes a tile of consecutive tokens: the
// sigmoids of the tile are computed by all threads from coalesced loads into shared memory (rows
// padded to E + 1 floats: no bank conflicts), then one thread per token runs the sums whose order
// is fixed (expert order), and elementwise work is again spread over all threads.
inline constexpr int kBalanceThreads = 256;

// Tokens per tile: the tile's scores take at most 32 KiB.
__host__ __device__ inline int balance_tile_tokens(int experts) {
  const int t = 8192 / (experts + 1);
  return t < 1 ? 1 : (t > 64 ? 64 : t);
}

// Sigmoids of tokens [t0, t0 + nt) into tile[tt * (E + 1) + e]. The tile's logits are contiguous;
// each thread issues 8 loads before it computes (one memory latency per 8 elements, not per one).
__device__ inline void balance_stage_scores(const float* __restrict__ logits, int64_t t0, int nt,
                                            int experts, float* tile) {
  const int n = nt * experts, step = static_cast<int>(blockDim.x);
  const float* src = logits + t0 * experts;
  for (int i0 = static_cast<int>(threadIdx.x); i0 < n; i0 += 8 * step) {
    float v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = i0 + u * step < n ? src[i0 + u * step] : 0.0f;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int i = i0 + u * step;
      if (i < n) tile[(i / experts) * (experts + 1) + i % experts] = rn::sigmoid_rn(v[u]);
    }
  }
}

inline constexpr int kBalanceHist = 2048;  // (sequence, expert) counters a block keeps in shared

// Pass 1: S_t (expert order) and the (sequence, expert) counts (in shared memory when the tile's
// sequences x E fit, then one global atomic per nonzero counter); with `share` (the forward) also
// every token's normalised scores s_{t,e} / S_t (FP32), the operands of pass 2's sums.
__global__ void balance_stats_kernel(const float* __restrict__ logits,
                                     const int32_t* __restrict__ idx, int64_t rows, int experts,
                                     int k, int64_t seq_len, float* __restrict__ score_sum,
                                     int32_t* __restrict__ counts, float* __restrict__ share) {
  extern __shared__ float balance_smem[];
  const int tile_tokens = balance_tile_tokens(experts);
  float* tile = balance_smem;
  float* sums = balance_smem + tile_tokens * (experts + 1);
  auto* hist = reinterpret_cast<int32_t*>(sums + tile_tokens);
  const int64_t t0 = int64_t{blockIdx.x} * tile_tokens;
  const int nt = static_cast<int>(rows - t0 < tile_tokens ? rows - t0 : tile_tokens);
  const int64_t b0 = t0 / seq_len;
  const int64_t nb = (t0 + nt - 1) / seq_len - b0 + 1;
  const bool local = nb * experts <= kBalanceHist;
  if (local)
    for (int i = static_cast<int>(threadIdx.x); i < nb * experts; i += static_cast<int>(blockDim.x))
      hist[i] = 0;
  balance_stage_scores(logits, t0, nt, experts, tile);
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < nt) {
    const float* sig = tile + threadIdx.x * (experts + 1);
    float sum = 0.0f;
    for (int e = 0; e < experts; ++e) sum = rn::add(sum, sig[e]);
    score_sum[t0 + threadIdx.x] = sum;
    sums[threadIdx.x] = sum;
  }
  for (int i = static_cast<int>(threadIdx.x); i < nt * k; i += static_cast<int>(blockDim.x)) {
    const int e = idx[t0 * k + i];
    if (e < 0 || e >= experts) continue;
    const int64_t b = (t0 + i / k) / seq_len;
    if (local)
      atomicAdd(hist + (b - b0) * experts + e, 1);
    else
      atomicAdd(counts + b * experts + e, 1);
  }
  __syncthreads();
  if (share != nullptr) {
    for (int i = static_cast<int>(threadIdx.x); i < nt * experts;
         i += static_cast<int>(blockDim.x)) {
      const int tt = i / experts, e = i % experts;
      share[(t0 + tt) * experts + e] = rn::div(tile[tt * (experts + 1) + e], sums[tt]);
    }
  }
  if (local)
    for (int i = static_cast<int>(threadIdx.x); i < nb * experts; i += static_cast<int>(blockDim.x))
      if (hist[i] != 0) atomicAdd(counts + b0 * experts + i, hist[i]);
}

// Pass 2, one block per (sequence b, 32 experts): f_{b,e} * P_{b,e} in FP64, P summed as the CPU
// reference sums it (moe_router.h): warp w, lane e, adds chunk w's tokens in token order (16 loads
// in flight, then their adds), then lane e of warp 0 adds the chunks' sums in chunk order.
__global__ void __launch_bounds__(kBalanceThreads)
    balance_terms_kernel(const float* __restrict__ share, const int32_t* __restrict__ counts,
                         int experts, int k, int64_t seq_len, double* __restrict__ terms) {
  static_assert(kBalanceThreads / 32 == ::octet::kBalanceChunks, "a warp per chunk");
  __shared__ double part[::octet::kBalanceChunks][32];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t b = blockIdx.x;
  const int e = static_cast<int>(blockIdx.y) * 32 + lane;
  const int64_t chunk = (seq_len + ::octet::kBalanceChunks - 1) / ::octet::kBalanceChunks;
  const int64_t t1 = min(seq_len, (warp + 1) * chunk);
  double p = 0.0;
  if (e < experts) {
    const float* __restrict__ col = share + b * seq_len * experts + e;
    int64_t t = warp * chunk;
    for (; t + 16 <= t1; t += 16) {
      float v[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = col[(t + i) * experts];
#pragma unroll
      for (int i = 0; i < 16; ++i) p = rn::add(p, static_cast<double>(v[i]));
    }
    for (; t < t1; ++t) p = rn::add(p, static_cast<double>(col[t * experts]));
  }
  part[warp][lane] = p;
  __syncthreads();
  if (warp == 0 && e < experts) {
    double total = 0.0;  // chunks past the sequence's end add 0.0: the same bits
#pragma unroll
    for (int c = 0; c < ::octet::kBalanceChunks; ++c) total = rn::add(total, part[c][lane]);
    const int64_t i = b * experts + e;
    const double f = rn::div(rn::mul(static_cast<double>(experts), static_cast<double>(counts[i])),
                             rn::mul(static_cast<double>(k), static_cast<double>(seq_len)));
    terms[i] = rn::mul(f, rn::div(total, static_cast<double>(seq_len)));
  }
}

// Pass 3: the terms summed in (b, e) order, as the CPU does: the block stages chunks in shared
// memory and thread 0 adds them.
__global__ void balance_sum_kernel(const double* __restrict__ terms, int64_t n, double alpha,
                                   int64_t sequences, float* __restrict__ loss) {
  constexpr int kChunk = 2048;
  __shared__ double chunk[kChunk];
  double total = 0.0;
  for (int64_t base = 0; base < n; base += kChunk) {
    const int m = static_cast<int>(n - base < kChunk ? n - base : kChunk);
    for (int i = static_cast<int>(threadIdx.x); i < m; i += static_cast<int>(blockDim.x))
      chunk[i] = terms[base + i];
    __syncthreads();
    if (threadIdx.x == 0)
      for (int i = 0; i < m; ++i) total = rn::add(total, chunk[i]);
    __syncthreads();
  }
  if (threadIdx.x == 0)
    loss[0] = static_cast<float>(rn::div(rn::mul(total, alpha), static_cast<double>(sequences)));
}

// Backward coefficients c_{b,e} (one thread each).
__global__ void balance_coef_kernel(const int32_t* __restrict__ counts, int64_t n, double scale_num,
                                    double denom, float* __restrict__ coef) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n)
    coef[i] =
        static_cast<float>(rn::div(rn::mul(scale_num, static_cast<double>(counts[i])), denom));
}

// Backward, a tile of tokens per block: sigmoids staged, dot_t in expert order by one thread per
// token, then every element's gradient added by all threads.
__global__ void balance_backward_kernel(const float* __restrict__ logits,
                                        const float* __restrict__ score_sum,
                                        const float* __restrict__ coef, int64_t rows, int experts,
                                        int64_t seq_len, float* __restrict__ d_logits) {
  extern __shared__ float balance_smem[];
  const int tile_tokens = balance_tile_tokens(experts);
  float* tile = balance_smem;
  float* dots = balance_smem + tile_tokens * (experts + 1);
  const int64_t t0 = int64_t{blockIdx.x} * tile_tokens;
  const int nt = static_cast<int>(rows - t0 < tile_tokens ? rows - t0 : tile_tokens);
  balance_stage_scores(logits, t0, nt, experts, tile);
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < nt) {
    const int64_t t = t0 + threadIdx.x;
    const float* c = coef + (t / seq_len) * experts;
    const float* sig = tile + threadIdx.x * (experts + 1);
    const float S = score_sum[t];
    float dot = 0.0f;
    for (int e = 0; e < experts; ++e) dot = rn::add(dot, rn::mul(c[e], rn::div(sig[e], S)));
    dots[threadIdx.x] = dot;
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < nt * experts; i += static_cast<int>(blockDim.x)) {
    const int tt = i / experts, e = i % experts;
    const int64_t t = t0 + tt;
    const float s = tile[tt * (experts + 1) + e];
    const float ds = rn::div(rn::sub(coef[(t / seq_len) * experts + e], dots[tt]), score_sum[t]);
    float* d = d_logits + t * experts + e;
    *d = rn::add(*d, rn::mul(ds, rn::mul(s, rn::sub(1.0f, s))));
  }
}

}  // namespace octet::cuda::kernels
