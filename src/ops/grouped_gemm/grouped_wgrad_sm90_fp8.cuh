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
// group's scale layout from the problem shape (compact: row stride ceil(M_e / 128)), so the setup
// kernel also copies each expert's scale columns into compact per-expert blocks (the scales are
// 1/128 of the data per row, a small pass in the same launch). An expert without tokens is an
// empty problem (no tiles): its dW_e is left as it was (+=), or zeroed by the setup kernel when
// dW is overwritten (=: the step's first writer of the gradient, without C: a kernel instantiation
// of its own, so that no stale value of dW is read).
#pragma once

#include <algorithm>
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
  const float* sfa_src;  // A's scales (n, ceil(R / 128)), B's (ceil(k / 128), ceil(R / 128))
  const float* sfb_src;
  float* sfa;  // their compact per-expert copies, the same sizes
  float* sfb;
  bool overwrite;  // dW = (zero the empty experts' dW_e) or dW +=
};

// The work every expert needs besides its arguments, shared by every block of the grid (expert by
// expert, each thread walking the clamped row counts itself: group_span's prefix, E loads): copying
// its scale columns [c0, c0 + mb) of A and B (c0 = o_e / 128, mb = ceil(M_e / 128)) into compact
// (rows x mb) blocks at rows * c0, the layout the mainloop rebuilds from the problem shape, and,
// with kOverwrite, dW_e = 0 for an empty expert (an empty sum), 16 bytes a store where D allows.
// Columns past the experts (the padded tail) are not copied. Real routing is skewed: an expert of
// many tokens, or an empty one, left to its own few blocks took tens of microseconds.
template <typename ElementA>
__device__ void copy_scales_and_zero_empty(const WgradSetupParams<ElementA>& p) {
  const int64_t kb = (p.tokens + 127) / 128, kblocks = (p.k + 127) / 128;
  const int64_t count = static_cast<int64_t>(p.n) * p.k;
  const int64_t threads = int64_t{gridDim.x} * gridDim.y * blockDim.x;
  const int64_t first = (int64_t{blockIdx.y} * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  const bool vec = count % 4 == 0 && reinterpret_cast<uintptr_t>(p.d) % 16 == 0;
  int64_t used = 0;
  for (int q = 0; q < p.experts; ++q) {
    int64_t m = group_rows_at(p.sizes, p.sizes_i64, q);
    if (m > p.tokens - used) m = p.tokens - used;  // group_span's clamp
    const int64_t c0 = used / 128, mb = (m + 127) / 128;
    used += m;
    if (m == 0) {
      if (!p.overwrite) continue;
      float* d = p.d + static_cast<int64_t>(q) * count;
      if (vec) {
        auto* d4 = reinterpret_cast<float4*>(d);
        for (int64_t i = first; i < count / 4; i += threads)
          d4[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      } else {
        for (int64_t i = first; i < count; i += threads) d[i] = 0.0f;
      }
      continue;
    }
    // Scale rows 0 .. n - 1 are A's, n .. n + kblocks - 1 B's.
    auto copy = [&](int64_t r, int64_t j) {
      if (r < p.n)
        p.sfa[p.n * c0 + r * mb + j] = p.sfa_src[r * kb + c0 + j];
      else
        p.sfb[kblocks * c0 + (r - p.n) * mb + j] = p.sfb_src[(r - p.n) * kb + c0 + j];
    };
    const int64_t total = (p.n + kblocks) * mb;
    if (total < (int64_t{1} << 31) && threads < (int64_t{1} << 31)) {
      // Copy i's row and column by a 32-bit division, a short inline sequence: a 64-bit one is a
      // software routine of about a hundred instructions, and it was most of this kernel's time.
      const auto n32 = static_cast<uint32_t>(total), m32 = static_cast<uint32_t>(mb),
                 s32 = static_cast<uint32_t>(threads);
      for (auto i = static_cast<uint32_t>(first); i < n32; i += s32) {
        const uint32_t r = i / m32;
        copy(r, i - r * m32);
      }
    } else {
      for (int64_t i = first; i < total; i += threads) copy(i / mb, i % mb);
    }
  }
}

// Block (0, e) writes expert e's arguments (group_span: its first token o_e and count M_e); then
// every block takes its share of copy_scales_and_zero_empty.
template <typename ElementA>
__global__ void grouped_wgrad_setup_kernel(WgradSetupParams<ElementA> p,
                                           DeviceArrays<float, ElementA> out) {
  const int e = static_cast<int>(blockIdx.y);
  const GroupSpan g = group_span(p.sizes, p.sizes_i64, p.experts, e, p.tokens);
  const int64_t kblocks = (p.k + 127) / 128;
  const int64_t c0 = g.offset / 128;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const int m = static_cast<int>(g.rows);
    // M = N (dW rows), N = K (dW columns), K = the expert's tokens; none: an empty problem.
    out.shapes[e] = Shape3{m > 0 ? p.n : 0, p.k, m};
    out.a[e] = p.a + g.offset;
    out.b[e] = p.b + g.offset;
    out.d[e] = p.d + static_cast<int64_t>(e) * p.n * p.k;
    out.sfa[e] = p.sfa + p.n * c0;
    out.sfb[e] = p.sfb + kblocks * c0;
    out.stride_a[e] = StrideA{p.tokens, {}, {}};
    out.stride_b[e] = StrideB{p.tokens, {}, {}};
    out.stride_d[e] = StrideD{p.k, {}, {}};
    out.layout_sfa[e] = ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(p.n, p.k, m, 1));
    out.layout_sfb[e] = ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(p.n, p.k, m, 1));
  }
  copy_scales_and_zero_empty(p);
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
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  Tensor arrays = Tensor::empty(ctx, {static_cast<int64_t>(arrays_bytes(experts))}, DType::kU8);
  const DeviceArrays<ElementD, ElementA> dev = carve<ElementD, ElementA>(arrays.data(), experts);
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
  sp.sfa_src = args.a.scale_inv.data_as<const float>();
  sp.sfb_src = args.b.scale_inv.data_as<const float>();
  sp.sfa = sfa.data_as<float>();
  sp.sfb = sfb.data_as<float>();
  sp.overwrite = kOverwrite;
  // About two waves of blocks over the experts' scale copies; the grid's y is the expert.
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>(1, ceil_div(264, experts))),
                  static_cast<unsigned>(experts));
  if (experts > 0) grouped_wgrad_setup_kernel<<<grid, 256, 0, stream>>>(sp, dev);
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
