// CUDA launchers of the moe_permute family (device code in moe_permute_kernels.cuh). The map is a
// stable radix sort of the assignments by expert id (CUB, from CCCL): equal ids keep the order of
// the assignment index t k + j, i.e. ascending tokens. Everything is enqueued on the context's
// stream; nothing synchronises with the host.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "ops/moe_permute/moe_permute_backends.h"
#include "ops/moe_permute/moe_permute_kernels.cuh"
#include "ops/moe_permute/moe_permute_transpose_kernels.cuh"
#include "ops/moe_permute/moe_row_weight.h"
#include "ops/quantize/quantize_backends.h"

namespace octet::cuda {
namespace {

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(n, threads), 1, 0x7FFFFFFF));
}

// Grid for one-block-per-row kernels that loop over rows: enough blocks to fill the GPU many times.
unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, 1 << 20));
}

// gather_rows_kernel: a thread per element, at most 2^16 blocks (the kernel strides beyond).
constexpr int kGatherThreads = 256;
unsigned gather_blocks(int64_t elems) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(elems, kGatherThreads), 1, 1 << 16));
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

int end_bit_for(int64_t experts) {
  int bits = 1;
  while ((int64_t{1} << bits) <= experts) ++bits;  // keys go up to E (the invalid marker)
  return bits;
}

// Streaming multiprocessors of the context's device: grids of the kernels that stride over tokens
// and reduce per block are sized to fill it a few times over.
int sm_count(const Context& ctx) {
  int sms = 0;
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device_index));
  return std::max(sms, 1);
}

