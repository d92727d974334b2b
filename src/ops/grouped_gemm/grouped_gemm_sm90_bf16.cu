// Hopper grouped BF16 GEMMs for the routed experts of the BF16 sites (the bf16 recipe, and any
// expert site overridden to bf16): Fprop / Dgrad and Wgrad, each one CUTLASS 4.2 launch for all
// experts with FP32 accumulation (the pointer-array warp-specialized cooperative kernel of CUTLASS
// example 57). As in the FP8 kernels beside it, a one-block setup kernel builds the per-expert
// problem shapes, pointers and strides on the device from the row counts: nothing reads them on
// the host, so the layer never synchronises.
//
// Operands as octet lays them out (grouped_gemm.h):
//   Fprop / Dgrad  A (R, K) bf16 row-major, expert e's rows [o_e, o_e + M_e); B stacked (E * N, K)
//                  bf16 row-major (each expert's (N, K) is CUTLASS's column-major K x N, K-major);
//                  D (R, N) bf16 row-major, overwritten, rows past the experts' sum zeroed.
//   Wgrad          dY (R, N) and X (R, K) bf16 as the forward has them (OperandLayout kMNMajor):
//                  expert e's GEMM is M = N, N = K, K = M_e with A = dY_e^T (CUTLASS column-major
//                  M x K: M contiguous, leading dimension N) and B = X_e (N-major, leading
//                  dimension K). Every expert's slice starts at a row, so its base address stays
//                  16-byte aligned whatever the offsets (a K-major slice at token o_e would not).
//                  dW (E, N, K) f32 accumulated (C = D); an expert without tokens is an empty
//                  problem and keeps its dW.
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>

#include <algorithm>

#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/dispatch_policy.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "ops/grouped_gemm/group_span.cuh"
#include "ops/grouped_gemm/grouped_gemm_sm90.h"

namespace octet::cuda {
namespace {

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;
using Bf16 = cutlass::bfloat16_t;
using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;

// D = A B^T per expert (beta = 0, no C) or D += A B^T (C = D), FP32 accumulation.
template <typename LayoutA, typename LayoutB, typename ElementD, typename ElementC>
struct Config {
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignD = 16 / sizeof(ElementD);
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutD*, kAlignD,
      ElementD, LayoutD*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementC>>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA*, 8, Bf16, LayoutB*, 8,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
};

using Fprop = Config<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, Bf16, void>;
using Wgrad = Config<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float, float>;

// The per-expert argument arrays of one launch, carved from one device buffer.
template <typename C, typename ElementD>
struct Arrays {
  Shape3* shapes;
  const Bf16** a;
  const Bf16** b;
  ElementD** d;
  typename C::StrideA* stride_a;
  typename C::StrideB* stride_b;
  typename C::StrideD* stride_d;

