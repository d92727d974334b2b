// CUDA GEMMs through cuBLASLt: the row-major D = A B^T of gemm.h in cuBLAS's column-major terms,
// and the re-layout of octet's scale tensors into the ones cuBLASLt reads.
//
// Row-major D (M, N) is column-major D^T (N, M) = B A^T, so cuBLAS sees m = N, n = M, its "A" is
// our B (stored (k x N) column-major = our (N, K) row-major, op T) and its "B" is our A (op N):
// "TN".
//
// Scale layouts. octet stores scale_inv row-major (core/quant_tensor.h): 1x128 as [rows, L]
// (K-major) and 128x128 as [ceil(rows/128), L], L = ceil(K/128); 1x128 may also be MN-major
// (core/scale_layout.h), cuBLASLt's own layout below. cuBLASLt (documentation, "128-element 1D and
// 128x128 2D block scaling for FP8", "Scaling factors layouts") reads
//   VEC128_32F     : one float per (row, K-group), rows contiguous ("M-major" for its A,
//                    "N-major" for its B): element (r, g) at g * ld + r. We use ld = rows rounded
//                    up to 4 (the 16-byte alignment of every K-group's column; the padding holds
//                    1.0).
//   BLK128x128_32F : one float per (row block, K-group), K-groups contiguous with the stride
//                    between row blocks a multiple of 4: element (rb, g) at rb * L4 + g, L4 = L
//                    rounded up to 4.
// so MN-major VEC128 scales (what the dense Linear layers' quantizers write) are used in place,
// K-major ones are transposed (a fallback: one launch per operand per call, for operands quantized
// K-major, e.g. by a caller of gemm_fp8 that kept the default layout, or the grouped GEMM's
// per-expert loop), and BLK128x128 scales re-strided (or used in place when L % 4 == 0).
// SCALAR_32F (one float) and OUTER_VEC_32F (one float per row, contiguous) are octet's layouts as
// is. All of this runs on the context's stream; the scratch tensors are released stream-ordered
// after the matmul.
#include "ops/gemm/gemm_cuda.h"

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "numerics/scale.h"
#include "ops/cast/cast.h"

namespace octet::cuda {
namespace {

constexpr int64_t kScaleAlign = 4;  // floats: 16 bytes

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// out[g * out_ld + r] = in[r * in_ld + g] for r < rows, g < groups; 1.0 for rows <= r < out_ld.
// A kTile x kTile transpose through shared memory, kTile / kRowsPerThread rows of threads.
template <int kTile, int kRowsPerThread>
__global__ void vec128_scales_kernel(const float* __restrict__ in, int64_t in_ld, int64_t rows,
                                     int64_t groups, float* __restrict__ out, int64_t out_ld) {
  static_assert(kTile % kRowsPerThread == 0, "tile rows must split evenly over the thread rows");
  __shared__ float tile[kTile][kTile + 1];  // +1: no bank conflicts on the transposed read
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile,
                g0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int i = threadIdx.y; i < kTile; i += kTile / kRowsPerThread) {
    const int64_t r = r0 + i, g = g0 + threadIdx.x;
    tile[i][threadIdx.x] = (r < rows && g < groups) ? in[r * in_ld + g] : 1.0f;
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kTile / kRowsPerThread) {
    const int64_t g = g0 + i, r = r0 + threadIdx.x;
    if (g < groups && r < out_ld) out[g * out_ld + r] = tile[threadIdx.x][i];
  }
}

// out[rb * out_ld + g] = in[rb * in_ld + g] for g < groups; 1.0 for groups <= g < out_ld.
template <int kThreads>
__global__ void blk128_scales_kernel(const float* __restrict__ in, int64_t in_ld,
                                     int64_t row_blocks, int64_t groups, float* __restrict__ out,
                                     int64_t out_ld) {
  const int64_t n = row_blocks * out_ld;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t rb = i / out_ld, g = i % out_ld;
    out[i] = g < groups ? in[rb * in_ld + g] : 1.0f;
  }
}

struct LtScale {
  cublasLtMatmulMatrixScale_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  const void* ptr = nullptr;
  Tensor scratch;  // keeps a re-laid-out copy alive until the matmul is enqueued
};

