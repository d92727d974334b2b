// CUDA launchers of the quantize family (device code in quantize_kernels.cuh). Arguments were
// validated and outputs allocated by quantize.cpp; everything is enqueued on the context's stream,
// nothing here synchronises with the host.
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "ops/quantize/quantize_backends.h"
#include "ops/quantize/quantize_bf16_tile_kernels.cuh"
#include "ops/quantize/quantize_kernels.cuh"

namespace octet::cuda {
namespace {

using kernels::ScaleSource;
using kernels::TileOutput;
using kernels::TileParams;

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Blocks for a persistent grid-stride kernel: as many as the SMs hold at once (more would run as a
// second, partial wave and leave SMs idle at the end), never more than there is work for.
template <typename Kernel>
int persistent_blocks(const Context& ctx, Kernel kernel, int threads, int64_t work_blocks) {
  int per_sm = 0;
  OCTET_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  int sms = 0;
  OCTET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device_index));
  const int64_t resident = int64_t{sms} * std::max(per_sm, 1);
  return static_cast<int>(std::max<int64_t>(1, std::min(work_blocks, resident)));
}

ScaleSource rowwise_source(Granularity g) {
  switch (g) {
    case Granularity::kTensor:
      return ScaleSource::kGlobalScalar;
    case Granularity::kRow:
      return ScaleSource::kGlobalPerRow;
    case Granularity::k1x128:
      return ScaleSource::kRowInTile;
    case Granularity::k128x1:
      return ScaleSource::kColInTile;
    case Granularity::k128x128:
      return ScaleSource::kTile;
  }
  return ScaleSource::kTile;
}

// The same granularity applied to the transpose: row and column roles swap.
ScaleSource columnwise_source(Granularity g) {
  switch (g) {
    case Granularity::kTensor:
      return ScaleSource::kGlobalScalar;
    case Granularity::kRow:
      return ScaleSource::kGlobalPerCol;
    case Granularity::k1x128:
      return ScaleSource::kColInTile;
    case Granularity::k128x1:
      return ScaleSource::kRowInTile;
    case Granularity::k128x128:
      return ScaleSource::kTile;
  }
  return ScaleSource::kTile;
}

// The deepseek recipe's x and dy: BF16, 1x128, with the column-wise copy. Returns false (nothing
// launched) when the shape or alignment needs the general tile kernel.
bool launch_bf16_1x128_tile(Context& ctx, const QuantizeArgs& args, QuantTensor& out,
                            const ScaleRule& rule) {
  const int64_t rows = args.input.rows(), cols = args.input.cols();
  const bool rowwise = args.output == QuantizeOutput::kBoth;
  if (args.granularity != Granularity::k1x128 || args.output == QuantizeOutput::kRowwise ||
      args.scale.defined() || cols % 8 != 0 || rows % 16 != 0 || !aligned16(args.input.data()) ||
      !aligned16(out.columnwise_data.data()) ||
      (rowwise && reinterpret_cast<uintptr_t>(out.data.data()) % 8 != 0))
    return false;
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kGroup)),
                  static_cast<unsigned>(ceil_div(rows, kGroup)));
  if (grid.y >= 65536) return false;  // the general path reports it
  auto launch = [&](auto kernel) {
    kernel<<<grid, kernels::kTileThreads, 0, stream_of(ctx)>>>(
        args.input.data_as<const uint16_t>(), rows, cols, rule,
        rowwise ? out.data.data_as<uint8_t>() : nullptr,
        rowwise ? out.scale_inv.data_as<float>() : nullptr, out.columnwise_data.data_as<uint8_t>(),
        out.columnwise_scale_inv.data_as<float>(), args.scale_layout,
        out.amax.defined() ? out.amax.data_as<uint32_t>() : nullptr);
  };
  const bool e4m3 = args.format == Fp8Format::kE4M3;
  if (rowwise)
    launch(e4m3 ? kernels::quantize_bf16_1x128_tile_kernel<Fp8Format::kE4M3, true>
                : kernels::quantize_bf16_1x128_tile_kernel<Fp8Format::kE5M2, true>);
  else
    launch(e4m3 ? kernels::quantize_bf16_1x128_tile_kernel<Fp8Format::kE4M3, false>
                : kernels::quantize_bf16_1x128_tile_kernel<Fp8Format::kE5M2, false>);
  OCTET_CUDA_CHECK_LAUNCH();
  return true;
}

