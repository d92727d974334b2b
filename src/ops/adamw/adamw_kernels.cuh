// Device code of the adamw family: the element update of adamw_math.h (the same FP32 operations as
// the CPU reference), and the fixed-order global norm of adamw.h.
#pragma once

#include <cstdint>

#include "ops/adamw/adamw_math.h"

namespace octet::cuda::kernels {

inline constexpr int kMaxNormTensors = 32;  // tensors per launch of the multi-tensor kernels

// Up to kMaxNormTensors tensors passed by value (no device copy of a descriptor table).
struct TensorBatch {
  const float* ptr[kMaxNormTensors];
  int64_t numel[kMaxNormTensors];
  int64_t chunk_begin[kMaxNormTensors + 1];  // prefix sums of each tensor's chunk count
  int count;
};

// One parameter's step on its stored forms (FP32 master, BF16 moments): the gradient times the
// loss scale's inverse when one is given, adamw_math::update, the moments rounded back to BF16.
struct StoredStep {
  float p;
  uint16_t m, v;
};
__device__ __forceinline__ StoredStep stored_update(float p, float g, uint16_t m, uint16_t v,
                                                    const float* scale, float s,
                                                    const AdamWConsts& k) {
  const float gi = scale ? rn::mul(g, s) : g;
  adamw_math::Element x{p, bf16_to_float(m), bf16_to_float(v)};
  adamw_math::update(x, gi, k);
  return {x.p, float_to_bf16(x.m), float_to_bf16(x.v)};
}

// The same for 4 consecutive parameters as 16-byte (master, gradient) and 8-byte (moments) words.
struct StoredStep4 {
  float4 p;
  uint2 m, v;
};
__device__ __forceinline__ uint16_t half_of(const uint2& w, int e) {
  return static_cast<uint16_t>(((e < 2) ? w.x : w.y) >> (16 * (e % 2)));
}
__device__ __forceinline__ uint2 pack_halves(const uint16_t (&h)[4]) {
  return make_uint2(h[0] | (static_cast<uint32_t>(h[1]) << 16),
                    h[2] | (static_cast<uint32_t>(h[3]) << 16));
}
__device__ __forceinline__ StoredStep4 stored_update(float4 p, float4 g, uint2 m, uint2 v,
                                                     const float* scale, float s,
                                                     const AdamWConsts& k) {
  const float ps[4] = {p.x, p.y, p.z, p.w}, gs[4] = {g.x, g.y, g.z, g.w};
  float po[4];
  uint16_t mo[4], vo[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const StoredStep r = stored_update(ps[e], gs[e], half_of(m, e), half_of(v, e), scale, s, k);
    po[e] = r.p;
    mo[e] = r.m;
    vo[e] = r.v;
  }
  return {make_float4(po[0], po[1], po[2], po[3]), pack_halves(mo), pack_halves(vo)};
}

__device__ __forceinline__ uint16_t bf16_of(float p) {
  return float_to_bf16(p);
}
__device__ __forceinline__ uint2 bf16_of(float4 p) {
  const uint16_t b[4] = {float_to_bf16(p.x), float_to_bf16(p.y), float_to_bf16(p.z),
                         float_to_bf16(p.w)};
  return pack_halves(b);
}

// The update over n elements of P (float, or float4: 4 elements per thread with 16-byte loads of p
// and g and 8-byte loads of m and v, every pointer aligned so). M is the moments' and the BF16
// copy's storage word: uint16_t for float, uint2 for float4.
template <typename P, typename M>
__global__ void adamw_kernel(P* __restrict__ p, const P* __restrict__ g, M* __restrict__ m,
                             M* __restrict__ v, M* __restrict__ p_bf16,
                             const float* __restrict__ scale, const int32_t* __restrict__ found_inf,
                             int64_t n, AdamWConsts k, const AdamWConsts* __restrict__ kd) {
  if (found_inf && *found_inf != 0) return;
  const float s = scale ? *scale : 1.0f;
  if (kd) k = *kd;  // the step's constants computed on the device (adamw_device_consts)
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const auto r = stored_update(p[i], g[i], m[i], v[i], scale, s, k);
    p[i] = r.p;
    m[i] = r.m;
    v[i] = r.v;
    if (p_bf16) p_bf16[i] = bf16_of(r.p);
  }
}

// Pass 1 of the norm: one block of kNormLanes threads per chunk of kNormChunk elements.
__global__ void norm_chunks_kernel(TensorBatch b, float* __restrict__ partials) {
  static_assert(kNormLanes == 256, "the launch uses 256 threads");
  __shared__ float lane_sum[kNormLanes];
  const int64_t chunk = blockIdx.x;
  int ti = 0;
  while (ti + 1 < b.count && b.chunk_begin[ti + 1] <= chunk) ++ti;
  const float* x = b.ptr[ti];
  const int64_t n = b.numel[ti];
  const int64_t c0 = (chunk - b.chunk_begin[ti]) * kNormChunk;
  const int l = threadIdx.x;
  float acc = 0.0f;
#pragma unroll
  for (int r = 0; r < kNormRounds; ++r) {
    const int64_t i = c0 + int64_t{r} * kNormLanes + l;
    if (i < n) acc = rn::add(acc, rn::mul(x[i], x[i]));
  }
  lane_sum[l] = acc;
  __syncthreads();
  for (int h = kNormLanes / 2; h > 0; h /= 2) {
    if (l < h) lane_sum[l] = rn::add(lane_sum[l], lane_sum[l + h]);
    __syncthreads();
  }
  if (l == 0) partials[chunk] = lane_sum[0];
}

// Pass 2: one block of kNormLanes threads sums all partials in FP64 and takes the root.
__global__ void norm_finish_kernel(const float* __restrict__ partials, int64_t count,
                                   float* __restrict__ norm) {
  __shared__ double sums[kNormLanes];
  const int l = threadIdx.x;
  double acc = 0.0;
  for (int64_t q = l; q < count; q += kNormLanes)
    acc = rn::add(acc, static_cast<double>(partials[q]));
  sums[l] = acc;
  __syncthreads();
  for (int h = kNormLanes / 2; h > 0; h /= 2) {
    if (l < h) sums[l] = rn::add(sums[l], sums[l + h]);
    __syncthreads();
  }
  if (l == 0) norm[0] = static_cast<float>(rn::sqrt(sums[0]));
}

__global__ void clip_coefficient_kernel(const float* __restrict__ norm, float max_norm,
                                        float* __restrict__ out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = adamw_math::clip_coefficient(norm[0], max_norm);
}

// Any NaN or inf in the batch sets *flag = 1 (a plain store of the same value: order-independent).
__global__ void nonfinite_kernel(TensorBatch b, int32_t* __restrict__ flag) {
  for (int ti = 0; ti < b.count; ++ti) {
    const float* x = b.ptr[ti];
    bool found = false;
    for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < b.numel[ti];
         i += int64_t{gridDim.x} * blockDim.x)
      found |= (float_bits(x[i]) & 0x7FFFFFFFu) >= 0x7F800000u;
    if (found) *flag = 1;
  }
}

}  // namespace octet::cuda::kernels