// The 16-byte path of load8/store8: every row a multiple of 8 elements, every base 16-byte aligned.
bool vec8(int64_t cols, std::initializer_list<const void*> ptrs) {
  if (cols % 8 != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

// Blocks of `warps` warps that give one warp to each 32 permuted rows (for_padding_rows).
int64_t padding_blocks(int64_t rows, int warps) {
  return ceil_div(rows, int64_t{32} * warps);
}

unsigned grid_of(int64_t blocks) {
  OCTET_CHECK(blocks <= 0x7FFFFFFF, "permute: a grid of ", blocks, " blocks exceeds the limit");
  return static_cast<unsigned>(std::max<int64_t>(blocks, 1));
}

template <typename InT, typename OutT>
void launch_weighted_gather(Context& ctx, const PermuteMap& m, const Tensor& src, const float* w,
                            Tensor& out, const float* d_rows, float* d_topk, const Tensor& add0,
                            const Tensor& add1) {
  const int64_t cols = src.cols();
  const auto* s = src.data_as<const InT>();
  auto* o = out.data_as<OutT>();
  const auto* a0 = add0.data() != nullptr ? add0.data_as<const OutT>() : nullptr;
  const auto* a1 = add1.data() != nullptr ? add1.data_as<const OutT>() : nullptr;
  const unsigned grid = row_blocks(m.num_tokens);
  // 8 columns per thread; at most 128 threads, fewer for narrow rows.
  const int threads = static_cast<int>(
      std::clamp<int64_t>(ceil_div(ceil_div(cols, 8), 32) * 32, 32, kernels::kRowThreads));
  const int32_t* row_of = m.row_of.data_as<const int32_t>();
  const int k = static_cast<int>(m.top_k);
  if (vec8(cols, {s, o, a0, a1})) {
    kernels::weighted_gather_kernel<InT, OutT, true><<<grid, threads, 0, stream_of(ctx)>>>(
        s, w, row_of, m.num_tokens, k, cols, o, d_rows, d_topk, a0, a1);
  } else {
    kernels::weighted_gather_kernel<InT, OutT, false><<<grid, threads, 0, stream_of(ctx)>>>(
        s, w, row_of, m.num_tokens, k, cols, o, d_rows, d_topk, a0, a1);
  }
  OCTET_CUDA_CHECK_LAUNCH();
}

template <typename DyT, typename OutT, typename XT>
void launch_combine_backward(Context& ctx, const PermuteMap& m, const CombineBackwardArgs& a,
                             CombineGrads& g) {
  const int64_t cols = a.expert_out.cols();
  const cudaStream_t st = stream_of(ctx);
  const auto* dy = a.d_out.data_as<const DyT>();
  const auto* x = a.expert_out.data_as<const XT>();
  auto* dx = g.d_expert_out.data_as<OutT>();
  const unsigned grid = grid_of(m.num_tokens + padding_blocks(m.num_rows, kernels::kCombineWarps));
  auto go = [&](auto vec) {
    kernels::combine_backward_kernel<DyT, XT, OutT, decltype(vec)::value>
        <<<grid, 32 * kernels::kCombineWarps, 0, st>>>(
            dy, x, a.topk_weight.data_as<const float>(), m.row_of.data_as<const int32_t>(),
            m.token_of.data_as<const int32_t>(), m.num_tokens, static_cast<int>(m.top_k),
            m.num_rows, cols, dx, g.d_topk_weight.data_as<float>());
  };
  if (vec8(cols, {dy, x, dx}))
    go(std::true_type{});
  else
    go(std::false_type{});
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace

void moe_permute_map(Context& ctx, const PermuteMapArgs& args, PermuteMap& m) {
  const cudaStream_t st = stream_of(ctx);
  const int64_t n = m.num_tokens * m.top_k;
  const int E = static_cast<int>(m.num_experts);
  ctx.be().memset(m.counts.data(), 0, m.counts.nbytes());
  ctx.be().memset_ranges(
      {{m.row_of.data(), m.row_of.nbytes()}, {m.token_of.data(), m.token_of.nbytes()}},
      0xFF);  // -1: no row, no token
  Tensor keys = Tensor::empty(ctx, {2, std::max<int64_t>(n, 1)}, DType::kI32);
  Tensor vals = Tensor::empty(ctx, {2, std::max<int64_t>(n, 1)}, DType::kI32);
  auto* keys_in = keys.data_as<uint32_t>();
  auto* keys_out = keys_in + std::max<int64_t>(n, 1);
  auto* vals_in = vals.data_as<int32_t>();
  auto* vals_out = vals_in + std::max<int64_t>(n, 1);
  if (n > 0) {
    const size_t hist = E <= kernels::kSharedHist ? sizeof(int32_t) * static_cast<size_t>(E) : 0;
    const unsigned grid = std::min<unsigned>(blocks_for(n, 256), 4u * sm_count(ctx));
    kernels::permute_keys_kernel<<<grid, 256, hist, st>>>(args.topk_idx.data_as<const int32_t>(), n,
                                                          E, keys_in, vals_in,
                                                          m.counts.data_as<int32_t>());
    OCTET_CUDA_CHECK_LAUNCH();
  }
  Tensor sorted_start = Tensor::empty(ctx, {m.num_experts}, DType::kI32);
  kernels::permute_offsets_kernel<<<1, 1024, 0, st>>>(
      m.counts.data_as<const int32_t>(), E, m.padding == PermutePadding::kTo128,
      m.group_sizes.data_as<int32_t>(), m.offsets.data_as<int32_t>(),
      sorted_start.data_as<int32_t>());
  OCTET_CUDA_CHECK_LAUNCH();
  if (n == 0) return;
  const int end_bit = end_bit_for(m.num_experts);
  size_t temp_bytes = 0;
  OCTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, vals_in,
                                                   vals_out, static_cast<int>(n), 0, end_bit, st));
  Tensor temp =
      Tensor::empty(ctx, {static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, DType::kU8);
  OCTET_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), temp_bytes, keys_in, keys_out,
                                                   vals_in, vals_out, static_cast<int>(n), 0,
                                                   end_bit, st));
  kernels::permute_rows_kernel<<<blocks_for(n, 256), 256, 0, st>>>(
      keys_out, vals_out, n, E, static_cast<int>(m.top_k), m.offsets.data_as<const int32_t>(),
      sorted_start.data_as<const int32_t>(), m.row_of.data_as<int32_t>(),
      m.token_of.data_as<int32_t>());
  OCTET_CUDA_CHECK_LAUNCH();
}

void moe_gather_rows(Context& ctx, const PermuteMap& m, const Tensor& src, int64_t row_bytes,
                     uint32_t fill_word, Tensor& out) {
  if (m.num_rows == 0 || row_bytes == 0) return;
  const cudaStream_t st = stream_of(ctx);
  if (row_bytes % 16 == 0 && aligned16(src.data()) && aligned16(out.data())) {
    kernels::gather_rows_kernel<uint4>
        <<<gather_blocks(m.num_rows * (row_bytes / 16)), kGatherThreads, 0, st>>>(
            static_cast<const uint4*>(src.data()), m.token_of.data_as<const int32_t>(), m.num_rows,
            row_bytes / 16, fill_word, static_cast<uint4*>(out.data()));
  } else {
    kernels::gather_rows_kernel<uint8_t>
        <<<gather_blocks(m.num_rows * row_bytes), kGatherThreads, 0, st>>>(
            static_cast<const uint8_t*>(src.data()), m.token_of.data_as<const int32_t>(),
            m.num_rows, row_bytes, fill_word, static_cast<uint8_t*>(out.data()));
  }
  OCTET_CUDA_CHECK_LAUNCH();
}

