// Device code shared by the Hopper grouped FP8 GEMMs (grouped_gemm_sm90_fp8_blockwise.cu for Fprop
// / Dgrad, grouped_wgrad_sm90_fp8_blockwise.cu for Wgrad): the CUTLASS 4.2 kernel configuration
// (the pointer-array warp-specialized cooperative kernel with blockwise scaling of CUTLASS example
// 68) and the per-expert argument arrays that a setup kernel fills on the device. Included only by
// those two translation units, the only ones that see the CUTLASS headers.
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>

#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cute/tensor.hpp>
#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/dispatch_policy.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>
#include <type_traits>

#include "ops/grouped_gemm/grouped_gemm_sm90_overlap_mma.cuh"

namespace octet::cuda::sm90 {

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
// A is E4M3 (DeepSeek-V3) or E5M2 (the gradients of the per-tensor recipes, whose per-expert scales
// run as constant 1x128 / 128x128 blocks); B, the weights or X's column-wise copy, is always E4M3.
using ElementB = cutlass::float_e4m3_t;
using LayoutA = cutlass::layout::RowMajor;     // (M, K), K contiguous
using LayoutB = cutlass::layout::ColumnMajor;  // K x N column-major == octet's (N, K) row-major
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlignA = 16, kAlignB = 16;  // 16-byte TMA rows

// CUTLASS example 68's configuration: 128x128x128 tiles, clusters of 1x2.
using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
// 1x128 activation scales and 128x128 weight scales, both K-major (octet's layouts).
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::K,
                                                              cute::GMMA::Major::K>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

// D = alpha A B^T + beta C per expert, D of ElementD; ElementC void (no C read) or ElementD (C =
// D); A of ElementA (E4M3 or E5M2).
template <typename ElementD, typename ElementC, typename ElementA>
struct Sm90GroupedFp8 {
  static constexpr int kAlignD = 16 / sizeof(ElementD);

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutD*, kAlignD,
      ElementD, LayoutD*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementC>>::CollectiveOp;

  using CutlassMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA,
      cute::tuple<LayoutA*, LayoutSFA*>, kAlignA, ElementB, cute::tuple<LayoutB*, LayoutSFB*>,
      kAlignB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum>::CollectiveOp;
  // CUTLASS's collective with its consumer loop replaced by one that overlaps each K tile's
  // promotion with the next tile's WGMMAs (grouped_gemm_sm90_overlap_mma.cuh).
  using CollectiveMainloop = OverlappedPromotionMma<CutlassMainloop>;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};

// Both instantiations read A and B and write D with the same stride types (row-major A and D,
// K-major B: 64-bit leading dimension, unit inner stride).
using StrideA = cute::Stride<int64_t, cute::Int<1>, cute::Int<0>>;
using StrideB = cute::Stride<int64_t, cute::Int<1>, cute::Int<0>>;
using StrideD = cute::Stride<int64_t, cute::Int<1>, cute::Int<0>>;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

// The per-expert argument arrays, one device buffer laid out as this struct of arrays.
template <typename ElementD, typename ElementA>
struct DeviceArrays {
  Shape3* shapes;
  const ElementA** a;
  const ElementB** b;
  ElementD** d;
  const float** sfa;
  const float** sfb;
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;
  LayoutSFA* layout_sfa;
  LayoutSFB* layout_sfb;
};

template <typename T>
size_t aligned_bytes(int64_t n) {
  return (static_cast<size_t>(n) * sizeof(T) + 255) / 256 * 256;
}

inline size_t arrays_bytes(int64_t e) {
  return aligned_bytes<Shape3>(e) + 5 * aligned_bytes<void*>(e) + aligned_bytes<StrideA>(e) +
         aligned_bytes<StrideB>(e) + aligned_bytes<StrideD>(e) + aligned_bytes<LayoutSFA>(e) +
         aligned_bytes<LayoutSFB>(e);
}

template <typename ElementD, typename ElementA>
DeviceArrays<ElementD, ElementA> carve(void* base, int64_t e) {
  auto* p = static_cast<char*>(base);
  auto take = [&](size_t bytes) {
    char* r = p;
    p += bytes;
    return r;
  };
  DeviceArrays<ElementD, ElementA> a;
  a.shapes = reinterpret_cast<Shape3*>(take(aligned_bytes<Shape3>(e)));
  a.a = reinterpret_cast<const ElementA**>(take(aligned_bytes<void*>(e)));
  a.b = reinterpret_cast<const ElementB**>(take(aligned_bytes<void*>(e)));
  a.d = reinterpret_cast<ElementD**>(take(aligned_bytes<void*>(e)));
  a.sfa = reinterpret_cast<const float**>(take(aligned_bytes<void*>(e)));
  a.sfb = reinterpret_cast<const float**>(take(aligned_bytes<void*>(e)));
  a.stride_a = reinterpret_cast<StrideA*>(take(aligned_bytes<StrideA>(e)));
  a.stride_b = reinterpret_cast<StrideB*>(take(aligned_bytes<StrideB>(e)));
  a.stride_d = reinterpret_cast<StrideD*>(take(aligned_bytes<StrideD>(e)));
  a.layout_sfa = reinterpret_cast<LayoutSFA*>(take(aligned_bytes<LayoutSFA>(e)));
  a.layout_sfb = reinterpret_cast<LayoutSFB*>(take(aligned_bytes<LayoutSFB>(e)));
  return a;
}

// The kernel's launch facts for a device (SM count, cluster occupancy). Querying them costs host
// time and the answer does not change within a process.
template <typename GemmKernel>
cutlass::KernelHardwareInfo hardware_info(int device) {
  static thread_local int cached_device = -1;
  static thread_local cutlass::KernelHardwareInfo info;
  if (cached_device != device) {
    info = cutlass::KernelHardwareInfo::make_kernel_hardware_info<GemmKernel>(device);
    cached_device = device;
  }
  return info;
}

template <typename Config>
constexpr bool strides_match() {
  using K = typename Config::GemmKernel;
  return std::is_same_v<typename K::InternalStrideA, StrideA> &&
         std::is_same_v<typename K::InternalStrideB, StrideB> &&
         std::is_same_v<typename K::InternalStrideD, StrideD>;
}

}  // namespace octet::cuda::sm90
