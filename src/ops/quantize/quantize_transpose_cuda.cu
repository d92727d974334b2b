// CUDA launchers of the scaling-aware transpose (device code in quantize_transpose_kernels.cuh):
// the op, its row-gather form (moe_permute_transposed) and the kernel it replaced, which
// `octet bench quantize` times next to it. Arguments were validated and outputs allocated by the
// callers; everything is enqueued on the context's stream.
#include <atomic>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "ops/quantize/quantize_backends.h"
#include "ops/quantize/quantize_transpose_kernels.cuh"

namespace octet::cuda {
namespace {

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

dim3 tile_grid(int64_t rows, int64_t cols) {
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kGroup)),
                  static_cast<unsigned>(ceil_div(rows, kGroup)));
  OCTET_CHECK(grid.y < 65536, "scaling-aware transpose: ", rows,
              " rows exceed the grid limit (65535 * 128)");
  return grid;
}

// The largest shared-memory carveout for the tile kernels, so that the 6 blocks per SM their launch
// bounds allow (16 KB of staged codes each) fit; set once per device.
void configure_tile_kernels(const Context& ctx) {
  static std::atomic<bool> configured[64] = {};
  OCTET_CHECK(ctx.device_index >= 0 && ctx.device_index < 64, "scaling-aware transpose: device ",
              ctx.device_index, " out of range");
  if (configured[ctx.device_index]) return;
  auto carveout = [](auto kernel) {
    OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared));
  };
  carveout(kernels::scaling_aware_transpose_tile_kernel<Fp8Format::kE4M3, true>);
  carveout(kernels::scaling_aware_transpose_tile_kernel<Fp8Format::kE4M3, false>);
  carveout(kernels::scaling_aware_transpose_tile_kernel<Fp8Format::kE5M2, true>);
  carveout(kernels::scaling_aware_transpose_tile_kernel<Fp8Format::kE5M2, false>);
  configured[ctx.device_index] = true;
}

// `rows` rows of the tensor transposed; row_src null (rows of in) or its source rows in `in`;
// cscale per tile (k128x128) or in the 1x128 form (quantize.h).
void launch_transpose(Context& ctx, const QuantTensor& in, int64_t rows, const int32_t* row_src,
                      Tensor& cdata, Tensor& cscale, Granularity cgran) {
  const int64_t cols = in.cols();
  if (rows == 0 || cols == 0) return;  // nothing to write: the outputs are empty
  const dim3 grid = tile_grid(rows, cols);
  configure_tile_kernels(ctx);
  const auto* q = in.data.data_as<const uint8_t>();
  auto* out = cdata.data_as<uint8_t>();
  const bool vec = cols % 16 == 0 && aligned16(q);
  const bool ovec = rows % 16 == 0 && aligned16(out);
  auto launch = [&](auto kernel) {
    kernel<<<grid, kernels::kTileThreads, 0, stream_of(ctx)>>>(
        q, in.scale_inv.data_as<const float>(), rows, cols, out, cscale.data_as<float>(), row_src,
        ovec, cgran == Granularity::k1x128);
  };
  if (in.format == Fp8Format::kE4M3)
    vec ? launch(kernels::scaling_aware_transpose_tile_kernel<Fp8Format::kE4M3, true>)
        : launch(kernels::scaling_aware_transpose_tile_kernel<Fp8Format::kE4M3, false>);
  else
    vec ? launch(kernels::scaling_aware_transpose_tile_kernel<Fp8Format::kE5M2, true>)
        : launch(kernels::scaling_aware_transpose_tile_kernel<Fp8Format::kE5M2, false>);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace

void scaling_aware_transpose(Context& ctx, const QuantTensor& in, Tensor& cdata, Tensor& cscale,
                             Granularity cgran) {
  launch_transpose(ctx, in, in.rows(), nullptr, cdata, cscale, cgran);
}

void scaling_aware_transpose_gathered(Context& ctx, const QuantTensor& in, const Tensor& row_src,
                                      Tensor& cdata, Tensor& cscale, Granularity columnwise) {
  launch_transpose(ctx, in, row_src.numel(), row_src.data_as<const int32_t>(), cdata, cscale,
                   columnwise);
}

void scaling_aware_transpose_legacy(Context& ctx, const QuantTensor& in, Tensor& cdata,
                                    Tensor& cscale) {
  const int64_t rows = in.rows(), cols = in.cols();
  if (rows == 0 || cols == 0) return;
  kernels::scaling_aware_transpose_legacy_kernel<<<tile_grid(rows, cols), kernels::kTileThreads, 0,
                                                   stream_of(ctx)>>>(
      in.data.data_as<const uint8_t>(), in.scale_inv.data_as<const float>(), rows, cols, in.format,
      cdata.data_as<uint8_t>(), cscale.data_as<float>(), nullptr);
  OCTET_CUDA_CHECK_LAUNCH();
}

}  // namespace octet::cuda