void moe_weighted_gather(Context& ctx, const PermuteMap& m, const Tensor& src, const Tensor& weight,
                         Tensor& out, const Tensor& d_rows, Tensor& d_topk, const Tensor& add0,
                         const Tensor& add1) {
  if (m.num_tokens == 0) return;
  const float* dr = d_rows.defined() ? d_rows.data_as<const float>() : nullptr;
  float* dt = d_rows.defined() ? d_topk.data_as<float>() : nullptr;
  if (src.cols() == 0) {  // no columns to gather: the weights' gradient alone
    if (dr != nullptr) moe_permute_weights_backward(ctx, m, d_rows, d_topk);
    return;
  }
  const float* w = weight.data() ? weight.data_as<const float>() : nullptr;
  const bool in_f32 = src.dtype() == DType::kF32, out_f32 = out.dtype() == DType::kF32;
  if (in_f32 && out_f32)
    launch_weighted_gather<float, float>(ctx, m, src, w, out, dr, dt, add0, add1);
  else if (in_f32)
    launch_weighted_gather<float, uint16_t>(ctx, m, src, w, out, dr, dt, add0, add1);
  else if (out_f32)
    launch_weighted_gather<uint16_t, float>(ctx, m, src, w, out, dr, dt, add0, add1);
  else
    launch_weighted_gather<uint16_t, uint16_t>(ctx, m, src, w, out, dr, dt, add0, add1);
}

void moe_combine_backward(Context& ctx, const PermuteMap& m, const CombineBackwardArgs& a,
                          CombineGrads& g) {
  if (a.expert_out.cols() == 0) {
    ctx.be().memset(g.d_topk_weight.data(), 0, g.d_topk_weight.nbytes());
    return;
  }
  const bool dy32 = a.d_out.dtype() == DType::kF32, out32 = g.d_expert_out.dtype() == DType::kF32;
  const bool x32 = a.expert_out.dtype() == DType::kF32;
  // Eight instantiations: d_out, d_expert_out and expert_out each bf16 or f32.
  auto go = [&](auto dy, auto out) {
    using DyT = decltype(dy);
    using OutT = decltype(out);
    if (x32)
      launch_combine_backward<DyT, OutT, float>(ctx, m, a, g);
    else
      launch_combine_backward<DyT, OutT, uint16_t>(ctx, m, a, g);
  };
  if (dy32 && out32)
    go(float{}, float{});
  else if (dy32)
    go(float{}, uint16_t{});
  else if (out32)
    go(uint16_t{}, float{});
  else
    go(uint16_t{}, uint16_t{});
}

void moe_permute_quantize(Context& ctx, const PermuteMap& m, const QuantizeArgs& args,
                          QuantTensor& out, QuantTensor* rows_out, const Tensor& topk_weight,
                          Tensor& w_rows) {
  const float* tw = topk_weight.defined() ? topk_weight.data_as<const float>() : nullptr;
  float* wr = topk_weight.defined() ? w_rows.data_as<float>() : nullptr;
  const int64_t cols = args.input.cols();
  uint32_t* amax_bits = zeroed_amax_bits(ctx, out);  // null: not wanted (args.amax)
  const ScaleRule rule{args.format, args.rounding, args.epsilon, 0};
  auto* q = out.data.data_as<uint8_t>();
  auto* s = out.scale_inv.data_as<float>();
  uint8_t* tq = rows_out != nullptr ? rows_out->data.data_as<uint8_t>() : nullptr;
  float* ts = rows_out != nullptr ? rows_out->scale_inv.data_as<float>() : nullptr;
  if (cols == 0) {  // no payload: the weights alone
    if (tw != nullptr) moe_permute_weights(ctx, m, topk_weight, w_rows);
    return;
  }
  // Token blocks (a few per SM, each striding over the tokens), then the padding rows' blocks.
  const int64_t main_blocks = std::min<int64_t>(m.num_tokens, int64_t{16} * sm_count(ctx));
  const unsigned grid = grid_of(main_blocks + padding_blocks(m.num_rows, kernels::kQuantWarps));
  if (m.num_tokens == 0 && m.num_rows == 0) return;
  const int32_t* row_of = m.row_of.data_as<const int32_t>();
  const int32_t* token_of = m.token_of.data_as<const int32_t>();
  const int k = static_cast<int>(m.top_k);
  auto go = [&](const auto* x) {
    using InT = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
    // The 16-byte path also needs the FP8 rows 8-byte aligned: cols % 8 == 0 and a 16-byte base.
    if (vec8(cols, {x, q, tq}))
      kernels::permute_quantize_kernel<InT, true>
          <<<grid, 32 * kernels::kQuantWarps, 0, stream_of(ctx)>>>(
              x, row_of, token_of, m.num_tokens, k, m.num_rows, cols,
              static_cast<unsigned>(main_blocks), rule, q, s, amax_bits, tq, ts, tw, wr);
    else
      kernels::permute_quantize_kernel<InT, false>
          <<<grid, 32 * kernels::kQuantWarps, 0, stream_of(ctx)>>>(
              x, row_of, token_of, m.num_tokens, k, m.num_rows, cols,
              static_cast<unsigned>(main_blocks), rule, q, s, amax_bits, tq, ts, tw, wr);
  };
  if (args.input.dtype() == DType::kF32)
    go(args.input.data_as<const float>());
  else
    go(args.input.data_as<const uint16_t>());
  OCTET_CUDA_CHECK_LAUNCH();
}

