// Dispatcher for grouped_gemm.h: validates once, routes to the CUTLASS kernels that read the row
// counts on the device, or reads them to the host and routes to cpu:: or cuda::'s per-expert loop.
#include "ops/grouped_gemm/grouped_gemm.h"

#include "backend/backend.h"
#include "backend/dispatch.h"
#include "core/scale_layout.h"
#include "numerics/scale.h"
#include "ops/cast/cast.h"
#include "ops/gemm/gemm_backends.h"
#include "ops/grouped_gemm/grouped_gemm_backends.h"
#if OCTET_WITH_CUTLASS
#include "ops/grouped_gemm/grouped_gemm_sm90.h"
#endif

namespace octet {
namespace {

// The row counts' tensor itself: what both the host-read and the device-read paths need.
void check_group_sizes(const Context& ctx, const Tensor& sizes) {
  check_dtype(sizes, "grouped gemm group_sizes", {DType::kI32, DType::kI64});
  check_device(sizes, "grouped gemm group_sizes", ctx.device);
  OCTET_CHECK(sizes.rank() == 1 && sizes.numel() >= 1,
              "grouped gemm group_sizes: expected shape [E] with E >= 1, got ",
              shape_str(sizes.shape()));
}

// The row counts and their prefix sums on the host: free on the CPU; on CUDA a device-to-host read
// that synchronises the stream (only the per-expert fallback takes it).
GroupLayout read_layout(Context& ctx, const Tensor& sizes, int64_t total_rows, const char* what) {
  check_group_sizes(ctx, sizes);
  const Tensor host = sizes.device() == Device::kCpu ? sizes : sizes.to_host(ctx);
  GroupLayout l;
  int64_t sum = 0;
  for (int64_t e = 0; e < sizes.numel(); ++e) {
    const int64_t m = sizes.dtype() == DType::kI32 ? host.data_as<const int32_t>()[e]
                                                   : host.data_as<const int64_t>()[e];
    OCTET_CHECK(m >= 0, "grouped gemm group_sizes: expert ", e, " has a negative row count ", m);
    l.offset.push_back(sum);
    l.size.push_back(m);
    sum += m;
  }
  // Rows past the experts' sum are the static tail of a padded permute (ops/moe_permute kTo128).
  OCTET_CHECK(sum <= total_rows, "grouped gemm group_sizes: the experts' counts sum to ", sum,
              " but ", what, " has only ", total_rows);
  return l;
}

// Fprop / Dgrad with kOverwrite: D's rows past the experts' sum are set to zero, so the tail of a
// padded layout is defined (the next quantization's amax reads it).
void zero_tail(Context& ctx, const Tensor& d, const GroupLayout& l, Accumulate acc) {
  const int64_t used = l.size.empty() ? 0 : l.offset.back() + l.size.back();
  if (acc != Accumulate::kOverwrite || used >= d.rows()) return;
  const int64_t row_bytes = d.cols() * dtype_size(d.dtype());
  ctx.be().memset(static_cast<char*>(d.data()) + used * row_bytes, 0,
                  (d.rows() - used) * row_bytes);
}

// Experts' weights stacked as E * N rows; returns N.
int64_t per_expert_rows(int64_t rows, int64_t experts, const char* name) {
  OCTET_CHECK(rows % experts == 0, "grouped gemm ", name, ": ", rows, " rows do not split into ",
              experts, " experts' weights of equal shape");
  return rows / experts;
}

void check_stacked_scales(const Fp8Operand& b, int64_t experts, int64_t n) {
  const int64_t groups = ceil_div(b.cols(), kGroup);
  if (b.granularity == Granularity::k1x128) {
    OCTET_CHECK(b.scale_inv.numel() == experts * n * groups,
                "grouped gemm B: 1x128 scale_inv must have ", experts * n, " x ", groups,
                " elements, got ", shape_str(b.scale_inv.shape()));
    return;
  }
  OCTET_CHECK(b.granularity == Granularity::k128x128,
              "grouped gemm B: expected 128x128 (or 1x128) weight scales, got ",
              granularity_name(b.granularity));
  const int64_t want = experts * ceil_div(n, kGroup) * groups;
  OCTET_CHECK(b.scale_inv.numel() == want, "grouped gemm B: 128x128 scale_inv must hold ", experts,
              " x ", ceil_div(n, kGroup), " x ", groups, " blocks (one set per expert), got ",
              shape_str(b.scale_inv.shape()));
  OCTET_CHECK(n % kGroup == 0 || b.scale_inv.rank() == 3, "grouped gemm B: with N = ", n,
              " not a multiple of 128, scale_inv must be rank 3 (E, ceil(N/128), ceil(K/128)) "
              "so that no block straddles two experts; quantize each expert on its own");
}

// FP8 Wgrad slices the token axis of the column-wise copies: the 128-token scale groups must not
// straddle experts.
void check_wgrad_offsets(const GroupLayout& l) {
  for (int64_t e = 0; e < l.experts(); ++e)
    OCTET_CHECK(l.size[e] == 0 || l.offset[e] % kGroup == 0, "grouped wgrad: expert ", e,
                " starts at token ", l.offset[e],
                ", not a multiple of 128; FP8 Wgrad needs each expert's rows padded to 128 (the "
                "1x128 scale groups along tokens must not straddle two experts)");
}

}  // namespace

void grouped_gemm_fp8(Context& ctx, const GroupedGemmFp8Args& args) {
  // The grouped kernels (CUTLASS) and the per-expert loop slice K-major 1x128 scales.
  check_k_major_scales(args.a.granularity, args.a.scale_inv, "grouped gemm A");
  check_k_major_scales(args.b.granularity, args.b.scale_inv, "grouped gemm B");
  check_gemm_operand(args.a, "A", ctx.device);
  check_gemm_operand(args.b, "B", ctx.device, ScaleShapeCheck::kStacked);
  OCTET_CHECK(args.a.granularity == Granularity::k1x128,
              "grouped gemm A: expected 1x128 activations, got ",
              granularity_name(args.a.granularity));
  check_fp8_pairing(args.a, args.b, Accumulation::kPromoted);
  OCTET_CHECK(args.a.cols() == args.b.cols(), "grouped gemm: A has K = ", args.a.cols(),
              " and B has K = ", args.b.cols());
  const int64_t experts = args.group_sizes.numel();
  const int64_t n = per_expert_rows(args.b.rows(), experts, "B");
  check_stacked_scales(args.b, experts, n);
  check_gemm_output(args.d, args.a.rows(), n, args.accumulate, ctx.device);
  if (ctx.device == Device::kCuda && args.a.cols() > 0) check_cuda_fp8_k(args.a.cols());
  if (ctx.device == Device::kCuda) check_cuda_block_output(n, args.d.dtype());
#if OCTET_WITH_CUTLASS
  // The blockwise pairing on Hopper: one CUTLASS launch that reads the row counts on the device.
  if (ctx.device == Device::kCuda && args.a.rows() > 0 && args.a.cols() > 0 &&
      cuda::grouped_gemm_fp8_sm90_supports(args)) {
    check_group_sizes(ctx, args.group_sizes);
    cuda::grouped_gemm_fp8_sm90(ctx, args);
    return;
  }
#endif
  const GroupLayout l = read_layout(ctx, args.group_sizes, args.a.rows(), "A");
  OCTET_DISPATCH(ctx, grouped_gemm_fp8, ctx, args, l);
  zero_tail(ctx, args.d, l, args.accumulate);
}

void grouped_gemm_bf16(Context& ctx, const GroupedGemmBf16Args& args) {
  check_high_precision_operand(args.a, "grouped gemm A", ctx.device);
  check_high_precision_operand(args.b, "grouped gemm B", ctx.device);
  OCTET_CHECK(args.a.cols() == args.b.cols(), "grouped gemm: A has K = ", args.a.cols(),
              " and B has K = ", args.b.cols());
  const int64_t n = per_expert_rows(args.b.rows(), args.group_sizes.numel(), "B");
  check_gemm_output(args.d, args.a.rows(), n, args.accumulate, ctx.device);
#if OCTET_WITH_CUTLASS
  if (ctx.device == Device::kCuda && cuda::grouped_gemm_bf16_sm90_supports(args)) {
    check_group_sizes(ctx, args.group_sizes);
    cuda::grouped_gemm_bf16_sm90(ctx, args);
    return;
  }
#endif
  const GroupLayout l = read_layout(ctx, args.group_sizes, args.a.rows(), "A");
  OCTET_DISPATCH(ctx, grouped_gemm_bf16, ctx, args, l);
  zero_tail(ctx, args.d, l, args.accumulate);
}

void grouped_wgrad_fp8(Context& ctx, const GroupedWgradFp8Args& args) {
  check_k_major_scales(args.a.granularity, args.a.scale_inv, "grouped wgrad A");
  check_k_major_scales(args.b.granularity, args.b.scale_inv, "grouped wgrad B");
  check_gemm_operand(args.a, "A", ctx.device);
  check_gemm_operand(args.b, "B", ctx.device);
  check_fp8_pairing(args.a, args.b, Accumulation::kPromoted);
  OCTET_CHECK(scales_vary_along_k(args.a.granularity) && scales_vary_along_k(args.b.granularity),
              "grouped wgrad: expected 1x128 / 128x128 operands along tokens, got ",
              granularity_name(args.a.granularity), " x ", granularity_name(args.b.granularity));
  OCTET_CHECK(args.a.cols() == args.b.cols(), "grouped wgrad: A has ", args.a.cols(),
              " tokens and B has ", args.b.cols());
  const int64_t experts = args.group_sizes.numel(), n = args.a.rows(), k = args.b.rows();
  OCTET_CHECK(args.d.numel() == experts * n * k && args.d.cols() == k,
              "grouped wgrad D: expected shape [", experts, ", ", n, ", ", k, "], got ",
              shape_str(args.d.shape()));
  check_gemm_output(args.d, experts * n, k, args.accumulate, ctx.device);
#if OCTET_WITH_CUTLASS
  // The blockwise Wgrad pairing on Hopper: one CUTLASS launch that reads the counts on the device
  // (their 128-token alignment is the caller's promise: grouped_gemm.h).
  if (ctx.device == Device::kCuda && cuda::grouped_wgrad_fp8_sm90_supports(args)) {
    check_group_sizes(ctx, args.group_sizes);
    cuda::grouped_wgrad_fp8_sm90(ctx, args);
    return;
  }
#endif
  const GroupLayout l = read_layout(ctx, args.group_sizes, args.a.cols(), "the token axis of A");
  check_wgrad_offsets(l);
  if (ctx.device == Device::kCuda) {
    check_cuda_block_output(k, args.d.dtype());
    for (int64_t e = 0; e < experts; ++e)
      OCTET_CHECK(l.size[e] % 16 == 0, "grouped wgrad on CUDA: expert ", e, " has ", l.size[e],
                  " tokens; FP8 Wgrad needs multiples of 16 "
                  "(K of each expert's GEMM: cuBLASLt reads 16-byte vectors); "
                  "pad the expert's rows");
    OCTET_CHECK(
        args.a.cols() % 16 == 0, "grouped wgrad on CUDA: the token count ", args.a.cols(),
        " must be a multiple of 16 (the row stride of the column-wise copies, 16-byte aligned)");
  }
  OCTET_DISPATCH(ctx, grouped_wgrad_fp8, ctx, args, l);
}

bool grouped_fp8_blockwise_counts_on_device(const Context& ctx) {
  return OCTET_WITH_CUTLASS && ctx.device == Device::kCuda;
}

bool grouped_wgrad_fp8_overwrites(const Context& ctx, const GroupedWgradFp8Args& args) {
  if (ctx.device == Device::kCpu) return true;
#if OCTET_WITH_CUTLASS
  GroupedWgradFp8Args a = args;
  a.accumulate = Accumulate::kOverwrite;
  return cuda::grouped_wgrad_fp8_sm90_supports(a);
#else
  return false;
#endif
}

bool grouped_bf16_counts_on_device(const Context& ctx) {
  return OCTET_WITH_CUTLASS && ctx.device == Device::kCuda;
}

void grouped_wgrad_bf16(Context& ctx, const GroupedWgradBf16Args& args) {
  check_high_precision_operand(args.a, "grouped wgrad A", ctx.device);
  check_high_precision_operand(args.b, "grouped wgrad B", ctx.device);
  const bool mn = args.layout == OperandLayout::kMNMajor;
  const int64_t tokens_a = mn ? args.a.rows() : args.a.cols(),
                tokens_b = mn ? args.b.rows() : args.b.cols();
  OCTET_CHECK(tokens_a == tokens_b, "grouped wgrad: A has ", tokens_a, " tokens and B has ",
              tokens_b);
  const int64_t experts = args.group_sizes.numel(), n = mn ? args.a.cols() : args.a.rows(),
                k = mn ? args.b.cols() : args.b.rows();
  OCTET_CHECK(args.d.numel() == experts * n * k && args.d.cols() == k,
              "grouped wgrad D: expected shape [", experts, ", ", n, ", ", k, "], got ",
              shape_str(args.d.shape()));
  check_gemm_output(args.d, experts * n, k, args.accumulate, ctx.device);
#if OCTET_WITH_CUTLASS
  if (ctx.device == Device::kCuda && cuda::grouped_wgrad_bf16_sm90_supports(args)) {
    check_group_sizes(ctx, args.group_sizes);
    cuda::grouped_wgrad_bf16_sm90(ctx, args);
    return;
  }
#endif
  const GroupLayout l = read_layout(ctx, args.group_sizes, tokens_a, "the token axis of A");
  if (!mn) {
    OCTET_DISPATCH(ctx, grouped_wgrad_bf16, ctx, args, l);
    return;
  }
  GroupedWgradBf16Args kmajor = args;  // the per-expert paths read K-major operands
  kmajor.a = transpose(ctx, args.a);
  kmajor.b = transpose(ctx, args.b);
  kmajor.layout = OperandLayout::kKMajor;
  OCTET_DISPATCH(ctx, grouped_wgrad_bf16, ctx, kmajor, l);
}

}  // namespace octet
