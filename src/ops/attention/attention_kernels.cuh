// Device code of the attention family: flash-attention style tiled kernels (FlashAttention-2, Dao
// 2023) on BF16 tensor cores, mma.sync m16n8k16 with FP32 accumulation, for sm_80 and later (run on
// sm_90a).
//
// Layout: q, k (B, T, H, Dqk) and v, o, dO (B, T, H, Dv) bf16 row-major; one CTA owns one (b, h)
// and one tile of rows; row t of head (b, h) starts at ((b*T + t)*H + h) * D. Tiles are staged in
// shared memory with cp.async (zero-filled past T), rows padded by 8 elements (16 bytes) so that
// the stride is an odd multiple of 16 bytes and the eight 16-byte rows of every ldmatrix hit
// distinct banks.
//
// Warp tiling: 4 warps, each owns 16 rows of the CTA's 64-row tile and the whole width of the other
// operand, so a row's softmax statistics live in one quad of lanes (mma C layout: lane = 4*g + t
// holds rows g and g+8, columns 2t and 2t+1 of each 8-wide n-tile) and need only two shuffles.
//
// Scores are kept in the log2 domain, x = s * log2(e), so exp becomes exp2 (one MUFU op).
// Head dims are runtime values (multiples of 16, <= 256); register arrays are sized by the
// compile-time bucket kD*Max and the loops over 16-wide column blocks skip the unused tail.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace octet::cuda::kernels {

inline constexpr int kAttnWarps = 4;
inline constexpr int kAttnThreads = kAttnWarps * 32;
inline constexpr int kAttnRows =
    16 * kAttnWarps;                // rows of the CTA's own tile (queries, or keys in dK/dV)
inline constexpr int kSmemPad = 8;  // elements added to every smem row (16 bytes)
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// ---------------------------------------------------------------------------------------------------
// PTX wrappers.

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronous; zero-fills the destination when !valid (src not read).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m, register m receives it.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a (16x16, row) * b (16x8, col), BF16 in, FP32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---------------------------------------------------------------------------------------------------
// Fragment loads. `base` is a tile in shared memory with row stride `ld` elements.

// A operand (16 rows x 16 k) of rows [row0, row0+16), columns [k0, k0+16), stored row-major.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const uint16_t* base, int ld, int row0,
                                       int k0, int lane) {
  ldsm_x4(a, base + (row0 + (lane & 15)) * ld + k0 + ((lane >> 4) << 3));
}

// B operands of two n-tiles (n0..n0+7, n0+8..n0+15) x 16 k when B^T is stored row-major as [n][k]
// (e.g. K for S = Q K^T): b[0], b[1] for n-tile n0, b[2], b[3] for n-tile n0 + 8.
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const uint16_t* base, int ld, int n0,
                                          int k0, int lane) {
  ldsm_x4(b, base + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + (((lane >> 3) & 1) << 3));
}