LtScale lt_scale(Context& ctx, const OperandView& op) {
  LtScale s;
  s.ptr = op.scale;
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  const int64_t groups = ceil_div(op.k, kGroup);
  switch (op.g) {
    case Granularity::kTensor:
      s.mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
      return s;
    case Granularity::kRow:
      s.mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      return s;
    case Granularity::k1x128: {
      constexpr int kTile = 32, kRowsPerThread = 4;
      s.mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      const int64_t ld = round_up(op.rows, kScaleAlign);
      if (op.s_layout == ScaleLayout::kMNMajor) {  // the quantizer wrote cuBLASLt's layout
        OCTET_CHECK(op.s_ld == ld && reinterpret_cast<uintptr_t>(op.scale) % 16 == 0,
                    "gemm: MN-major 1x128 scales must be a whole operand's [", groups, ", ", ld,
                    "], 16-byte aligned; got a row stride of ", op.s_ld);
        return s;
      }
      // Fallback for K-major scales: the re-layout below, on every call.
      s.scratch = Tensor::empty(ctx, {groups, ld}, DType::kF32);
      const dim3 grid(static_cast<unsigned>(ceil_div(ld, kTile)),
                      static_cast<unsigned>(ceil_div(groups, kTile)));
      vec128_scales_kernel<kTile, kRowsPerThread>
          <<<grid, dim3(kTile, kTile / kRowsPerThread), 0, stream>>>(
              op.scale, op.s_ld, op.rows, groups, s.scratch.data_as<float>(), ld);
      OCTET_CUDA_CHECK_LAUNCH();
      s.ptr = s.scratch.data();
      return s;
    }
    case Granularity::k128x128: {
      constexpr int kThreads = 256;
      s.mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
      const int64_t ld = round_up(groups, kScaleAlign), row_blocks = ceil_div(op.rows, kGroup);
      if (op.s_ld == ld && reinterpret_cast<uintptr_t>(op.scale) % 16 == 0) return s;
      s.scratch = Tensor::empty(ctx, {row_blocks, ld}, DType::kF32);
      const int64_t blocks = std::min<int64_t>(ceil_div(row_blocks * ld, kThreads), 4096);
      blk128_scales_kernel<kThreads>
          <<<static_cast<unsigned>(std::max<int64_t>(blocks, 1)), kThreads, 0, stream>>>(
              op.scale, op.s_ld, row_blocks, groups, s.scratch.data_as<float>(), ld);
      OCTET_CUDA_CHECK_LAUNCH();
      s.ptr = s.scratch.data();
      return s;
    }
    case Granularity::k128x1:
      break;
  }
  OCTET_THROW("gemm: granularity ", granularity_name(op.g), " cannot be a GEMM operand");
}

cudaDataType_t fp8_type(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

}  // namespace

OperandView view_of(const Fp8Operand& op) {
  OperandView v;
  v.data = op.data.data();
  v.rows = op.rows();
  v.k = op.cols();
  v.ld = op.cols();
  v.type = fp8_type(op.format);
  v.g = op.granularity;
  v.scale = op.scale_inv.data_as<const float>();
  v.s_layout = scale_layout(op.granularity, op.scale_inv);
  v.s_ld = v.s_layout == ScaleLayout::kMNMajor
               ? mn_major_ld(op.rows())
               : scale_shape(op.granularity, op.rows(), op.cols()).back();
  return v;
}

OperandView view_of_bf16(const Tensor& t) {
  OperandView v;
  v.data = t.data();
  v.rows = t.rows();
  v.k = t.cols();
  v.ld = t.cols();
  v.type = CUDA_R_16BF;
  return v;
}

namespace {

// cuBLASLt's block-scaled kernels (VEC128 / BLK128x128) need cuBLAS's n, our M, to be a multiple of
// 4 (measured on H100 with cuBLASLt 13.0: the heuristic finds no kernel otherwise). Such a GEMM
// runs on a copy of A padded with zero rows into a padded copy of D, whose first M rows are copied
// back: the price is one copy of A and of D, paid only by odd M (small batches, MoE experts with
// odd counts).
void run_padded_m(Context& ctx, LtMatmul mm, const OperandView& a, const RowMajorOut& d) {
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  const int64_t m4 = round_up(a.rows, kScaleAlign), n = mm.m, esize = dtype_size(d.dtype);
  const size_t row_bytes = static_cast<size_t>(n * esize);
  Tensor ap = Tensor::empty(ctx, {m4, a.k}, DType::kU8);  // FP8: one byte per element
  ctx.be().memset(ap.data_as<uint8_t>() + a.rows * a.k, 0, (m4 - a.rows) * a.k);
  OCTET_CUDA_CHECK(cudaMemcpy2DAsync(
      ap.data(), static_cast<size_t>(a.k), a.data, static_cast<size_t>(a.ld),
      static_cast<size_t>(a.k), static_cast<size_t>(a.rows), cudaMemcpyDeviceToDevice, stream));
  Tensor dp = Tensor::empty(ctx, {m4, n}, d.dtype);
  if (mm.accumulate)
    OCTET_CUDA_CHECK(cudaMemcpy2DAsync(dp.data(), row_bytes, d.p, static_cast<size_t>(d.ld * esize),
                                       row_bytes, static_cast<size_t>(a.rows),
                                       cudaMemcpyDeviceToDevice, stream));
  mm.n = m4;
  mm.b = ap.data();
  mm.ldb = a.k;
  mm.d = dp.data();
  mm.ldd = n;
  run_lt_matmul(ctx, mm);
  OCTET_CUDA_CHECK(cudaMemcpy2DAsync(d.p, static_cast<size_t>(d.ld * esize), dp.data(), row_bytes,
                                     row_bytes, static_cast<size_t>(a.rows),
                                     cudaMemcpyDeviceToDevice, stream));
}

}  // namespace