template <typename InT>
void launch_quantize(Context& ctx, const QuantizeArgs& args, QuantTensor& out) {
  const InT* in = args.input.data_as<const InT>();
  const int64_t rows = args.input.rows(), cols = args.input.cols();
  const cudaStream_t st = stream_of(ctx);
  const ScaleRule rule{
      .format = args.format, .rounding = args.rounding, .epsilon = args.epsilon, .margin = 0};
  uint32_t* amax_bits = zeroed_amax_bits(ctx, out);  // null: not wanted (QuantizeArgs::amax)

  // The hot path: 1x128 row-wise only, a streaming kernel at memory bandwidth.
  if (args.output == QuantizeOutput::kRowwise && args.granularity == Granularity::k1x128) {
    const int64_t work = ceil_div(rows * ceil_div(cols, kGroup), 16);
    auto launch = [&](auto kernel) {
      kernel<<<persistent_blocks(ctx, kernel, 256, work), 256, 0, st>>>(
          in, rows, cols, rule, out.data.data_as<uint8_t>(), out.scale_inv.data_as<float>(),
          args.scale_layout, amax_bits);
    };
    if (cols % 8 == 0 && aligned16(in))
      launch(kernels::quantize_1x128_kernel<InT, 8>);
    else
      launch(kernels::quantize_1x128_kernel<InT, 1>);
    OCTET_CUDA_CHECK_LAUNCH();
    return;
  }

  if constexpr (sizeof(InT) == 2) {
    if (launch_bf16_1x128_tile(ctx, args, out, rule)) return;
  }

  TileParams p;
  p.rows = rows;
  p.cols = cols;
  p.rule = rule;
  p.amax_out = amax_bits;
  p.aligned_input = reinterpret_cast<uintptr_t>(in) % (4 * sizeof(InT)) == 0;
  if (args.output != QuantizeOutput::kColumnwise)
    p.rowwise = TileOutput{out.data.data_as<uint8_t>(), out.scale_inv.data_as<float>(),
                           rowwise_source(args.granularity), args.granularity, args.scale_layout};
  if (args.output != QuantizeOutput::kRowwise)
    p.columnwise = TileOutput{
        out.columnwise_data.data_as<uint8_t>(), out.columnwise_scale_inv.data_as<float>(),
        columnwise_source(args.granularity), args.granularity, args.scale_layout};

  // Scale sources that span more than a tile need a reduction pass first.
  Tensor scratch;
  if (args.granularity == Granularity::kTensor) {
    if (args.scale.defined()) {
      p.given_scale = args.scale.data_as<const float>();
    } else {
      const int blocks =
          persistent_blocks(ctx, kernels::amax_kernel<InT>, 256, ceil_div(rows * cols, 256));
      kernels::amax_kernel<InT><<<blocks, 256, 0, st>>>(in, rows * cols, amax_bits);
      OCTET_CUDA_CHECK_LAUNCH();
      p.global_amax =
          amax_bits;  // final before the tile kernel: its own atomics leave it unchanged
    }
  } else if (args.granularity == Granularity::kRow) {
    scratch = Tensor::empty(ctx, {rows + cols}, DType::kI32);
    auto* row_amax = scratch.data_as<uint32_t>();
    auto* col_amax = row_amax + rows;
    if (p.rowwise.data) {
      kernels::row_amax_kernel<InT>
          <<<static_cast<unsigned>(rows), 256, 0, st>>>(in, cols, row_amax);
      OCTET_CUDA_CHECK_LAUNCH();
      p.row_amax = row_amax;
    }
    if (p.columnwise.data) {
      ctx.be().memset(col_amax, 0, cols * sizeof(uint32_t));
      const int64_t rows_per_block = 256;
      const dim3 grid(static_cast<unsigned>(ceil_div(cols, 256)),
                      static_cast<unsigned>(ceil_div(rows, rows_per_block)));
      kernels::col_amax_kernel<InT><<<grid, 256, 0, st>>>(in, rows, cols, rows_per_block, col_amax);
      OCTET_CUDA_CHECK_LAUNCH();
      p.col_amax = col_amax;
    }
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kGroup)),
                  static_cast<unsigned>(ceil_div(rows, kGroup)));
  OCTET_CHECK(grid.y < 65536, "quantize: ", rows,
              " rows exceed the tile kernel's grid limit (65535 * 128)");
  kernels::quantize_tile_kernel<InT>
      <<<grid, kernels::kTileThreads, 0, st>>>(kernels::TensorSource<InT>{in}, p);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace

