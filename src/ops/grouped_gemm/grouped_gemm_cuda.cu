// CUDA grouped GEMMs, first version: one cuBLASLt GEMM per expert (ops/gemm/gemm_cuda.h) on views
// of the contiguous layout, with the host copy of the row counts grouped_gemm.cpp read. Plans are
// cached per (shape, alignment), so a training step with the same routing reuses them; the kernel
// launches per expert are the cost a fused grouped kernel removes.
#include "ops/gemm/gemm_cuda.h"
#include "ops/grouped_gemm/grouped_gemm_backends.h"

namespace octet::cuda {
namespace {

const char* byte_ptr(const void* p) {
  return static_cast<const char*>(p);
}

int64_t elem_size(cudaDataType_t t) {
  return t == CUDA_R_16BF ? 2 : 1;
}

// Rows [r0, r0 + rows) of a view; `scale_row0` is the first scale row of the slice.
OperandView row_slice(OperandView v, int64_t r0, int64_t rows, int64_t scale_row0) {
  v.data = byte_ptr(v.data) + r0 * v.ld * elem_size(v.type);
  v.rows = rows;
  if (v.g == Granularity::kRow || scales_vary_along_k(v.g)) v.scale += scale_row0 * v.s_ld;
  return v;
}

// K range [c0, c0 + k) of a view (c0 a multiple of 128 for block-scaled views).
OperandView k_slice(OperandView v, int64_t c0, int64_t k) {
  v.data = byte_ptr(v.data) + c0 * elem_size(v.type);
  v.k = k;
  if (scales_vary_along_k(v.g)) v.scale += c0 / kGroup;
  return v;
}

int64_t expert_scale_rows(Granularity g, int64_t e, int64_t n) {
  return g == Granularity::k128x128 ? e * ceil_div(n, kGroup) : e * n;
}

void run_grouped(Context& ctx, const OperandView& a, OperandView b, int64_t n, const GroupLayout& l,
                 Accumulate acc, const Tensor& d) {
  b.s_ld = ceil_div(b.k, kGroup);  // stacked per-expert scales: (E, ceil(N/128) or N, L)
  const int64_t esize = dtype_size(d.dtype());
  for (int64_t e = 0; e < l.experts(); ++e) {
    if (l.size[e] == 0) continue;
    void* out = static_cast<char*>(d.data()) + l.offset[e] * n * esize;
    matmul(ctx, row_slice(a, l.offset[e], l.size[e], l.offset[e]),
           row_slice(b, e * n, n, expert_scale_rows(b.g, e, n)), {out, d.dtype(), n}, acc,
           Accumulation::kPromoted);
  }
}

void run_wgrad(Context& ctx, const OperandView& a, const OperandView& b, const GroupLayout& l,
               Accumulate acc, const Tensor& d) {
  const int64_t n = a.rows, k = b.rows, esize = dtype_size(d.dtype());
  for (int64_t e = 0; e < l.experts(); ++e) {
    void* out = static_cast<char*>(d.data()) + e * n * k * esize;
    // An expert without tokens is an empty sum: matmul() writes dW_e = 0, or leaves it with +=.
    matmul(ctx, k_slice(a, l.offset[e], l.size[e]), k_slice(b, l.offset[e], l.size[e]),
           {out, d.dtype(), k}, acc, Accumulation::kPromoted);
  }
}

}  // namespace

void grouped_gemm_fp8(Context& ctx, const GroupedGemmFp8Args& args, const GroupLayout& l) {
  run_grouped(ctx, view_of(args.a), view_of(args.b), args.b.rows() / l.experts(), l,
              args.accumulate, args.d);
}

void grouped_gemm_bf16(Context& ctx, const GroupedGemmBf16Args& args, const GroupLayout& l) {
  run_grouped(ctx, view_of_bf16(args.a), view_of_bf16(args.b), args.b.rows() / l.experts(), l,
              args.accumulate, args.d);
}

void grouped_wgrad_fp8(Context& ctx, const GroupedWgradFp8Args& args, const GroupLayout& l) {
  run_wgrad(ctx, view_of(args.a), view_of(args.b), l, args.accumulate, args.d);
}

void grouped_wgrad_bf16(Context& ctx, const GroupedWgradBf16Args& args, const GroupLayout& l) {
  run_wgrad(ctx, view_of_bf16(args.a), view_of_bf16(args.b), l, args.accumulate, args.d);
}

}  // namespace octet::cuda
