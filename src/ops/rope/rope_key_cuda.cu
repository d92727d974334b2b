// CUDA side of rope_key.h. Two forward kernels, the same bits (the CPU reference's):
//   block (the default where the shapes allow it): a block takes a few consecutive tokens, rotates
//     their rope parts once into shared memory (rope_math.h) and writes their k rows, one
//     contiguous run, in 16-byte chunks: a nope chunk loaded from kv with one 16-byte load, a rope
//     chunk taken from shared memory (below, rope_key_block_kernel).
//   per-chunk (RopeKeyKernel::kPerChunk, and odd shapes): one thread per 8 consecutive columns of
//     k's row (b, t, h): nope columns copied from kv (16-byte loads when the chunk lies inside them
//     and kv's rows are aligned), rope columns rotated from the shared key's row (b, t) by
//     rope_math.h, so every head recomputes the same bits the separate rope_forward gave; BF16
//     chunks stored with one 16-byte store.
// Backward (rope part): one thread per (token, pair j): the FP32 sums over heads of the two
// channels j and j + d/2 in increasing h (as layout_cuda.cu's kSum), each rounded once to the dtype,
// then rope_math.h's inverse rotation of the pair. Bitwise the CPU reference.
#include <algorithm>

#include "backend/cuda_check.h"
#include "numerics/fp8.h"
#include "ops/rope/rope_backends.h"
#include "ops/rope/rope_math.h"