  static size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }
  static size_t bytes(int64_t e) {
    const auto n = static_cast<size_t>(e);
    return aligned(n * sizeof(Shape3)) + 3 * aligned(n * sizeof(void*)) +
           aligned(n * sizeof(typename C::StrideA)) + aligned(n * sizeof(typename C::StrideB)) +
           aligned(n * sizeof(typename C::StrideD));
  }
  static Arrays carve(void* base, int64_t e) {
    auto* p = static_cast<char*>(base);
    const auto n = static_cast<size_t>(e);
    auto take = [&](size_t b) {
      char* r = p;
      p += aligned(b);
      return r;
    };
    Arrays a;
    a.shapes = reinterpret_cast<Shape3*>(take(n * sizeof(Shape3)));
    a.a = reinterpret_cast<const Bf16**>(take(n * sizeof(void*)));
    a.b = reinterpret_cast<const Bf16**>(take(n * sizeof(void*)));
    a.d = reinterpret_cast<ElementD**>(take(n * sizeof(void*)));
    a.stride_a = reinterpret_cast<typename C::StrideA*>(take(n * sizeof(typename C::StrideA)));
    a.stride_b = reinterpret_cast<typename C::StrideB*>(take(n * sizeof(typename C::StrideB)));
    a.stride_d = reinterpret_cast<typename C::StrideD*>(take(n * sizeof(typename C::StrideD)));
    return a;
  }
};

struct Setup {
  const void* sizes;  // (E) int32 | int64
  bool sizes_i64;
  int experts, n, k;
  int64_t rows;  // R: rows of A (Fprop) or tokens of dY and X (Wgrad)
  const Bf16* a;
  const Bf16* b;
  void* d;
};

// The per-expert arguments and D's padded tail in one launch: block b writes expert b's arguments
// (and b + gridDim.x, ...), its first row from the counts before it (group_span), then every block
// zeroes its share of D's rows past the experts' sum (kOverwrite's padded tail; n % 8 == 0, so a
// row is whole 16-byte words).
__global__ void fprop_setup_kernel(Setup p, Arrays<Fprop, Bf16> out) {
  auto* d = static_cast<Bf16*>(p.d);
  for (int e = blockIdx.x; e < p.experts; e += gridDim.x) {
    const GroupSpan g = group_span(p.sizes, p.sizes_i64, p.experts, e, p.rows);
    if (threadIdx.x != 0) continue;
    const int m = static_cast<int>(g.rows);
    out.shapes[e] = Shape3{m, p.n, p.k};
    out.a[e] = p.a + g.offset * p.k;
    out.b[e] = p.b + static_cast<int64_t>(e) * p.n * p.k;
    out.d[e] = d + g.offset * p.n;
    out.stride_a[e] = cutlass::make_cute_packed_stride(Fprop::StrideA{}, {m, p.k, 1});
    out.stride_b[e] = cutlass::make_cute_packed_stride(Fprop::StrideB{}, {p.n, p.k, 1});
    out.stride_d[e] = cutlass::make_cute_packed_stride(Fprop::StrideD{}, {m, p.n, 1});
  }
  zero_rows_past(p.d, p.n * 2,
                 group_span(p.sizes, p.sizes_i64, p.experts, p.experts, p.rows).offset, p.rows);
}

// Wgrad, block e for expert e (group_span: its first token and count): M = N (dW rows), N = K (dW
// columns), K = M_e; none: an empty problem.
__global__ void wgrad_setup_kernel(Setup p, Arrays<Wgrad, float> out) {
  const int e = static_cast<int>(blockIdx.x);
  const GroupSpan g = group_span(p.sizes, p.sizes_i64, p.experts, e, p.rows);
  if (threadIdx.x != 0) return;
  const int m = static_cast<int>(g.rows);
  out.shapes[e] = Shape3{m > 0 ? p.n : 0, p.k, m};
  out.a[e] = p.a + g.offset * p.n;  // dY's rows [o_e, o_e + M_e): A = dY_e^T, column-major
  out.b[e] = p.b + g.offset * p.k;  // X's rows: B = X_e, N-major
  out.d[e] = static_cast<float*>(p.d) + static_cast<int64_t>(e) * p.n * p.k;
  out.stride_a[e] = cutlass::make_cute_packed_stride(Wgrad::StrideA{}, {p.n, m, 1});
  out.stride_b[e] = cutlass::make_cute_packed_stride(Wgrad::StrideB{}, {p.k, m, 1});
  out.stride_d[e] = cutlass::make_cute_packed_stride(Wgrad::StrideD{}, {p.n, p.k, 1});
}

template <typename C>
cutlass::KernelHardwareInfo hardware_info(int device) {
  static thread_local int cached_device = -1;
  static thread_local cutlass::KernelHardwareInfo info;
  if (cached_device != device) {
    info = cutlass::KernelHardwareInfo::make_kernel_hardware_info<typename C::Kernel>(device);
    cached_device = device;
  }
  return info;
}

// can_implement, the workspace and the launch, shared by both GEMMs.
template <typename C>
void launch(Context& ctx, const typename C::Gemm::Arguments& arguments, const char* what, int64_t n,
            int64_t k, int64_t experts) {
  typename C::Gemm gemm;
  OCTET_CHECK(gemm.can_implement(arguments) == cutlass::Status::kSuccess, what,
              " (CUTLASS sm90 BF16): cannot implement N = ", n, ", K = ", k, " with ", experts,
              " experts");
  const size_t ws_bytes = C::Gemm::get_workspace_size(arguments);
  Tensor workspace;
  if (ws_bytes > 0) workspace = Tensor::empty(ctx, {static_cast<int64_t>(ws_bytes)}, DType::kU8);
  const cutlass::Status st = gemm.run(arguments, ws_bytes > 0 ? workspace.data() : nullptr,
                                      static_cast<cudaStream_t>(ctx.stream));
  OCTET_CHECK(st == cutlass::Status::kSuccess, what,
              " (CUTLASS sm90 BF16): ", cutlassGetStatusString(st));
  OCTET_CUDA_CHECK_LAUNCH();
}

Setup make_setup(const Tensor& sizes, int64_t n, int64_t k, int64_t rows, const Tensor& a,
                 const Tensor& b, const Tensor& d) {
  Setup s;
  s.sizes = sizes.data();
  s.sizes_i64 = sizes.dtype() == DType::kI64;
  s.experts = static_cast<int>(sizes.numel());
  s.n = static_cast<int>(n);
  s.k = static_cast<int>(k);
  s.rows = rows;
  s.a = a.data_as<const Bf16>();
  s.b = b.data_as<const Bf16>();
  s.d = d.data();
  return s;
}

constexpr int64_t kMaxExperts = 1024;

}  // namespace

