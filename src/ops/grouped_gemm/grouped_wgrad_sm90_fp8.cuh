// The Hopper grouped FP8 Wgrad of grouped_wgrad_sm90_fp8_blockwise*.cu, as a template over A's
// element type (dY's column-wise copy: E4M3 for DeepSeek-V3, E5M2 for the per-tensor recipes); each
// translation unit instantiates one.
//
// Grouped FP8 weight gradient for the routed experts: dW_e += dY_e^T X_e for every expert in
// one CUTLASS launch (grouped_gemm_sm90_config.cuh has the kernel configuration), each expert's
// tokens the K of its GEMM. The per-expert shapes, pointers, strides and scale layouts are built on
// the device from the row counts: nothing here reads them on the host.
//
// Operands as grouped_gemm.h lays them out for Wgrad: A = dY's column-wise copy (N, R) fp8 with
// 1x128 scale_inv along tokens (N, ceil(R/128)); B = X's column-wise copy (K, R) from the
// scaling-aware transpose, 128x128 scale_inv (ceil(K/128), ceil(R/128)); dW (E, N, K) f32,
// accumulated (C = D). Expert e reads token columns [o_e, o_e + M_e), o_e a multiple of 128 (the
// padded permute): its A and B are column offsets with the full row strides. Its scales are columns
// [o_e / 128, ...) of rows whose stride is the whole ceil(R/128), but the mainloop rebuilds every
// group's scale layout from the problem shape (compact: row stride ceil(M_e / 128)), so a gather
// kernel first copies each expert's scale columns into compact per-expert blocks (the scales are
// 1/128 of the data per row, a small pass). An expert without tokens is an empty problem (no
// tiles): its dW_e is left as it was.
#pragma once

#include <algorithm>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "ops/grouped_gemm/grouped_gemm_sm90.h"
#include "ops/grouped_gemm/grouped_gemm_sm90_config.cuh"

namespace octet::cuda::sm90 {

template <typename ElementA>
struct WgradSetupParams {
  const void* sizes;  // (E) int32 | int64
  bool sizes_i64;
  int experts, n, k;
  int64_t tokens;  // R: the columns of A and B
  const ElementA* a;
  const ElementB* b;
  float* d;
  const float* sfa;
  const float* sfb;
};

// One thread per expert after a single-thread prefix sum (E is at most a few hundred). Writes the
// experts' token offsets (E + 1 entries) for the scale gather, and points the scales at the compact
// per-expert blocks that the gather fills: expert e's block starts at rows * (o_e / 128).
template <typename ElementA>
__global__ void grouped_wgrad_setup_kernel(WgradSetupParams<ElementA> p,
                                           DeviceArrays<float, ElementA> out, int64_t* offsets) {
  if (threadIdx.x == 0) {
    int64_t sum = 0;
    for (int e = 0; e < p.experts; ++e) {
      int64_t m = p.sizes_i64 ? static_cast<const int64_t*>(p.sizes)[e]
                              : static_cast<const int32_t*>(p.sizes)[e];
      m = m < 0 ? 0 : (sum + m > p.tokens ? p.tokens - sum : m);  // never past the tokens
      offsets[e] = sum;
      // M = N (dW rows), N = K (dW columns), K = the expert's tokens; none: an empty problem.
      out.shapes[e] = Shape3{m > 0 ? p.n : 0, p.k, static_cast<int>(m)};
      sum += m;
    }
    offsets[p.experts] = sum;
  }
  __syncthreads();
  const int64_t kblocks = (p.k + 127) / 128;
  for (int e = threadIdx.x; e < p.experts; e += blockDim.x) {
    const int64_t off = offsets[e], c0 = off / 128;
    const int m = cute::get<2>(out.shapes[e]);
    out.a[e] = p.a + off;
    out.b[e] = p.b + off;
    out.d[e] = p.d + static_cast<int64_t>(e) * p.n * p.k;
    out.sfa[e] = p.sfa + p.n * c0;
    out.sfb[e] = p.sfb + kblocks * c0;
    out.stride_a[e] = StrideA{p.tokens, {}, {}};
    out.stride_b[e] = StrideB{p.tokens, {}, {}};
    out.stride_d[e] = StrideD{p.k, {}, {}};
    out.layout_sfa[e] = ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(p.n, p.k, m, 1));
    out.layout_sfb[e] = ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(p.n, p.k, m, 1));
  }
}

