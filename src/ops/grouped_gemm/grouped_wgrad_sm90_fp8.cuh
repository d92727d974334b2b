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
// padded permute): its A and B are column offsets with the full row strides, and so are its scales,
// read in place: columns [o_e / 128, ...) of rows whose stride is the whole ceil(R/128), a layout
// per expert that the setup kernel writes and the mainloop takes from the arguments
// (grouped_gemm_sm90_overlap_mma.cuh tensors_perform_update; CUTLASS's own rebuilds compact
// layouts from the problem shape, which needed a per-call copy of every expert's scale columns). An
// expert without tokens is an empty problem (no tiles): its dW_e is left as it was (+=), or zeroed
// by the setup kernel when dW is overwritten (=: the step's first writer of the gradient, without
// C: a kernel instantiation of its own, so that no stale value of dW is read).
#pragma once

#include <type_traits>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "ops/grouped_gemm/group_span.cuh"
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
  const float* sfa;  // A's scales (n, ceil(R / 128)), B's (ceil(k / 128), ceil(R / 128))
  const float* sfb;
  bool overwrite;  // dW = (zero the empty experts' dW_e) or dW +=
};

// grouped_wgrad_fp8_sm90_supports's limit on the experts: the setup kernel's table of them lives in
// shared memory.
constexpr int kWgradMaxExperts = 1024;

// Every expert's place, built by each block of the setup kernel from the row counts (one load a
// count, two block-wide scans): its first token (group_span's clamped prefix), its tokens, and the
// empty experts in order.
struct WgradExpertTable {
  int64_t offset[kWgradMaxExperts];
  int32_t rows[kWgradMaxExperts];
  int32_t empty[kWgradMaxExperts];
  int32_t empties;
  int64_t warp_sums[32];
};

// Thread t of the block of 256 takes experts 4 t .. 4 t + 3, so that the scans over threads are
// scans over experts in order.
template <typename ElementA>
__device__ void build_expert_table(const WgradSetupParams<ElementA>& p, WgradExpertTable& t) {
  constexpr int kPer = kWgradMaxExperts / 256;  // experts a thread (blocks of 256)
  const int q0 = static_cast<int>(threadIdx.x) * kPer;
  int64_t m[kPer], mine = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    m[i] = q0 + i < p.experts ? group_rows_at(p.sizes, p.sizes_i64, q0 + i) : 0;
    mine += m[i];
  }
  int64_t total;
  int64_t before = block_exclusive_scan(mine, t.warp_sums, &total);
  int64_t empties = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    if (q0 + i >= p.experts) break;
    // group_span's clamp: the groups never run past p.tokens
    const int64_t offset = before < p.tokens ? before : p.tokens;
    const int64_t rows = min(m[i], p.tokens - offset);
    before += m[i];
    t.offset[q0 + i] = offset;
    t.rows[q0 + i] = static_cast<int32_t>(rows);
    empties += rows == 0;
  }
  int64_t rank = block_exclusive_scan(empties, t.warp_sums, &total);
  if (threadIdx.x == 0) t.empties = static_cast<int32_t>(total);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    if (q0 + i >= p.experts) break;
    if (t.rows[q0 + i] == 0) t.empty[rank++] = q0 + i;
  }
  __syncthreads();
}

// A scale layout of ScaleConfig's (K-major: a row of scales holds its K blocks contiguously) with
// the row stride of the whole array instead of the problem's own ceil(K / 128): the expert's K
// blocks read in place.
template <typename Layout>
__device__ Layout with_row_stride(const Layout& l, int row_stride) {
  using namespace cute;
  return make_layout(l.shape(), make_stride(make_stride(_0{}, row_stride), get<1>(l.stride()),
                                            get<2>(l.stride())));
}