namespace octet::cuda {
namespace {

constexpr int kThreads = 256;

struct KeyParams {
  int64_t rows, seq, heads, nope, kv_width, kr_width, kr_col;
  int rope_dim;
  bool interleave;
  bool vec_load, vec_store;  // BF16 only: 16-byte loads from kv / stores to k
  const float* cos;
  const float* sin;
};

// One value of type T holding v rounded to T, and that value back as FP32.
template <typename T>
__device__ __forceinline__ T to_t(float v) {
  T t;
  store_float(&t, 0, v);
  return t;
}
template <typename T>
__device__ __forceinline__ float round_trip(float v) {
  const T t = to_t<T>(v);
  return load_float(&t, 0);
}

// Column col of k's row r (token tok at position t): kv's column, or the rotated shared key's.
template <typename T>
__device__ __forceinline__ T key_element(const T* __restrict__ kv, const T* __restrict__ kr,
                                         const KeyParams& p, int64_t r, int64_t tok, int64_t t,
                                         int64_t col) {
  if (col < p.nope) return kv[r * p.kv_width + col];
  const int half = p.rope_dim / 2, i = static_cast<int>(col - p.nope);
  const rope_math::RopePick pk = rope_math::rope_pick(i, half, p.interleave, true);
  const float c = p.cos[t * half + pk.j], s = p.sin[t * half + pk.j];
  const T* x = kr + tok * p.kr_width + p.kr_col;
  const float a = load_float(x, pk.p), b = load_float(x, pk.q);
  return to_t<T>(pk.first ? rope_math::rotate_first(a, b, c, s)
                          : rope_math::rotate_second(a, b, c, s));
}

template <typename T>
__global__ void rope_key_forward_kernel(const T* __restrict__ kv, const T* __restrict__ kr,
                                        T* __restrict__ k, const KeyParams p) {
  const int64_t dqk = p.nope + p.rope_dim, chunks = (dqk + 7) / 8, n = p.rows * chunks;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = idx / chunks, c0 = (idx % chunks) * 8;
    const int64_t tok = r / p.heads, t = tok % p.seq;
    T* y = k + r * dqk + c0;
    if constexpr (sizeof(T) == 2) {
      if (p.vec_store) {  // dqk % 8 == 0: a full chunk
        uint4 out;
        if (p.vec_load && c0 + 8 <= p.nope) {
          out = *reinterpret_cast<const uint4*>(kv + r * p.kv_width + c0);
        } else {
          auto* o = reinterpret_cast<T*>(&out);
          for (int e = 0; e < 8; ++e) o[e] = key_element(kv, kr, p, r, tok, t, c0 + e);
        }
        *reinterpret_cast<uint4*>(y) = out;
        continue;
      }
    }
    for (int e = 0; e < 8 && c0 + e < dqk; ++e) y[e] = key_element(kv, kr, p, r, tok, t, c0 + e);
  }
}

// The block kernel: nope, d and kv's width multiples of a 16-byte chunk (V = 8 BF16 or 4 FP32
// values), kv and k 16-byte aligned, k under 2^31 chunks. Block b takes tokens [b tpb, b tpb +
// tpb), whose k rows are one contiguous run of chunks (token, head, chunk); thread i takes the
// chunks i + u kThreads (u < kUnroll) of the run at a time. It first issues the 16-byte loads of
// its nope chunks, then the block rotates its tokens' rope parts into shared memory (the rotation
// of key_element, once per token instead of once per head), then the thread takes its rope chunks
// from there and stores all its chunks: its loads are in flight while the rope part is computed.
// Index arithmetic in 32 bits with divisors fixed at launch (rope_math::FastDiv).
constexpr int kUnroll = 4;

struct BlockParams {
  const float* cos;
  const float* sin;
  int64_t kv_width, kr_width, kr_col;                            // in elements
  uint32_t tokens, heads, seq, tpb, cpr, nope_chunks, rope_dim;  // cpr: chunks per k row
  rope_math::FastDiv by_cpr, by_heads, by_seq, by_rope;
  bool interleave;
};

template <typename T>
__global__ void __launch_bounds__(kThreads)
    rope_key_block_kernel(const T* __restrict__ kv, const T* __restrict__ kr, T* __restrict__ k,
                          const BlockParams p) {
  constexpr uint32_t kV = 16 / sizeof(T);
  extern __shared__ uint4 staged[];  // (tpb, d) rotated rope values of type T
  T* rope_rows = reinterpret_cast<T*>(staged);
  const uint32_t tok0 = blockIdx.x * p.tpb;
  const uint32_t ntok = min(p.tpb, p.tokens - tok0);
  const uint32_t items = ntok * p.heads * p.cpr;
  const int64_t row0 = int64_t{tok0} * p.heads;
  uint4* out = reinterpret_cast<uint4*>(k) + row0 * p.cpr;
  const uint32_t rope_chunks = p.rope_dim / kV, half = p.rope_dim / 2;
  for (uint32_t base = 0; base < items; base += kThreads * kUnroll) {
    uint4 v[kUnroll];
    uint32_t row[kUnroll], col[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t e = base + u * kThreads + threadIdx.x;
      row[u] = p.by_cpr.div(e);
      col[u] = e - row[u] * p.cpr;
      if (e < items && col[u] < p.nope_chunks)
        v[u] = *reinterpret_cast<const uint4*>(kv + (row0 + row[u]) * p.kv_width + col[u] * kV);
    }
    if (base == 0) {  // block-uniform
      for (uint32_t i = threadIdx.x; i < ntok * p.rope_dim; i += kThreads) {
        const uint32_t tl = p.by_rope.div(i), c = i - tl * p.rope_dim;
        const uint32_t tok = tok0 + tl, t = tok - p.by_seq.div(tok) * p.seq;
        const rope_math::RopePick pk =
            rope_math::rope_pick(static_cast<int>(c), static_cast<int>(half), p.interleave, true);
        const float cs = p.cos[int64_t{t} * half + pk.j], sn = p.sin[int64_t{t} * half + pk.j];
        const T* x = kr + int64_t{tok} * p.kr_width + p.kr_col;
        const float a = load_float(x, pk.p), b = load_float(x, pk.q);
        rope_rows[i] = to_t<T>(pk.first ? rope_math::rotate_first(a, b, cs, sn)
                                        : rope_math::rotate_second(a, b, cs, sn));
      }
      __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t e = base + u * kThreads + threadIdx.x;
      if (e >= items) break;
      if (col[u] >= p.nope_chunks)
        v[u] = staged[p.by_heads.div(row[u]) * rope_chunks + col[u] - p.nope_chunks];
      out[e] = v[u];
    }
  }
}

template <typename T>
__global__ void rope_key_backward_kernel(const T* __restrict__ dk, T* __restrict__ dkr,
                                         const KeyParams p) {
  const int half = p.rope_dim / 2;
  const int64_t tokens = p.rows / p.heads, n = tokens * half, dqk = p.nope + p.rope_dim;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t tok = idx / half, t = tok % p.seq;
    const int j = static_cast<int>(idx % half);
    const T* g = dk + tok * p.heads * dqk + p.nope;
    float a = 0.0f, b = 0.0f;
    for (int64_t h = 0; h < p.heads; ++h) {
      a = __fadd_rn(a, load_float(g + h * dqk, j));
      b = __fadd_rn(b, load_float(g + h * dqk, j + half));
    }
    a = round_trip<T>(a);
    b = round_trip<T>(b);
    const float c = p.cos[t * half + j], s = -p.sin[t * half + j];
    T* y = dkr + tok * p.kr_width + p.kr_col;
    const int first = p.interleave ? 2 * j : j, second = p.interleave ? 2 * j + 1 : j + half;
    store_float(y, first, rope_math::rotate_first(a, b, c, s));
    store_float(y, second, rope_math::rotate_second(a, b, c, s));
  }
}

KeyParams params(const RopeKeyGeometry& g, int64_t kr_col, const RopeTable& tb,
                 RopePairing pairing) {
  KeyParams p;
  p.rows = g.batch * g.seq * g.heads;
  p.seq = g.seq;
  p.heads = g.heads;
  p.nope = g.nope;
  p.kv_width = g.kv_width;
  p.kr_width = g.kr_width;
  p.kr_col = kr_col;
  p.rope_dim = static_cast<int>(g.rope);
  p.interleave = pairing == RopePairing::kInterleave;
  p.vec_load = p.vec_store = false;
  p.cos = tb.cos.data_as<const float>();
  p.sin = tb.sin.data_as<const float>();
  return p;
}

unsigned blocks_for(Context& ctx, int64_t items) {
  int sms = 0;
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device_index));
  // Grid-stride: enough blocks to fill every SM several times over, never more than the work.
  return static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>((items + kThreads - 1) / kThreads, int64_t{sms} * 16)));
}