bool grouped_gemm_bf16_sm90_supports(const GroupedGemmBf16Args& args) {
  const int64_t k = args.a.cols(), n = args.d.cols();
  return args.a.dtype() == DType::kBF16 && args.b.dtype() == DType::kBF16 &&
         args.d.dtype() == DType::kBF16 && args.accumulate == Accumulate::kOverwrite &&
         k % 8 == 0 && n % 8 == 0 && k > 0 && args.a.rows() > 0 &&
         args.group_sizes.numel() <= kMaxExperts;
}

void grouped_gemm_bf16_sm90(Context& ctx, const GroupedGemmBf16Args& args) {
  const int64_t experts = args.group_sizes.numel(), n = args.d.cols(), k = args.a.cols();
  using A = Arrays<Fprop, Bf16>;
  Tensor arrays = Tensor::empty(ctx, {static_cast<int64_t>(A::bytes(experts))}, DType::kU8);
  const A dev = A::carve(arrays.data(), experts);
  // A block per expert (their arguments), at least a wave of blocks (the padded tail's zeros).
  fprop_setup_kernel<<<static_cast<unsigned>(std::max<int64_t>(experts, 132)), 256, 0,
                       static_cast<cudaStream_t>(ctx.stream)>>>(
      make_setup(args.group_sizes, n, k, args.d.rows(), args.a, args.b, args.d), dev);
  OCTET_CUDA_CHECK_LAUNCH();
  typename Fprop::Gemm::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {static_cast<int>(experts), dev.shapes, nullptr},  // problem shapes on the device only
      {dev.a, dev.stride_a, dev.b, dev.stride_b},
      {{}, nullptr, dev.stride_d, dev.d, dev.stride_d},
      hardware_info<Fprop>(ctx.device_index)};
  arguments.epilogue.thread.alpha = 1.0f;
  arguments.epilogue.thread.beta = 0.0f;
  launch<Fprop>(ctx, arguments, "grouped gemm", n, k, experts);
}

bool grouped_wgrad_bf16_sm90_supports(const GroupedWgradBf16Args& args) {
  if (args.layout != OperandLayout::kMNMajor) return false;
  const int64_t n = args.a.cols(), k = args.b.cols();
  return args.a.dtype() == DType::kBF16 && args.b.dtype() == DType::kBF16 &&
         args.d.dtype() == DType::kF32 && args.accumulate == Accumulate::kAdd && n % 8 == 0 &&
         k % 8 == 0 && n > 0 && k > 0 && args.group_sizes.numel() <= kMaxExperts;
}

void grouped_wgrad_bf16_sm90(Context& ctx, const GroupedWgradBf16Args& args) {
  const int64_t experts = args.group_sizes.numel(), n = args.a.cols(), k = args.b.cols();
  using A = Arrays<Wgrad, float>;
  Tensor arrays = Tensor::empty(ctx, {static_cast<int64_t>(A::bytes(experts))}, DType::kU8);
  const A dev = A::carve(arrays.data(), experts);
  if (experts > 0)
    wgrad_setup_kernel<<<static_cast<unsigned>(experts), 256, 0,
                         static_cast<cudaStream_t>(ctx.stream)>>>(
        make_setup(args.group_sizes, n, k, args.a.rows(), args.a, args.b, args.d), dev);
  OCTET_CUDA_CHECK_LAUNCH();
  typename Wgrad::Gemm::Arguments arguments{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {static_cast<int>(experts), dev.shapes, nullptr},
      {dev.a, dev.stride_a, dev.b, dev.stride_b},
      {{}, const_cast<const float**>(dev.d), dev.stride_d, dev.d, dev.stride_d},
      hardware_info<Wgrad>(ctx.device_index)};
  arguments.epilogue.thread.alpha = 1.0f;
  arguments.epilogue.thread.beta = 1.0f;  // dW += dY^T X
  launch<Wgrad>(ctx, arguments, "grouped wgrad", n, k, experts);
}

}  // namespace octet::cuda