// Every block builds the experts' table. Block 0 writes the experts' arguments (o_e, M_e, their
// operands and scales in place). With kOverwrite, every thread of the grid then takes its share of
// dW_e = 0 for the empty experts (an empty sum), 16 bytes a store where D allows; otherwise the
// grid is one block.
template <typename ElementA>
__global__ void __launch_bounds__(256)
    grouped_wgrad_setup_kernel(WgradSetupParams<ElementA> p, DeviceArrays<float, ElementA> out) {
  __shared__ WgradExpertTable t;
  build_expert_table(p, t);
  if (blockIdx.x == 0) {
    const int kb = static_cast<int>((p.tokens + 127) / 128);
    for (int e = static_cast<int>(threadIdx.x); e < p.experts; e += static_cast<int>(blockDim.x)) {
      const int m = t.rows[e];
      const int64_t offset = t.offset[e], c0 = offset / 128;
      // M = N (dW rows), N = K (dW columns), K = the expert's tokens; none: an empty problem.
      out.shapes[e] = Shape3{m > 0 ? p.n : 0, p.k, m};
      out.a[e] = p.a + offset;
      out.b[e] = p.b + offset;
      out.d[e] = p.d + static_cast<int64_t>(e) * p.n * p.k;
      out.sfa[e] = p.sfa + c0;
      out.sfb[e] = p.sfb + c0;
      out.stride_a[e] = StrideA{p.tokens, {}, {}};
      out.stride_b[e] = StrideB{p.tokens, {}, {}};
      out.stride_d[e] = StrideD{p.k, {}, {}};
      out.layout_sfa[e] = with_row_stride(
          LayoutSFA(ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(p.n, p.k, m, 1))), kb);
      out.layout_sfb[e] = with_row_stride(
          LayoutSFB(ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(p.n, p.k, m, 1))), kb);
    }
  }
  if (!p.overwrite) return;
  const int64_t count = static_cast<int64_t>(p.n) * p.k;
  const int64_t threads = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const bool vec = count % 4 == 0 && reinterpret_cast<uintptr_t>(p.d) % 16 == 0;
  for (int z = 0; z < t.empties; ++z) {
    float* d = p.d + static_cast<int64_t>(t.empty[z]) * count;
    if (vec) {
      auto* d4 = reinterpret_cast<float4*>(d);
      for (int64_t i = first; i < count / 4; i += threads) d4[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    } else {
      for (int64_t i = first; i < count; i += threads) d[i] = 0.0f;
    }
  }
}

// Wgrad in one launch for A of ElementA (grouped_gemm_sm90.h's grouped_wgrad_fp8_sm90): dW += dY^T
// X, or with kOverwrite dW = dY^T X (no C).
template <typename ElementA, bool kOverwrite = false>
void run_grouped_wgrad_fp8(Context& ctx, const GroupedWgradFp8Args& args) {
  using ElementD = float;
  using Config = Sm90GroupedFp8<ElementD, std::conditional_t<kOverwrite, void, float>, ElementA>;
  using Gemm = typename Config::Gemm;
  static_assert(strides_match<Config>(), "the argument arrays' stride types are the kernel's");
  const int64_t experts = args.group_sizes.numel(), n = args.a.rows(), k = args.b.rows();
  OCTET_CHECK(experts <= kWgradMaxExperts, "grouped wgrad (CUTLASS sm90 FP8 blockwise): ", experts,
              " experts, at most ", kWgradMaxExperts);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  Tensor arrays = Tensor::empty(ctx, {static_cast<int64_t>(arrays_bytes(experts))}, DType::kU8);
  const DeviceArrays<ElementD, ElementA> dev = carve<ElementD, ElementA>(arrays.data(), experts);
  WgradSetupParams<ElementA> sp;
  sp.sizes = args.group_sizes.data();
  sp.sizes_i64 = args.group_sizes.dtype() == DType::kI64;
  sp.experts = static_cast<int>(experts);
  sp.n = static_cast<int>(n);
  sp.k = static_cast<int>(k);
  sp.tokens = args.a.cols();
  sp.a = args.a.data.data_as<const ElementA>();
  sp.b = args.b.data.data_as<const ElementB>();
  sp.d = args.d.data_as<ElementD>();
  sp.sfa = args.a.scale_inv.data_as<const float>();
  sp.sfb = args.b.scale_inv.data_as<const float>();
  sp.overwrite = kOverwrite;
  OCTET_CHECK(ceil_div(sp.tokens, kGroup) <= 0x7FFFFFFF, "grouped wgrad: ", sp.tokens,
              " tokens exceed the scale layouts' int strides");
  // One block writes the arguments; dW = also zeroes the empty experts' dW_e, with two blocks an
  // SM (every block builds the table, so that each knows which experts are empty).
  const int blocks =
      kOverwrite ? 2 * hardware_info<typename Config::GemmKernel>(ctx.device_index).sm_count : 1;
  if (experts > 0) grouped_wgrad_setup_kernel<<<blocks, 256, 0, stream>>>(sp, dev);
  OCTET_CUDA_CHECK_LAUNCH();

  // C = D (dW +=), or no C (dW =).
  using ElementC = std::conditional_t<kOverwrite, void, float>;
  const ElementC** c = nullptr;
  if constexpr (!kOverwrite) c = const_cast<const ElementD**>(dev.d);
  typename Gemm::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {static_cast<int>(experts), dev.shapes, nullptr},  // problem shapes on the device only
      {dev.a, dev.stride_a, dev.b, dev.stride_b, dev.sfa, dev.layout_sfa, dev.sfb, dev.layout_sfb},
      {{}, c, dev.stride_d, dev.d, dev.stride_d},
      hardware_info<typename Config::GemmKernel>(ctx.device_index)};
  arguments.epilogue.thread.alpha = 1.0f;
  arguments.epilogue.thread.beta = kOverwrite ? 0.0f : 1.0f;
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