bool aligned16(const void* q) {
  return reinterpret_cast<uintptr_t>(q) % 16 == 0;
}

// The block kernel's launch, or false where the shapes do not allow it.
template <typename T>
bool launch_block_kernel(Context& ctx, const RopeKeyArgs& a, const RopeKeyGeometry& g, Tensor& k) {
  constexpr int64_t kV = 16 / sizeof(T);
  const int64_t dqk = g.nope + g.rope, rows = g.batch * g.seq * g.heads, cpr = dqk / kV;
  if (g.rope == 0 || g.nope % kV != 0 || g.rope % kV != 0 || g.kv_width % kV != 0 ||
      g.rope * static_cast<int64_t>(sizeof(T)) > 16384 || !aligned16(a.kv.data()) ||
      !aligned16(k.data()) || rows * cpr >= (int64_t{1} << 31))
    return false;
  BlockParams p;
  p.cos = a.table.cos.data_as<const float>();
  p.sin = a.table.sin.data_as<const float>();
  p.kv_width = g.kv_width;
  p.kr_width = g.kr_width;
  p.kr_col = a.kr_col;
  p.tokens = static_cast<uint32_t>(g.batch * g.seq);
  p.heads = static_cast<uint32_t>(g.heads);
  p.seq = static_cast<uint32_t>(g.seq);
  p.cpr = static_cast<uint32_t>(cpr);
  p.nope_chunks = static_cast<uint32_t>(g.nope / kV);
  p.rope_dim = static_cast<uint32_t>(g.rope);
  // Tokens per block: about kUnroll chunks a thread, the staged rope rows within 16 KiB.
  const int64_t by_work = kThreads * kUnroll / (g.heads * cpr);
  const int64_t by_smem = 16384 / (g.rope * static_cast<int64_t>(sizeof(T)));
  p.tpb = static_cast<uint32_t>(std::max<int64_t>(1, std::min({by_work, by_smem, int64_t{64}})));
  p.by_cpr = rope_math::FastDiv(p.cpr);
  p.by_heads = rope_math::FastDiv(p.heads);
  p.by_seq = rope_math::FastDiv(p.seq);
  p.by_rope = rope_math::FastDiv(p.rope_dim);
  p.interleave = a.pairing == RopePairing::kInterleave;
  const auto blocks = static_cast<unsigned>((p.tokens + p.tpb - 1) / p.tpb);
  const size_t smem = size_t{p.tpb} * p.rope_dim * sizeof(T);
  rope_key_block_kernel<T><<<blocks, kThreads, smem, static_cast<cudaStream_t>(ctx.stream)>>>(
      a.kv.data_as<const T>(), a.kr.data_as<const T>(), k.data_as<T>(), p);
  OCTET_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace

void rope_key_forward(Context& ctx, const RopeKeyArgs& a, const RopeKeyGeometry& g, Tensor& k) {
  if (a.kernel == RopeKeyKernel::kAuto &&
      (a.kv.dtype() == DType::kF32 ? launch_block_kernel<float>(ctx, a, g, k)
                                   : launch_block_kernel<uint16_t>(ctx, a, g, k)))
    return;
  KeyParams p = params(g, a.kr_col, a.table, a.pairing);
  const int64_t dqk = g.nope + g.rope;
  const auto st = static_cast<cudaStream_t>(ctx.stream);
  const unsigned blocks = blocks_for(ctx, p.rows * ((dqk + 7) / 8));
  if (a.kv.dtype() == DType::kF32) {
    rope_key_forward_kernel<float><<<blocks, kThreads, 0, st>>>(
        a.kv.data_as<const float>(), a.kr.data_as<const float>(), k.data_as<float>(), p);
  } else {
    p.vec_load = g.kv_width % 8 == 0 && aligned16(a.kv.data());
    p.vec_store = dqk % 8 == 0 && aligned16(k.data());
    rope_key_forward_kernel<uint16_t><<<blocks, kThreads, 0, st>>>(
        a.kv.data_as<const uint16_t>(), a.kr.data_as<const uint16_t>(), k.data_as<uint16_t>(), p);
  }
  OCTET_CUDA_CHECK_LAUNCH();
}

void rope_key_backward(Context& ctx, const RopeKeyBackwardArgs& a, const RopeKeyGeometry& g) {
  const KeyParams p = params(g, a.kr_col, a.table, a.pairing);
  const auto st = static_cast<cudaStream_t>(ctx.stream);
  const unsigned blocks = blocks_for(ctx, g.batch * g.seq * (g.rope / 2));
  if (a.grad_k.dtype() == DType::kF32)
    rope_key_backward_kernel<float><<<blocks, kThreads, 0, st>>>(a.grad_k.data_as<const float>(),
                                                                 a.grad_kr.data_as<float>(), p);
  else
    rope_key_backward_kernel<uint16_t><<<blocks, kThreads, 0, st>>>(
        a.grad_k.data_as<const uint16_t>(), a.grad_kr.data_as<uint16_t>(), p);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet::cuda