void matmul(Context& ctx, const OperandView& a, const OperandView& b, const RowMajorOut& d,
            Accumulate acc, Accumulation accumulation) {
  if (a.rows == 0 || b.rows == 0) return;
  const int64_t esize = dtype_size(d.dtype);
  if (a.k == 0) {  // an empty sum: D = 0, or D += 0
    if (acc == Accumulate::kOverwrite)
      OCTET_CUDA_CHECK(cudaMemset2DAsync(
          d.p, static_cast<size_t>(d.ld * esize), 0, static_cast<size_t>(b.rows * esize),
          static_cast<size_t>(a.rows), static_cast<cudaStream_t>(ctx.stream)));
    return;
  }
  LtMatmul mm;
  mm.m = b.rows;
  mm.n = a.rows;
  mm.k = a.k;
  mm.a_type = b.type;
  mm.b_type = a.type;
  mm.d_type = d.dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  mm.a = b.data;
  mm.lda = b.ld;
  mm.b = a.data;
  mm.ldb = a.ld;
  mm.d = d.p;
  mm.ldd = d.ld;
  mm.accumulate = acc == Accumulate::kAdd;
  if (a.type == CUDA_R_16BF) return run_lt_matmul(ctx, mm);
  const LtScale sa = lt_scale(ctx, b), sb = lt_scale(ctx, a);  // cuBLAS's A is our B
  mm.a_mode = sa.mode;
  mm.b_mode = sb.mode;
  mm.a_scale = sa.ptr;
  mm.b_scale = sb.ptr;
  mm.fast_accum = accumulation == Accumulation::kFast;
  const bool block = scales_vary_along_k(a.g) || scales_vary_along_k(b.g);
  if (block && a.rows % kScaleAlign != 0) return run_padded_m(ctx, mm, a, d);
  run_lt_matmul(ctx, mm);
}

void gemm_fp8(Context& ctx, const GemmFp8Args& args) {
  matmul(ctx, view_of(args.a), view_of(args.b), {args.d.data(), args.d.dtype(), args.d.cols()},
         args.accumulate, args.accumulation);
}

void gemm_bf16(Context& ctx, const GemmBf16Args& in) {
  GemmBf16Args args = in;
  // cuBLASLt's tensor-core kernels read an MN-major operand in 16-byte rows: one whose rows are not
  // (M or N not a multiple of 8) runs on a K-major copy instead (odd shapes only; the model's
  // feature dims are multiples of 8).
  if (args.a_layout == OperandLayout::kMNMajor && args.a.cols() % 8 != 0)
    args.a = transpose(ctx, args.a), args.a_layout = OperandLayout::kKMajor;
  if (args.b_layout == OperandLayout::kMNMajor && args.b.cols() % 8 != 0)
    args.b = transpose(ctx, args.b), args.b_layout = OperandLayout::kKMajor;
  const bool a_t = args.a_layout == OperandLayout::kMNMajor,
             b_t = args.b_layout == OperandLayout::kMNMajor;
  if (!a_t && !b_t)
    return matmul(ctx, view_of_bf16(args.a), view_of_bf16(args.b),
                  {args.d.data(), args.d.dtype(), args.d.cols()}, args.accumulate,
                  Accumulation::kPromoted);
  // Row-major D (M, N) is column-major D^T (N x M) = B A^T in cuBLAS's terms: cuBLAS's A is our B,
  // its B our A. Our K-major B (N, K) is column-major (K x N): op T; MN-major (K, N) is (N x K):
  // op N. Our K-major A (M, K) is column-major (K x M): op N; MN-major (K, M) is (M x K): op T.
  const int64_t m = b_t ? args.b.cols() : args.b.rows(), n = a_t ? args.a.cols() : args.a.rows();
  const int64_t k = a_t ? args.a.rows() : args.a.cols();
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (args.accumulate == Accumulate::kOverwrite)
      ctx.be().memset(args.d.data(), 0, args.d.nbytes());
    return;
  }
  LtMatmul mm;
  mm.m = m;
  mm.n = n;
  mm.k = k;
  mm.a_type = mm.b_type = CUDA_R_16BF;
  mm.d_type = args.d.dtype() == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  mm.a = args.b.data();
  mm.lda = args.b.cols();
  mm.a_transposed = !b_t;
  mm.b = args.a.data();
  mm.ldb = args.a.cols();
  mm.b_transposed = a_t;
  mm.d = args.d.data();
  mm.ldd = args.d.cols();
  mm.accumulate = args.accumulate == Accumulate::kAdd;
  run_lt_matmul(ctx, mm);
}

}  // namespace octet::cuda
