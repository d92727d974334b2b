// Device code of the moe_router family. Scores, keys and weight formulas are the host/device
// functions of moe_router_math.h and numerics/fp32_rn.h that the CPU reference calls, in the same
// order, so the results are bit-identical to moe_router_cpu.cpp.
#pragma once

#include <cstdint>

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

// One warp per token. Lane l owns experts l, l + 32, ...; bit i of `removed` says expert l + 32 i
// is no longer a candidate. Shared memory per warp: the unbiased scores s and the candidate values
// (E each).
__global__ void router_forward_kernel(const float* __restrict__ logits,
                                      const float* __restrict__ bias, int64_t tokens,
                                      RouterParams p, int32_t* __restrict__ idx_out,
                                      float* __restrict__ w_out, int32_t* __restrict__ counts) {
  extern __shared__ float router_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int E = p.experts, G = E / p.n_group;
  float* s = router_smem + warp * 2 * E;
  float* cand = s + E;
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
      atomicAdd(counts + my_idx, 1);  // integer: order-independent
    }
    __syncwarp();  // the next token overwrites s and cand
  }
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

// Balance loss, pass 1, one thread per token: S_t (expert order) and the (sequence, expert) counts.
__global__ void balance_stats_kernel(const float* __restrict__ logits,
                                     const int32_t* __restrict__ idx, int64_t rows, int experts,
                                     int k, int64_t seq_len, float* __restrict__ score_sum,
                                     int32_t* __restrict__ counts) {
  const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (t >= rows) return;
  float sum = 0.0f;
  for (int e = 0; e < experts; ++e) sum = rn::add(sum, rn::sigmoid_rn(logits[t * experts + e]));
  score_sum[t] = sum;
  for (int j = 0; j < k; ++j) {
    const int e = idx[t * k + j];
    if (e >= 0 && e < experts) atomicAdd(counts + (t / seq_len) * experts + e, 1);
  }
}

// Pass 2a of the forward, one thread per (token, expert): the token's normalised score
// s_{t,e} / S_t in FP32, the operand pass 2b sums. Split from the sum so that the expensive,
// correctly rounded sigmoid and division run in parallel over every element instead of inside a
// sequential loop per (sequence, expert).
__global__ void balance_share_kernel(const float* __restrict__ logits,
                                     const float* __restrict__ score_sum, int64_t n, int experts,
                                     float* __restrict__ share) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n) share[i] = rn::div(rn::sigmoid_rn(logits[i]), score_sum[i / experts]);
}

// Pass 2b, one thread per (sequence b, expert e): f_{b,e} * P_{b,e} in FP64, P summed over the
// sequence's tokens in token order (the CPU reference's order, so the result is bitwise the same).
__global__ void balance_terms_kernel(const float* __restrict__ share,
                                     const int32_t* __restrict__ counts, int64_t sequences,
                                     int experts, int k, int64_t seq_len,
                                     double* __restrict__ terms) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i >= sequences * experts) return;
  const int64_t b = i / experts, e = i % experts;
  double p = 0.0;
  for (int64_t t = b * seq_len; t < (b + 1) * seq_len; ++t)
    p = rn::add(p, static_cast<double>(share[t * experts + e]));
  const double f = rn::div(rn::mul(static_cast<double>(experts), static_cast<double>(counts[i])),
                           rn::mul(static_cast<double>(k), static_cast<double>(seq_len)));
  terms[i] = rn::mul(f, rn::div(p, static_cast<double>(seq_len)));
}

// Pass 3: one thread sums the terms in (b, e) order, as the CPU does.
__global__ void balance_sum_kernel(const double* __restrict__ terms, int64_t n, double alpha,
                                   int64_t sequences, float* __restrict__ loss) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total = rn::add(total, terms[i]);
  loss[0] = static_cast<float>(rn::div(rn::mul(total, alpha), static_cast<double>(sequences)));
}

// Backward coefficients c_{b,e} (one thread each), then one thread per token adds its gradient row.
__global__ void balance_coef_kernel(const int32_t* __restrict__ counts, int64_t n, double scale_num,
                                    double denom, float* __restrict__ coef) {
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < n)
    coef[i] =
        static_cast<float>(rn::div(rn::mul(scale_num, static_cast<double>(counts[i])), denom));
}

__global__ void balance_backward_kernel(const float* __restrict__ logits,
                                        const float* __restrict__ score_sum,
                                        const float* __restrict__ coef, int64_t rows, int experts,
                                        int64_t seq_len, float* __restrict__ d_logits) {
  const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (t >= rows) return;
  const float* c = coef + (t / seq_len) * experts;
  const float* row = logits + t * experts;
  const float S = score_sum[t];
  float dot = 0.0f;
  for (int e = 0; e < experts; ++e)
    dot = rn::add(dot, rn::mul(c[e], rn::div(rn::sigmoid_rn(row[e]), S)));
  for (int e = 0; e < experts; ++e) {
    const float s = rn::sigmoid_rn(row[e]);
    const float ds = rn::div(rn::sub(c[e], dot), S);
    float* d = d_logits + t * experts + e;
    *d = rn::add(*d, rn::mul(ds, rn::mul(s, rn::sub(1.0f, s))));
  }
}

}  // namespace octet::cuda::kernels