// dst gets, for every expert e and scale row r, the expert's scale columns [c0, c0 + mb) of src
// (rows x kb, row-major) as a compact (rows x mb) block at rows * c0: c0 = o_e / 128, mb =
// ceil(M_e / 128). Columns past the experts (the padded tail) are not copied.
template <typename ElementA>
__global__ void grouped_wgrad_gather_scales_kernel(const float* src, float* dst, int64_t rows,
                                                   int64_t kb, const int64_t* offsets,
                                                   int experts) {
  const int64_t used = (offsets[experts] + 127) / 128;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * kb;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / kb, c = i % kb;
    if (c >= used) continue;
    int lo = 0, hi = experts - 1;  // the last expert whose first block is <= c
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (offsets[mid] / 128 <= c)
        lo = mid;
      else
        hi = mid - 1;
    }
    // Skip back over empty experts that start at the same block.
    while (lo > 0 && offsets[lo + 1] == offsets[lo]) --lo;
    const int64_t c0 = offsets[lo] / 128, mb = (offsets[lo + 1] - offsets[lo] + 127) / 128;
    if (c - c0 >= mb) continue;
    dst[rows * c0 + r * mb + (c - c0)] = src[r * kb + c];
  }
}

// Wgrad in one launch for A of ElementA (grouped_gemm_sm90.h's grouped_wgrad_fp8_sm90).
template <typename ElementA>
void run_grouped_wgrad_fp8(Context& ctx, const GroupedWgradFp8Args& args) {
  using ElementD = float;
  using Config = Sm90GroupedFp8<ElementD, float, ElementA>;
  using Gemm = typename Config::Gemm;
  static_assert(strides_match<Config>(), "the argument arrays' stride types are the kernel's");
  const int64_t experts = args.group_sizes.numel(), n = args.a.rows(), k = args.b.rows();
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  Tensor arrays = Tensor::empty(ctx, {static_cast<int64_t>(arrays_bytes(experts))}, DType::kU8);
  const DeviceArrays<ElementD, ElementA> dev = carve<ElementD, ElementA>(arrays.data(), experts);
  Tensor offsets = Tensor::empty(ctx, {experts + 1}, DType::kI64);
  const int64_t tokens = args.a.cols(), kb = ceil_div(tokens, kGroup),
                kblocks = ceil_div(k, kGroup);
  Tensor sfa = Tensor::empty(ctx, {n * kb}, DType::kF32);
  Tensor sfb = Tensor::empty(ctx, {kblocks * kb}, DType::kF32);
  WgradSetupParams<ElementA> sp;
  sp.sizes = args.group_sizes.data();
  sp.sizes_i64 = args.group_sizes.dtype() == DType::kI64;
  sp.experts = static_cast<int>(experts);
  sp.n = static_cast<int>(n);
  sp.k = static_cast<int>(k);
  sp.tokens = tokens;
  sp.a = args.a.data.data_as<const ElementA>();
  sp.b = args.b.data.data_as<const ElementB>();
  sp.d = args.d.data_as<ElementD>();
  sp.sfa = sfa.data_as<const float>();
  sp.sfb = sfb.data_as<const float>();
  grouped_wgrad_setup_kernel<<<1, 256, 0, stream>>>(sp, dev, offsets.data_as<int64_t>());
  OCTET_CUDA_CHECK_LAUNCH();
  auto gather = [&](const Tensor& src, Tensor& dst, int64_t rows) {
    const int64_t total = rows * kb;
    const auto blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 4096));
    grouped_wgrad_gather_scales_kernel<ElementA><<<std::max(blocks, 1u), 256, 0, stream>>>(
        src.data_as<const float>(), dst.data_as<float>(), rows, kb,
        offsets.data_as<const int64_t>(), static_cast<int>(experts));
    OCTET_CUDA_CHECK_LAUNCH();
  };
  gather(args.a.scale_inv, sfa, n);
  gather(args.b.scale_inv, sfb, kblocks);

  typename Gemm::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {static_cast<int>(experts), dev.shapes, nullptr},  // problem shapes on the device only
      {dev.a, dev.stride_a, dev.b, dev.stride_b, dev.sfa, dev.layout_sfa, dev.sfb, dev.layout_sfb},
      {{}, const_cast<const ElementD**>(dev.d), dev.stride_d, dev.d, dev.stride_d},
      hardware_info<typename Config::GemmKernel>(ctx.device_index)};
  arguments.epilogue.thread.alpha = 1.0f;
  arguments.epilogue.thread.beta = 1.0f;  // dW += dY^T X
  Gemm gemm;
  OCTET_CHECK(gemm.can_implement(arguments) == cutlass::Status::kSuccess,
              "grouped wgrad (CUTLASS sm90 FP8 blockwise): cannot implement N = ", n, ", K = ", k,
              " with ", experts, " experts");
  const size_t ws_bytes = Gemm::get_workspace_size(arguments);
  Tensor workspace;
  if (ws_bytes > 0) workspace = Tensor::empty(ctx, {static_cast<int64_t>(ws_bytes)}, DType::kU8);
  const cutlass::Status st = gemm.run(arguments, ws_bytes > 0 ? workspace.data() : nullptr, stream);
  OCTET_CHECK(st == cutlass::Status::kSuccess,
              "grouped wgrad (CUTLASS sm90 FP8 blockwise): ", cutlassGetStatusString(st));
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet::cuda::sm90