// The same two n-tiles when B is stored row-major as [k][n] (e.g. V for O = P V): transposing load.
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const uint16_t* base, int ld, int k0,
                                          int n0, int lane) {
  ldsm_x4_trans(b,
                base + (k0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * ld + n0 + ((lane >> 4) << 3));
}

// A operand from two adjacent FP32 accumulator n-tiles (16 x 16), rounded to BF16.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                         const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// Copies rows [t0, t0 + rows) of one head (row stride `gstride` elements, `d` columns) into smem
// with row stride d + kSmemPad; rows at or past T are zero-filled.
__device__ __forceinline__ void load_tile_async(uint16_t* dst, const uint16_t* src, int64_t gstride,
                                                int64_t t0, int rows, int d, int64_t T) {
  const int chunks_per_row = d / 8;
  const int total = rows * chunks_per_row;
  for (int c = threadIdx.x; c < total; c += kAttnThreads) {
    const int r = c / chunks_per_row, col = (c - r * chunks_per_row) * 8;
    const bool valid = t0 + r < T;
    const uint16_t* g = valid ? src + (t0 + r) * gstride + col : src;
    cp_async_16(dst + r * (d + kSmemPad) + col, g, valid);
  }
}

// ---------------------------------------------------------------------------------------------------

struct AttentionParams {
  const uint16_t* q;   // (B, T, H, Dqk)
  const uint16_t* k;   // (B, T, H, Dqk)
  const uint16_t* v;   // (B, T, H, Dv)
  const uint16_t* o;   // (B, T, H, Dv) forward output (backward)
  const uint16_t* dO;  // (B, T, H, Dv) (backward)
  uint16_t* out_o;     // forward: o
  float* lse;          // (B, H, T) forward: written; backward: read
  const float* delta;  // (B, H, T) backward: D_i = dO_i . o_i
  uint16_t* dq;        // (B, T, H, Dqk)
  uint16_t* dk;        // (B, T, H, Dqk)
  uint16_t* dv;        // (B, T, H, Dv)
  int64_t T;
  int H;
  int dqk, dv_dim;
  float scale;       // softmax scale
  float scale_log2;  // softmax scale * log2(e)
};

struct HeadOffsets {
  int64_t qk, v, stat;  // element offsets of row 0 of head (b, h) in q/k, in v/o, and in (B, H, T)
};
__device__ __forceinline__ HeadOffsets head_offsets(const AttentionParams& p, int bh) {
  const int64_t b = bh / p.H, h = bh % p.H;
  return {(b * p.T * p.H + h) * p.dqk, (b * p.T * p.H + h) * p.dv_dim, int64_t{bh} * p.T};
}

// ---------------------------------------------------------------------------------------------------
// Forward. Grid (B*H, ceil(T / 64)); CTA = 64 queries, loops over key blocks of kBlockN up to the
// diagonal with K/V double-buffered; online softmax (running max m and sum l per row, O rescaled
// when the max grows). Heaviest query tiles (last rows) are scheduled first.
template <int kBlockN, int kDvMax>
__global__ void __launch_bounds__(kAttnThreads) attention_forward_kernel(const AttentionParams p) {
  static_assert(kBlockN % 16 == 0 && kDvMax % 16 == 0 && kDvMax <= 256, "tile invariants");
  extern __shared__ __align__(16) uint16_t smem[];
  const int dqk = p.dqk, dv = p.dv_dim, sq = dqk + kSmemPad, sv = dv + kSmemPad;
  uint16_t* q_s = smem;
  uint16_t* k_s = q_s + kAttnRows * sq;
  uint16_t* v_s = k_s + 2 * kBlockN * sq;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
  const int64_t q0 = int64_t{gridDim.y - 1 - blockIdx.y} * kAttnRows;
  const HeadOffsets off = head_offsets(p, blockIdx.x);
  const int64_t gs_qk = int64_t{p.H} * dqk, gs_v = int64_t{p.H} * dv;
  const uint16_t* kg = p.k + off.qk;
  const uint16_t* vg = p.v + off.v;

  load_tile_async(q_s, p.q + off.qk, gs_qk, q0, kAttnRows, dqk, p.T);
  load_tile_async(k_s, kg, gs_qk, 0, kBlockN, dqk, p.T);
  load_tile_async(v_s, vg, gs_v, 0, kBlockN, dv, p.T);
  cp_async_commit();

  const int64_t row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  const int64_t last_row = min(q0 + kAttnRows, p.T) - 1;
  const int n_blocks = static_cast<int>(last_row / kBlockN) + 1;
  float acc[kDvMax / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int j = 0; j < n_blocks; ++j) {
    const int buf = j & 1;
    if (j + 1 < n_blocks) {
      load_tile_async(k_s + (buf ^ 1) * kBlockN * sq, kg, gs_qk, int64_t{j + 1} * kBlockN, kBlockN,
                      dqk, p.T);
      load_tile_async(v_s + (buf ^ 1) * kBlockN * sv, vg, gs_v, int64_t{j + 1} * kBlockN, kBlockN,
                      dv, p.T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* kb = k_s + buf * kBlockN * sq;
    const uint16_t* vb = v_s + buf * kBlockN * sv;

    // S = Q K^T for this warp's 16 rows x kBlockN keys.
    float s[kBlockN / 8][4] = {};
    for (int kk = 0; kk < dqk; kk += 16) {
      uint32_t a[4];
      load_a(a, q_s, sq, warp * 16, kk, lane);
#pragma unroll
      for (int nn = 0; nn < kBlockN / 16; ++nn) {
        uint32_t b[4];
        load_b_nk(b, kb, sq, nn * 16, kk, lane);
        mma_bf16(s[2 * nn], a, b[0], b[1]);
        mma_bf16(s[2 * nn + 1], a, b[2], b[3]);
      }
    }

    // Scale, causal mask (only blocks that reach past the tile's first query need it), online
    // softmax.
    const int64_t k0 = int64_t{j} * kBlockN;
    const bool diagonal = k0 + kBlockN - 1 > q0;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * p.scale_log2;
        if (diagonal && k0 + nt * 8 + 2 * tq + (e & 1) > row[e >> 1]) x = -INFINITY;
        s[nt][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 2));
      // Key 0 is visible to every row and sits in block 0, so m is finite from the first block on.
      const float m_new = fmaxf(m[r], mx[r]);
      alpha[r] = exp2f(m[r] - m_new);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pe = exp2f(s[nt][e] - m[e >> 1]);
        s[nt][e] = pe;
        l[e >> 1] += pe;  // this lane's partial row sum; the quad reduces once at the end
      }
#pragma unroll
    for (int nt = 0; nt < kDvMax / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] *= alpha[e >> 1];

        // O += P V.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[4];
      acc_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dn = 0; dn < kDvMax / 16; ++dn) {
        if (dn * 16 >= dv) break;
        uint32_t b[4];
        load_b_kn(b, vb, sv, kk * 16, dn * 16, lane);
        mma_bf16(acc[2 * dn], a, b[0], b[1]);
        mma_bf16(acc[2 * dn + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // the next iteration's prefetch overwrites this buffer
  }

  // Normalise, store o (bf16) and lse = (m + log2 l) * ln 2.
  uint16_t* og = p.out_o + off.v;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 1);
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 2);
  }
  const float inv_l[2] = {1.0f / l[0], 1.0f / l[1]};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= p.T) continue;
    uint16_t* orow = og + row[r] * gs_v;