void quantize(Context& ctx, const QuantizeArgs& args, QuantTensor& out) {
  if (args.input.dtype() == DType::kF32)
    launch_quantize<float>(ctx, args, out);
  else
    launch_quantize<uint16_t>(ctx, args, out);
}

void dequantize(Context& ctx, const Tensor& data, const Tensor& scale_inv, Granularity g,
                Fp8Format f, Tensor& out) {
  const int64_t rows = data.rows(), cols = data.cols();
  const int64_t work = ceil_div(rows * ceil_div(cols, 8), 256);
  const int blocks = persistent_blocks(ctx, kernels::dequantize_kernel<float, true>, 256, work);
  const auto* q = data.data_as<const uint8_t>();
  const auto* s = scale_inv.data_as<const float>();
  const ScaleLayout l = scale_layout(g, scale_inv);
  const cudaStream_t st = stream_of(ctx);
  const bool vec = cols % 8 == 0 && aligned16(q) && aligned16(out.data());
  if (out.dtype() == DType::kF32) {
    auto* o = out.data_as<float>();
    if (vec)
      kernels::dequantize_kernel<float, true><<<blocks, 256, 0, st>>>(q, s, rows, cols, g, l, f, o);
    else
      kernels::dequantize_kernel<float, false>
          <<<blocks, 256, 0, st>>>(q, s, rows, cols, g, l, f, o);
  } else {
    auto* o = out.data_as<uint16_t>();
    if (vec)
      kernels::dequantize_kernel<uint16_t, true>
          <<<blocks, 256, 0, st>>>(q, s, rows, cols, g, l, f, o);
    else
      kernels::dequantize_kernel<uint16_t, false>
          <<<blocks, 256, 0, st>>>(q, s, rows, cols, g, l, f, o);
  }
  OCTET_CUDA_CHECK_LAUNCH();
}

void amax(Context& ctx, const Tensor& x, Tensor& out) {
  const cudaStream_t st = stream_of(ctx);
  auto* bits = out.data_as<uint32_t>();
  ctx.be().memset(bits, 0, sizeof(uint32_t));
  const int blocks =
      persistent_blocks(ctx, kernels::amax_kernel<float>, 256, ceil_div(x.numel(), 256));
  if (x.dtype() == DType::kF32)
    kernels::amax_kernel<float><<<blocks, 256, 0, st>>>(x.data_as<const float>(), x.numel(), bits);
  else
    kernels::amax_kernel<uint16_t>
        <<<blocks, 256, 0, st>>>(x.data_as<const uint16_t>(), x.numel(), bits);
  OCTET_CUDA_CHECK_LAUNCH();
}

void delayed_scaling_update(Context& ctx, DelayedScaling& state, const Tensor& amax, int64_t step,
                            AmaxReduction reduce, const ScaleRule& rule) {
  kernels::delayed_scaling_update_kernel<<<1, 256, 0, stream_of(ctx)>>>(
      state.amax_history.data_as<float>(), state.amax_history.numel(), amax.data_as<const float>(),
      step, reduce == AmaxReduction::kMax, rule, state.scale.data_as<float>(),
      state.scale_inv.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet::cuda
