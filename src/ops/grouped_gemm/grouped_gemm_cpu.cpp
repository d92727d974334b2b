// CPU reference for grouped_gemm.h: one reference GEMM (ops/gemm/gemm_cpu.h) per expert, on views
// of the decoded operands, so that every expert gets exactly the dense GEMM's numerics.
#include "ops/gemm/gemm_cpu.h"
#include "ops/grouped_gemm/grouped_gemm_backends.h"

namespace octet::cpu {
namespace {

const float kOne = 1.0f;

RefMatrix bf16_matrix(const std::vector<float>& v, const Tensor& t) {
  return {v.data(), t.cols(), t.rows(), t.cols(), Granularity::kTensor, &kOne, 1};
}

// Rows [r0, r0 + rows) of an operand view (its per-row scales move along; 128x128 row blocks must
// start on the view, which the callers guarantee by slicing whole experts).
RefMatrix row_slice(RefMatrix m, int64_t r0, int64_t rows, int64_t scale_rows_offset) {
  m.v += r0 * m.ld;
  m.rows = rows;
  if (m.g == Granularity::kRow || m.g == Granularity::k1x128 || m.g == Granularity::k128x128)
    m.s += scale_rows_offset * m.s_ld;
  return m;
}

// Columns [c0, c0 + k) along K (tokens); c0 is a multiple of 128 for block-scaled views.
RefMatrix k_slice(RefMatrix m, int64_t c0, int64_t k) {
  m.v += c0;
  m.k = k;
  if (scales_vary_along_k(m.g)) m.s += c0 / kGroup;
  return m;
}

// Scale rows of expert e's weights in a stacked operand of E * n rows.
int64_t expert_scale_rows(Granularity g, int64_t e, int64_t n) {
  return g == Granularity::k128x128 ? e * ceil_div(n, kGroup) : e * n;
}

void run_grouped(const RefMatrix& a, const RefMatrix& b, int64_t n, const GroupLayout& l,
                 Accumulate acc, const Tensor& d) {
  const int64_t esize = dtype_size(d.dtype());
  for (int64_t e = 0; e < l.experts(); ++e) {
    if (l.size[e] == 0) continue;
    const RefMatrix ae = row_slice(a, l.offset[e], l.size[e], l.offset[e]);
    const RefMatrix be = row_slice(b, e * n, n, expert_scale_rows(b.g, e, n));
    void* out = static_cast<char*>(d.data()) + l.offset[e] * n * esize;
    reference_gemm(ae, be, AccumulatorEmulation::fp32(), acc, {out, d.dtype(), n});
  }
}

void run_wgrad(const RefMatrix& a, const RefMatrix& b, const GroupLayout& l, Accumulate acc,
               const Tensor& d) {
  const int64_t n = a.rows, k = b.rows, esize = dtype_size(d.dtype());
  for (int64_t e = 0; e < l.experts(); ++e) {
    void* out = static_cast<char*>(d.data()) + e * n * k * esize;
    // An expert without tokens is an empty sum: dW_e = 0, or unchanged with +=.
    reference_gemm(k_slice(a, l.offset[e], l.size[e]), k_slice(b, l.offset[e], l.size[e]),
                   AccumulatorEmulation::fp32(), acc, {out, d.dtype(), k});
  }
}

}  // namespace

void grouped_gemm_fp8(Context&, const GroupedGemmFp8Args& args, const GroupLayout& l) {
  const std::vector<float> av = decode_values(args.a.data), bv = decode_values(args.b.data);
  const int64_t n = args.b.rows() / l.experts();
  RefMatrix b = ref_matrix(bv, args.b);
  b.s_ld = ceil_div(args.b.cols(), kGroup);  // per expert blocks: (E, ceil(N/128), L)
  run_grouped(ref_matrix(av, args.a), b, n, l, args.accumulate, args.d);
}

void grouped_gemm_bf16(Context&, const GroupedGemmBf16Args& args, const GroupLayout& l) {
  const std::vector<float> av = decode_values(args.a), bv = decode_values(args.b);
  run_grouped(bf16_matrix(av, args.a), bf16_matrix(bv, args.b), args.b.rows() / l.experts(), l,
              args.accumulate, args.d);
}

void grouped_wgrad_fp8(Context&, const GroupedWgradFp8Args& args, const GroupLayout& l) {
  const std::vector<float> av = decode_values(args.a.data), bv = decode_values(args.b.data);
  run_wgrad(ref_matrix(av, args.a), ref_matrix(bv, args.b), l, args.accumulate, args.d);
}

void grouped_wgrad_bf16(Context&, const GroupedWgradBf16Args& args, const GroupLayout& l) {
  const std::vector<float> av = decode_values(args.a), bv = decode_values(args.b);
  run_wgrad(bf16_matrix(av, args.a), bf16_matrix(bv, args.b), l, args.accumulate, args.d);
}

}  // namespace octet::cpu
