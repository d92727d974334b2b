// CUDA launchers of the scaling-aware transpose (device code in quantize_transpose_kernels.cuh):
// the op, its row-gather form (moe_permute_transposed) and the kernel it replaced, which `octet
// bench quantize` times next to it (that legacy kernel's device code is here, its only user).
// Arguments were validated and outputs allocated by the callers; everything is enqueued on the
// context's stream.
#include <atomic>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda_check.h"
#include "ops/quantize/quantize_backends.h"
#include "ops/quantize/quantize_transpose_kernels.cuh"

namespace octet::cuda::kernels {

// ---------------------------------------------------------------------------------------------------
// The kernel before the 16-byte rewrite (kept for `octet bench quantize`, which times both, and
// for the GPU test that compares both bit for bit): one block per 128x128 tile of a 1x128, power-of-2-scaled
// tensor. The tile's scale is the largest of its row scale_invs; each row's codes move to it by the
// exact factor s_row / S (a power of two <= 1), decoded through a 256-entry table and re-rounded by
// the hardware conversion, which is exact while values stay normal and round-to-nearest-even below.
// With row_src, row r of the tensor transposed is row row_src[r] of q (-1: a row of zero codes with
// scale_inv 1.0, moe_permute's padding): the transpose of a row gather, without storing it.
__global__ void __launch_bounds__(kTileThreads)
    scaling_aware_transpose_legacy_kernel(const uint8_t* __restrict__ q,
                                          const float* __restrict__ scale_inv, int64_t rows,
                                          int64_t cols, Fp8Format format, uint8_t* __restrict__ out,
                                          float* __restrict__ out_scale_inv,
                                          const int32_t* __restrict__ row_src = nullptr) {
  __shared__ uint8_t tile[kTile * kSmemStride];
  __shared__ float lut[256];
  __shared__ float ratio[kTile];
  __shared__ uint32_t warp_max_s[8];
  __shared__ bool nonzero[kTile];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile,
                c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t cblocks = ceil_div(cols, kGroup), rblocks = ceil_div(rows, kGroup);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  lut[threadIdx.x] = fp8_to_float(static_cast<uint8_t>(threadIdx.x), format);
  const int i = threadIdx.x;
  // The source row of row r (-1: a padding row).
  auto src = [&](int64_t r) -> int64_t { return row_src != nullptr ? row_src[r] : r; };
  float si = 0.0f;
  if (i < kTile && r0 + i < rows) {
    const int64_t sr = src(r0 + i);
    si = sr >= 0 ? scale_inv[sr * cblocks + blockIdx.x] : 1.0f;
  }
  // Stage the codes: a warp reads one 128-byte row per step, 4 bytes a lane; all 16 loads are
  // issued before the first is used, then written to shared memory byte by byte (conflict-free: a
  // warp's 128 bytes are consecutive).
  const bool vec = cols % 4 == 0 && reinterpret_cast<uintptr_t>(q) % 4 == 0;
  uint32_t w16[kTile / 8];
#pragma unroll
  for (int k = 0; k < kTile / 8; ++k) {
    const int64_t r = r0 + warp + 8 * k, c = c0 + lane * 4;
    const int64_t sr = r < rows ? src(r) : -1;
    uint32_t w = 0;
    if (vec && sr >= 0 && c < cols) {
      w = *reinterpret_cast<const uint32_t*>(q + sr * cols + c);
    } else {
      for (int b = 0; b < 4; ++b)
        if (sr >= 0 && c + b < cols) w |= static_cast<uint32_t>(q[sr * cols + c + b]) << (8 * b);
    }
    w16[k] = w;
  }
  // Which rows hold a non-zero code (+-0 are 0x00 and 0x80): only they set the tile's scale.
#pragma unroll
  for (int k = 0; k < kTile / 8; ++k) {
    const bool any = __any_sync(0xFFFFFFFFu, (w16[k] & 0x7F7F7F7Fu) != 0);
    if (lane == 0) nonzero[warp + 8 * k] = any;
  }
#pragma unroll
  for (int k = 0; k < kTile / 8; ++k)
#pragma unroll
    for (int b = 0; b < 4; ++b)
      tile[(warp + 8 * k) * kSmemStride + lane * 4 + b] = static_cast<uint8_t>(w16[k] >> (8 * b));
  __syncthreads();
  // S: the largest scale_inv of those rows (positive powers of two order like their bit
  // patterns); 1.0 for an all-zero tile, as quantize scales zeros.
  uint32_t m = warp_max((i < kTile && nonzero[i]) ? float_bits(si) : 0u);
  if (lane == 0) warp_max_s[warp] = m;
  __syncthreads();
  m = 0;
#pragma unroll
  for (int w = 0; w < 8; ++w) m = max(m, warp_max_s[w]);
  const float smax = m == 0 ? 1.0f : bits_float(m);
  // Capped at 1 for the all-zero rows, whose scale_inv may exceed S (their codes stay zero).
  if (i < kTile) ratio[i] = si > 0.0f ? fminf(rn::div(si, smax), 1.0f) : 0.0f;
  if (threadIdx.x == 0) out_scale_inv[blockIdx.x * rblocks + blockIdx.y] = smax;
  __syncthreads();
  const bool ovec = rows % 16 == 0;
  for (int item = threadIdx.x; item < kTile * 8; item += kTileThreads) {
    const int c = item / 8, k = item % 8;
    const int64_t oc = c0 + c, orow = r0 + 16 * k;
    if (oc >= cols || orow >= rows) continue;
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 16; j += 2) {
      const int tr = 16 * k + j;
      const float a = rn::mul(lut[tile[tr * kSmemStride + c]], ratio[tr]);
      const float b = rn::mul(lut[tile[(tr + 1) * kSmemStride + c]], ratio[tr + 1]);
      w[j / 4] |= static_cast<uint32_t>(cvt_fp8x2(a, b, format)) << (8 * (j % 4));
    }
    if (ovec) {
      *reinterpret_cast<uint4*>(out + oc * rows + orow) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      for (int j = 0; j < 16 && orow + j < rows; ++j)
        out[oc * rows + orow + j] = static_cast<uint8_t>(w[j / 4] >> (8 * (j % 4)));
    }
  }
}

}  // namespace octet::cuda::kernels

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
