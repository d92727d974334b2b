// The Hopper grouped FP8 Fprop / Dgrad of grouped_gemm_sm90_fp8_blockwise*.cu, as a template over
// A's element type: each translation unit instantiates one (E4M3 for DeepSeek-V3, E5M2 for the
// per-tensor recipes' gradients), the only ones that see the CUTLASS headers.
//
// Grouped FP8 GEMM with DeepSeek-V3's blockwise scaling (1x128 activations x 128x128
// weights, FP32 promotion every 128 of K) for Fprop and Dgrad: one CUTLASS launch for all experts
// (grouped_gemm_sm90_config.cuh has the kernel configuration); the per-expert problem shapes,
// pointers, strides and scale layouts are built on the device by a small kernel from the row
// counts, so nothing here reads them on the host.
//
// Operands as octet lays them out (grouped_gemm.h): A (sum M_e, K) fp8 row-major with 1x128
// scale_inv (rows, ceil(K/128)) row-major; B stacked (E * N, K) fp8 row-major (each expert's (N, K)
// is CUTLASS's column-major K x N) with 128x128 scale_inv (E, ceil(N/128), ceil(K/128)); D (sum
// M_e, N) bf16 row-major. Both scale tensors are K-major in CUTLASS's terms (consecutive K-blocks
// adjacent), which the sm90 blockwise mainloop loads with cp.async.
#pragma once

#include <algorithm>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "ops/grouped_gemm/group_span.cuh"
#include "ops/grouped_gemm/grouped_gemm_sm90.h"
#include "ops/grouped_gemm/grouped_gemm_sm90_config.cuh"

namespace octet::cuda::sm90 {

template <typename ElementA>
struct FpropSetupParams {
  const void* sizes;  // (E) int32 | int64
  bool sizes_i64;
  int experts, n, k;
  int64_t rows;  // R: the rows of A and D (the padded tail past the experts' sum included)
  const ElementA* a;
  const ElementB* b;
  cutlass::bfloat16_t* d;
  const float* sfa;
  const float* sfb;
};

// The per-expert arguments and D's padded tail in one launch: block b writes expert b's arguments
// (and b + gridDim.x, ...), its first row from the counts before it (group_span); every block then
// zeroes its share of D's rows past the experts' sum (the tail of a padded layout, which only the
// device knows), 16 bytes a store.
template <typename ElementA, typename ElementD>
__global__ void grouped_fp8_setup_kernel(FpropSetupParams<ElementA> p,
                                         DeviceArrays<ElementD, ElementA> out) {
  const int64_t kb = (p.k + 127) / 128, nb = (p.n + 127) / 128;
  for (int e = blockIdx.x; e < p.experts; e += gridDim.x) {
    const GroupSpan g = group_span(p.sizes, p.sizes_i64, p.experts, e, p.rows);
    if (threadIdx.x != 0) continue;
    const int m = static_cast<int>(g.rows);
    out.shapes[e] = Shape3{m, p.n, p.k};
    out.a[e] = p.a + g.offset * p.k;
    out.b[e] = p.b + static_cast<int64_t>(e) * p.n * p.k;
    out.d[e] = p.d + g.offset * p.n;
    out.sfa[e] = p.sfa + g.offset * kb;
    out.sfb[e] = p.sfb + static_cast<int64_t>(e) * nb * kb;
    out.stride_a[e] = cutlass::make_cute_packed_stride(StrideA{}, {m, p.k, 1});
    out.stride_b[e] = cutlass::make_cute_packed_stride(StrideB{}, {p.n, p.k, 1});
    out.stride_d[e] = cutlass::make_cute_packed_stride(StrideD{}, {m, p.n, 1});
    out.layout_sfa[e] = ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(m, p.n, p.k, 1));
    out.layout_sfb[e] = ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(m, p.n, p.k, 1));
  }
  zero_rows_past(p.d, p.n * static_cast<int64_t>(sizeof(ElementD)),
                 group_span(p.sizes, p.sizes_i64, p.experts, p.experts, p.rows).offset, p.rows);
}

// Fprop / Dgrad in one launch for A of ElementA (grouped_gemm_sm90.h's grouped_gemm_fp8_sm90).
template <typename ElementA>
void run_grouped_fp8(Context& ctx, const GroupedGemmFp8Args& args) {
  using ElementD = cutlass::bfloat16_t;
  using Config = Sm90GroupedFp8<ElementD, void, ElementA>;
  using Gemm = typename Config::Gemm;
  static_assert(strides_match<Config>(), "the argument arrays' stride types are the kernel's");
  const int64_t experts = args.group_sizes.numel(), n = args.d.cols(), k = args.a.cols();
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  Tensor arrays = Tensor::empty(ctx, {static_cast<int64_t>(arrays_bytes(experts))}, DType::kU8);
  const DeviceArrays<ElementD, ElementA> dev = carve<ElementD, ElementA>(arrays.data(), experts);
  FpropSetupParams<ElementA> sp;
  sp.sizes = args.group_sizes.data();
  sp.sizes_i64 = args.group_sizes.dtype() == DType::kI64;
  sp.experts = static_cast<int>(experts);
  sp.n = static_cast<int>(n);
  sp.k = static_cast<int>(k);
  sp.rows = args.d.rows();
  sp.a = args.a.data.data_as<const ElementA>();
  sp.b = args.b.data.data_as<const ElementB>();
  sp.d = args.d.data_as<ElementD>();
  sp.sfa = args.a.scale_inv.data_as<const float>();
  sp.sfb = args.b.scale_inv.data_as<const float>();
  // A block per expert (their arguments), at least a wave of blocks (the padded tail's zeros).
  const auto blocks = static_cast<unsigned>(std::max<int64_t>(experts, 132));
  grouped_fp8_setup_kernel<<<blocks, 256, 0, stream>>>(sp, dev);
  OCTET_CUDA_CHECK_LAUNCH();

  typename Gemm::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {static_cast<int>(experts), dev.shapes, nullptr},  // problem shapes on the device only
      {dev.a, dev.stride_a, dev.b, dev.stride_b, dev.sfa, dev.layout_sfa, dev.sfb, dev.layout_sfb},
      {{}, nullptr, dev.stride_d, dev.d, dev.stride_d},
      hardware_info<typename Config::GemmKernel>(ctx.device_index)};
  arguments.epilogue.thread.alpha = 1.0f;
  arguments.epilogue.thread.beta = 0.0f;
  Gemm gemm;
  OCTET_CHECK(gemm.can_implement(arguments) == cutlass::Status::kSuccess,
              "grouped gemm (CUTLASS sm90 FP8 blockwise): cannot implement N = ", n, ", K = ", k,
              " with ", experts, " experts");
  const size_t ws_bytes = Gemm::get_workspace_size(arguments);
  Tensor workspace;
  if (ws_bytes > 0) workspace = Tensor::empty(ctx, {static_cast<int64_t>(ws_bytes)}, DType::kU8);
  const cutlass::Status st = gemm.run(arguments, ws_bytes > 0 ? workspace.data() : nullptr, stream);
  OCTET_CHECK(st == cutlass::Status::kSuccess,
              "grouped gemm (CUTLASS sm90 FP8 blockwise): ", cutlassGetStatusString(st));
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet::cuda::sm90