#pragma unroll
    for (int nt = 0; nt < kDvMax / 8; ++nt) {
      if (nt * 8 >= dv) break;
      *reinterpret_cast<uint32_t*>(orow + nt * 8 + 2 * tq) =
          pack_bf16(acc[nt][2 * r] * inv_l[r], acc[nt][2 * r + 1] * inv_l[r]);
    }
    if (tq == 0) p.lse[off.stat + row[r]] = (m[r] + log2f(l[r])) * kLn2;
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward preprocessing: D_i = dO_i . o_i per (b, h, i). Grid (B*H, ceil(T / 64)), 8 warps, each
// warp one row at a time with a fixed summation order (lane-strided FMAs, then a butterfly).
inline constexpr int kDeltaRows = 64;
__global__ void __launch_bounds__(256)
    attention_delta_kernel(const AttentionParams p, float* delta) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const HeadOffsets off = head_offsets(p, blockIdx.x);
  for (int r = warp; r < kDeltaRows; r += 8) {
    const int64_t i = int64_t{blockIdx.y} * kDeltaRows + r;
    if (i >= p.T) break;
    const uint16_t* orow = p.o + off.v + i * p.H * p.dv_dim;
    const uint16_t* drow = p.dO + off.v + i * p.H * p.dv_dim;
    float sum = 0.0f;
    for (int d = 2 * lane; d < p.dv_dim; d += 64) {
      const uint32_t ov = *reinterpret_cast<const uint32_t*>(orow + d);
      const uint32_t dw = *reinterpret_cast<const uint32_t*>(drow + d);
      sum = fmaf(__uint_as_float(ov << 16), __uint_as_float(dw << 16), sum);
      sum = fmaf(__uint_as_float(ov & 0xFFFF0000u), __uint_as_float(dw & 0xFFFF0000u), sum);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
    if (lane == 0) delta[off.stat + i] = sum;
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward, dK and dV. Grid (B*H, ceil(T / 64)); CTA = 64 keys (16 per warp), loops over query
// blocks of kBlockM from the diagonal to T with Q, dO, lse and D double-buffered. Each warp works
// on the transposed scores S^T (16 keys x kBlockM queries), so P^T and dS^T come out of the
// accumulators in the A-operand layout of dV += P^T dO and dK += dS^T Q. kDk / kDv select the
// gradients accumulated: both in one pass when their registers fit, else one pass each (the scores
// are then recomputed).
template <int kBlockM, int kDqkMax, int kDvMax, bool kDk, bool kDv>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dkdv_kernel(const AttentionParams p) {
  static_assert(kBlockM % 16 == 0 && kDqkMax <= 256 && kDvMax <= 256 && (kDk || kDv),
                "tile invariants");
  extern __shared__ __align__(16) uint16_t smem[];
  const int dqk = p.dqk, dv = p.dv_dim, sq = dqk + kSmemPad, sv = dv + kSmemPad;
  uint16_t* k_s = smem;
  uint16_t* v_s = k_s + kAttnRows * sq;
  uint16_t* q_s = v_s + (kDk ? kAttnRows * sv : 0);
  uint16_t* do_s = q_s + 2 * kBlockM * sq;
  float* lse_s = reinterpret_cast<float*>(do_s + 2 * kBlockM * sv);
  float* d_s = lse_s + 2 * kBlockM;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
  const int64_t k0 = int64_t{blockIdx.y} * kAttnRows;  // low key tiles see the most queries: first
  const HeadOffsets off = head_offsets(p, blockIdx.x);
  const int64_t gs_qk = int64_t{p.H} * dqk, gs_v = int64_t{p.H} * dv;
  const uint16_t* qg = p.q + off.qk;
  const uint16_t* dog = p.dO + off.v;

  const int i_first = static_cast<int>(k0 / kBlockM);
  const int i_end = static_cast<int>((p.T + kBlockM - 1) / kBlockM);
  auto load_query_block = [&](int i, int buf) {
    const int64_t t0 = int64_t{i} * kBlockM;
    load_tile_async(q_s + buf * kBlockM * sq, qg, gs_qk, t0, kBlockM, dqk, p.T);
    load_tile_async(do_s + buf * kBlockM * sv, dog, gs_v, t0, kBlockM, dv, p.T);
    for (int r = threadIdx.x; r < kBlockM; r += kAttnThreads) {
      const bool valid = t0 + r < p.T;
      // Queries past T get P = exp2(x - inf) = 0 and D = 0, so they add nothing.
      lse_s[buf * kBlockM + r] = valid ? p.lse[off.stat + t0 + r] * kLog2e : INFINITY;
      d_s[buf * kBlockM + r] = valid ? p.delta[off.stat + t0 + r] : 0.0f;
    }
  };

  load_tile_async(k_s, p.k + off.qk, gs_qk, k0, kAttnRows, dqk, p.T);
  if (kDk) load_tile_async(v_s, p.v + off.v, gs_v, k0, kAttnRows, dv, p.T);
  load_query_block(i_first, 0);
  cp_async_commit();

  const int64_t key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
  float dk_acc[kDk ? kDqkMax / 8 : 1][4] = {};
  float dv_acc[kDv ? kDvMax / 8 : 1][4] = {};

  for (int i = i_first; i < i_end; ++i) {
    const int buf = (i - i_first) & 1;
    if (i + 1 < i_end) {
      load_query_block(i + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* qb = q_s + buf * kBlockM * sq;
    const uint16_t* dob = do_s + buf * kBlockM * sv;
    const float* lse_b = lse_s + buf * kBlockM;
    const float* d_b = d_s + buf * kBlockM;
    const int64_t q0 = int64_t{i} * kBlockM;

    // S^T = K Q^T (16 keys x kBlockM queries), then P^T = exp2(x - lse2) with the causal mask.
    float st[kBlockM / 8][4] = {};
    for (int kk = 0; kk < dqk; kk += 16) {
      uint32_t a[4];
      load_a(a, k_s, sq, warp * 16, kk, lane);
#pragma unroll
      for (int nn = 0; nn < kBlockM / 16; ++nn) {
        uint32_t b[4];
        load_b_nk(b, qb, sq, nn * 16, kk, lane);
        mma_bf16(st[2 * nn], a, b[0], b[1]);
        mma_bf16(st[2 * nn + 1], a, b[2], b[3]);
      }
    }
    const bool diagonal = q0 < k0 + kAttnRows - 1;
#pragma unroll
    for (int nt = 0; nt < kBlockM / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nt * 8 + 2 * tq + (e & 1);
        const float pe = exp2f(st[nt][e] * p.scale_log2 - lse_b[c]);
        st[nt][e] = (diagonal && key[e >> 1] > q0 + c) ? 0.0f : pe;
      }

    if constexpr (kDv) {  // dV += P^T dO
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        uint32_t a[4];
        acc_to_a(a, st[2 * kk], st[2 * kk + 1]);
#pragma unroll
        for (int dn = 0; dn < kDvMax / 16; ++dn) {
          if (dn * 16 >= dv) break;
          uint32_t b[4];
          load_b_kn(b, dob, sv, kk * 16, dn * 16, lane);
          mma_bf16(dv_acc[2 * dn], a, b[0], b[1]);
          mma_bf16(dv_acc[2 * dn + 1], a, b[2], b[3]);
        }
      }
    }
    if constexpr (kDk) {
      // dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q.
      float dpt[kBlockM / 8][4] = {};
      for (int kk = 0; kk < dv; kk += 16) {
        uint32_t a[4];
        load_a(a, v_s, sv, warp * 16, kk, lane);
#pragma unroll
        for (int nn = 0; nn < kBlockM / 16; ++nn) {
          uint32_t b[4];
          load_b_nk(b, dob, sv, nn * 16, kk, lane);
          mma_bf16(dpt[2 * nn], a, b[0], b[1]);
          mma_bf16(dpt[2 * nn + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kBlockM / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dpt[nt][e] = st[nt][e] * (dpt[nt][e] - d_b[nt * 8 + 2 * tq + (e & 1)]);
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        uint32_t a[4];
        acc_to_a(a, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
        for (int dn = 0; dn < kDqkMax / 16; ++dn) {
          if (dn * 16 >= dqk) break;
          uint32_t b[4];
          load_b_kn(b, qb, sq, kk * 16, dn * 16, lane);
          mma_bf16(dk_acc[2 * dn], a, b[0], b[1]);
          mma_bf16(dk_acc[2 * dn + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= p.T) continue;
    if constexpr (kDk) {
      uint16_t* row = p.dk + off.qk + key[r] * gs_qk;
#pragma unroll
      for (int nt = 0; nt < kDqkMax / 8; ++nt) {
        if (nt * 8 >= dqk) break;
        *reinterpret_cast<uint32_t*>(row + nt * 8 + 2 * tq) =
            pack_bf16(dk_acc[nt][2 * r] * p.scale, dk_acc[nt][2 * r + 1] * p.scale);
      }
    }
    if constexpr (kDv) {
      uint16_t* row = p.dv + off.v + key[r] * gs_v;
#pragma unroll
      for (int nt = 0; nt < kDvMax / 8; ++nt) {
        if (nt * 8 >= dv) break;
        *reinterpret_cast<uint32_t*>(row + nt * 8 + 2 * tq) =
            pack_bf16(dv_acc[nt][2 * r], dv_acc[nt][2 * r + 1]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Backward, dQ: its own pass over key blocks (instead of atomics into dQ from the dK/dV kernel), so
// every dq element is summed in one fixed order. Grid (B*H, ceil(T / 64)); CTA = 64 queries; K and
// V double-buffered; S and dP are recomputed.
template <int kBlockN, int kDqkMax>
__global__ void __launch_bounds__(kAttnThreads)
    attention_backward_dq_kernel(const AttentionParams p) {
  static_assert(kBlockN % 16 == 0 && kDqkMax <= 256, "tile invariants");
  extern __shared__ __align__(16) uint16_t smem[];
  const int dqk = p.dqk, dv = p.dv_dim, sq = dqk + kSmemPad, sv = dv + kSmemPad;
  uint16_t* q_s = smem;
  uint16_t* do_s = q_s + kAttnRows * sq;
  uint16_t* k_s = do_s + kAttnRows * sv;
  uint16_t* v_s = k_s + 2 * kBlockN * sq;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
  const int64_t q0 = int64_t{gridDim.y - 1 - blockIdx.y} * kAttnRows;
  const HeadOffsets off = head_offsets(p, blockIdx.x);
  const int64_t gs_qk = int64_t{p.H} * dqk, gs_v = int64_t{p.H} * dv;
  const uint16_t* kg = p.k + off.qk;
  const uint16_t* vg = p.v + off.v;

  load_tile_async(q_s, p.q + off.qk, gs_qk, q0, kAttnRows, dqk, p.T);
  load_tile_async(do_s, p.dO + off.v, gs_v, q0, kAttnRows, dv, p.T);
  load_tile_async(k_s, kg, gs_qk, 0, kBlockN, dqk, p.T);
  load_tile_async(v_s, vg, gs_v, 0, kBlockN, dv, p.T);
  cp_async_commit();

  const int64_t row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = row[r] < p.T;
    lse2[r] = valid ? p.lse[off.stat + row[r]] * kLog2e : INFINITY;
    delta[r] = valid ? p.delta[off.stat + row[r]] : 0.0f;
  }
  const int64_t last_row = min(q0 + kAttnRows, p.T) - 1;
  const int n_blocks = static_cast<int>(last_row / kBlockN) + 1;
  float acc[kDqkMax / 8][4] = {};

  for (int j = 0; j < n_blocks; ++j) {
    const int buf = j & 1;
    if (j + 1 < n_blocks) {
      load_tile_async(k_s + (buf ^ 1) * kBlockN * sq, kg, gs_qk, int64_t{j + 1} * kBlockN, kBlockN,
                      dqk, p.T);
      load_tile_async(v_s + (buf ^ 1) * kBlockN * sv, vg, gs_v, int64_t{j + 1} * kBlockN, kBlockN,
                      dv, p.T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* kb = k_s + buf * kBlockN * sq;
    const uint16_t* vb = v_s + buf * kBlockN * sv;

    float s[kBlockN / 8][4] = {};
    for (int kk = 0; kk < dqk; kk += 16) {
      uint32_t a[4];
      load_a(a, q_s, sq, warp * 16, kk, lane);
#pragma unroll
      for (int nn = 0; nn < kBlockN / 16; ++nn) {
        uint32_t b[4];
        load_b_nk(b, kb, sq, nn * 16, kk, lane);
        mma_bf16(s[2 * nn], a, b[0], b[1]);
        mma_bf16(s[2 * nn + 1], a, b[2], b[3]);
      }
    }
    float dp[kBlockN / 8][4] = {};
    for (int kk = 0; kk < dv; kk += 16) {
      uint32_t a[4];
      load_a(a, do_s, sv, warp * 16, kk, lane);
#pragma unroll
      for (int nn = 0; nn < kBlockN / 16; ++nn) {
        uint32_t b[4];
        load_b_nk(b, vb, sv, nn * 16, kk, lane);
        mma_bf16(dp[2 * nn], a, b[0], b[1]);
        mma_bf16(dp[2 * nn + 1], a, b[2], b[3]);
      }
    }
    const int64_t k0 = int64_t{j} * kBlockN;
    const bool diagonal = k0 + kBlockN - 1 > q0;
#pragma unroll
    for (int nt = 0; nt < kBlockN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const float pe = exp2f(s[nt][e] * p.scale_log2 - lse2[r]);
        const bool masked = diagonal && k0 + nt * 8 + 2 * tq + (e & 1) > row[r];
        s[nt][e] = masked ? 0.0f : pe * (dp[nt][e] - delta[r]);  // dS
      }
      // dQ += dS K.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[4];
      acc_to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int dn = 0; dn < kDqkMax / 16; ++dn) {
        if (dn * 16 >= dqk) break;
        uint32_t b[4];
        load_b_kn(b, kb, sq, kk * 16, dn * 16, lane);
        mma_bf16(acc[2 * dn], a, b[0], b[1]);
        mma_bf16(acc[2 * dn + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= p.T) continue;
    uint16_t* qrow = p.dq + off.qk + row[r] * gs_qk;
#pragma unroll
    for (int nt = 0; nt < kDqkMax / 8; ++nt) {
      if (nt * 8 >= dqk) break;
      *reinterpret_cast<uint32_t*>(qrow + nt * 8 + 2 * tq) =
          pack_bf16(acc[nt][2 * r] * p.scale, acc[nt][2 * r + 1] * p.scale);
    }
  }
}

}  // namespace octet::cuda::kernels