// The transpose kernel reads each output row from its token's row (ops/quantize).
void moe_permute_transposed(Context& ctx, const PermuteMap& m, const QuantTensor& x, Tensor& cdata,
                            Tensor& cscale, Granularity columnwise) {
  scaling_aware_transpose_gathered(ctx, x, m.token_of, cdata, cscale, columnwise);
}

// One block per 128x128 tile of the permuted rows (moe_permute_transpose_kernels.cuh) when the
// input is BF16 with 16-byte rows and R % 16 == 0; otherwise the two passes it fuses: the dispatch
// keeping the token rows, then their gathered transpose (the CPU's reference).
void moe_permute_quantize_transposed(Context& ctx, const PermuteMap& m, const QuantizeArgs& args,
                                     QuantTensor& out, Granularity columnwise) {
  const int64_t cols = args.input.cols(), rows = m.num_rows;
  auto* q = out.data.data_as<uint8_t>();
  auto* cq = out.columnwise_data.data_as<uint8_t>();
  const bool fused = args.input.dtype() == DType::kBF16 && cols % 16 == 0 && rows % 16 == 0 &&
                     aligned16(args.input.data()) && aligned16(q) && aligned16(cq);
  if (!fused) {
    QuantTensor token_rows = out;
    token_rows.data = Tensor::empty(ctx, {m.num_tokens, cols}, out.data.dtype());
    token_rows.scale_inv = Tensor::empty(ctx, {m.num_tokens, ceil_div(cols, kGroup)}, DType::kF32);
    Tensor no_weights;
    moe_permute_quantize(ctx, m, args, out, &token_rows, Tensor(), no_weights);
    if (rows > 0 && cols > 0)
      moe_permute_transposed(ctx, m, token_rows, out.columnwise_data, out.columnwise_scale_inv,
                             columnwise);
    return;
  }
  uint32_t* amax_bits = zeroed_amax_bits(ctx, out);  // null: not wanted (args.amax)
  const int64_t cblocks = ceil_div(cols, kGroup), rblocks = ceil_div(rows, kGroup);
  if (cblocks == 0) return;
  // Past the tiles, enough blocks for a thread per token (the amax of tokens dispatched nowhere).
  const int64_t extra = ceil_div(ceil_div(m.num_tokens, kernels::kTileThreads), cblocks);
  if (rblocks + extra == 0) return;
  OCTET_CHECK(rblocks + extra < 65536, "permute quantize transposed: ", rows,
              " rows exceed the grid limit");
  const dim3 grid(static_cast<unsigned>(cblocks), static_cast<unsigned>(rblocks + extra));
  const ScaleRule rule{args.format, args.rounding, args.epsilon, 0};
  auto launch = [&](auto kernel) {
    kernel<<<grid, kernels::kTileThreads, 0, stream_of(ctx)>>>(
        args.input.data_as<const uint16_t>(), m.token_of.data_as<const int32_t>(),
        m.row_of.data_as<const int32_t>(), m.num_tokens, static_cast<int>(m.top_k), rows, cols,
        rule, q, out.scale_inv.data_as<float>(), amax_bits, cq,
        out.columnwise_scale_inv.data_as<float>(), columnwise == Granularity::k1x128);
  };
  if (args.format == Fp8Format::kE4M3)
    launch(kernels::permute_quantize_transpose_kernel<Fp8Format::kE4M3>);
  else
    launch(kernels::permute_quantize_transpose_kernel<Fp8Format::kE5M2>);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet::cuda
