// CUDA launcher of swiglu_quantize_stored / swiglu_backward_quantize_stored (swiglu.h): ops/quantize's
// 128x128 tile kernel (quantize_kernels.cuh, which takes its values from a source type) with a
// source that computes SwiGLU or its gradient (swiglu_math.h) and rounds it to the stored dtype as
// swiglu_cuda.cu's stores do. The kernel then sees exactly the tensor the unfused op would have
// written, so codes, scales and amax are quantize()'s of it, bit for bit, and that tensor is never
// stored. Arguments were validated and outputs allocated by swiglu.cpp; nothing synchronises.
#include <cstdint>

#include "backend/cuda_check.h"
#include "ops/quantize/quantize_kernels.cuh"
#include "ops/swiglu/swiglu_backends.h"
#include "ops/swiglu/swiglu_math.h"

namespace octet::cuda {
namespace {

template <typename T>
__device__ __forceinline__ float widen(const T* p, int64_t i) {
  if constexpr (sizeof(T) == 4)
    return p[i];
  else
    return bf16_to_float(p[i]);
}

// Elements i .. i + 3 in one 8-byte (BF16) or 16-byte (F32) load; i a multiple of 4, p aligned.
template <typename T>
__device__ __forceinline__ void widen4(const T* p, int64_t i, float (&v)[4]) {
  if constexpr (sizeof(T) == 4) {
    const float4 w = *reinterpret_cast<const float4*>(p + i);
    v[0] = w.x, v[1] = w.y, v[2] = w.z, v[3] = w.w;
  } else {
    kernels::unpack4(*reinterpret_cast<const uint2*>(p + i), v);
  }
}

// (r, c) of the unfused op's output: h (rows, F), or d_gate_up (rows, 2F) with dg in columns
// [0, F) and du in [F, 2F). T is the stored dtype (gate_up's and dh's).
template <typename T, bool kBackward>
struct SwigluStoredSource {
  const T* gate_up;  // (rows, 2F)
  const T* dh;       // (rows, F), backward only
  int64_t f;
  bool vec4;  // F % 4 == 0 and the inputs aligned to 4 elements: 4 columns in one load each

  __device__ __forceinline__ float value(int64_t r, int64_t c) const {
    const T* gu = gate_up + r * 2 * f;
    if constexpr (kBackward) {
      const int64_t j = c < f ? c : c - f;
      const swiglu_math::SwigluGrad d =
          swiglu_math::swiglu_grad(widen(gu, j), widen(gu, f + j), widen(dh, r * f + j));
      return c < f ? d.dg : d.du;
    } else {
      return swiglu_math::swiglu(widen(gu, c), widen(gu, f + c));
    }
  }

  // quantize_tile_kernel's contract (TensorSource): the 4 values of (r, c..c+3), 0 outside the
  // matrix, packed in T's width, each rounded to T as the unfused op stores it.
  template <typename Held>
  __device__ __forceinline__ Held load(int64_t r, int64_t c, int64_t rows, int64_t cols,
                                       bool /*vec*/) const {
    float v[4];
    if (vec4 && r < rows && c < cols) {
      // c is a multiple of 4 and F too: the 4 columns lie in one half (gate or up) of the row.
      const T* gu = gate_up + r * 2 * f;
      const int64_t j = kBackward && c >= f ? c - f : c;
      float g[4], u[4];
      widen4(gu, j, g);
      widen4(gu, f + j, u);
      if constexpr (kBackward) {
        float d[4];
        widen4(dh, r * f + j, d);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const swiglu_math::SwigluGrad gr = swiglu_math::swiglu_grad(g[i], u[i], d[i]);
          v[i] = c < f ? gr.dg : gr.du;
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = swiglu_math::swiglu(g[i], u[i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = (r < rows && c + i < cols) ? value(r, c + i) : 0.0f;
    }
    if constexpr (sizeof(T) == 2)
      return make_uint2(float_to_bf16(v[0]) | (static_cast<uint32_t>(float_to_bf16(v[1])) << 16),
                        float_to_bf16(v[2]) | (static_cast<uint32_t>(float_to_bf16(v[3])) << 16));
    else
      return make_float4(v[0], v[1], v[2], v[3]);
  }
};

template <typename T, bool kBackward>
void launch(Context& ctx, const SwigluStoredQuantizeArgs& a, QuantTensor& out) {
  using kernels::ScaleSource;
  using kernels::TileOutput;
  const int64_t rows = a.gate_up.rows(), f = a.gate_up.cols() / 2;
  const int64_t cols = kBackward ? 2 * f : f;
  const cudaStream_t st = static_cast<cudaStream_t>(ctx.stream);
  kernels::TileParams p;
  p.rows = rows;
  p.cols = cols;
  p.rule = {.format = a.format, .rounding = a.rounding, .epsilon = a.epsilon, .margin = 0};
  p.amax_out = out.amax.data_as<uint32_t>();
  p.aligned_input = true;  // the source computes its values: any "input" alignment
  OCTET_CUDA_CHECK(cudaMemsetAsync(p.amax_out, 0, sizeof(uint32_t), st));
  // 1x128 row-wise groups are tile rows; the column-wise copy's 1x128 groups are tile columns.
  if (a.output != QuantizeOutput::kColumnwise)
    p.rowwise = TileOutput{out.data.data_as<uint8_t>(), out.scale_inv.data_as<float>(),
                           ScaleSource::kRowInTile, Granularity::k1x128};
  if (a.output != QuantizeOutput::kRowwise)
    p.columnwise = TileOutput{out.columnwise_data.data_as<uint8_t>(),
                              out.columnwise_scale_inv.data_as<float>(), ScaleSource::kColInTile,
                              Granularity::k1x128};
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kGroup)),
                  static_cast<unsigned>(ceil_div(rows, kGroup)));
  OCTET_CHECK(grid.y < 65536, "swiglu_quantize_stored: ", rows,
              " rows exceed the tile kernel's grid limit (65535 * 128)");
  const auto aligned = [](const void* q) {
    return reinterpret_cast<uintptr_t>(q) % (4 * sizeof(T)) == 0;
  };
  const bool vec4 = f % 4 == 0 && aligned(a.gate_up.data()) && (!kBackward || aligned(a.dh.data()));
  const SwigluStoredSource<T, kBackward> src{
      a.gate_up.data_as<const T>(), kBackward ? a.dh.data_as<const T>() : nullptr, f, vec4};
  kernels::quantize_tile_kernel<T, SwigluStoredSource<T, kBackward>>
      <<<grid, kernels::kTileThreads, 0, st>>>(src, p);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace

void swiglu_quantize_stored(Context& ctx, const SwigluStoredQuantizeArgs& a, bool backward,
                            QuantTensor& out) {
  const bool f32 = a.gate_up.dtype() == DType::kF32;
  if (backward)
    f32 ? launch<float, true>(ctx, a, out) : launch<uint16_t, true>(ctx, a, out);
  else
    f32 ? launch<float, false>(ctx, a, out) : launch<uint16_t, false>(ctx, a, out);
}

}  // namespace octet::cuda
