// Device code of the quantize family. Every scale and every element follows numerics/scale.h
// exactly (the same OCTET_HD functions the CPU reference calls), so results are bit-identical to
// quantize_cpu.cpp; the only hardware-specific step is the FP8 conversion, cvt.rn.satfinite, which
// tests prove equal to the software rounding over every FP32 input.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "core/scale_layout.h"
#include "numerics/scale.h"

namespace octet::cuda::kernels {

inline constexpr int kTile = 128;         // tile edge == scale group edge (kGroup)
inline constexpr int kTileThreads = 256;  // 8 warps per 128x128 tile
inline constexpr int kSmemStride = 129;   // odd byte stride: conflict-free transposed reads
static_assert(kTile == kGroup, "tiles must coincide with the 128-element scale groups");
static_assert(kTileThreads == 8 * 32, "the tile kernels assume 8 warps");

// Four held input values -> FP32 (BF16 widened exactly).
__device__ __forceinline__ void unpack4(const uint2& w, float (&v)[4]) {
  v[0] = bits_float(w.x << 16), v[1] = bits_float(w.x & 0xFFFF0000u);
  v[2] = bits_float(w.y << 16), v[3] = bits_float(w.y & 0xFFFF0000u);
}
__device__ __forceinline__ void unpack4(const float4& f, float (&v)[4]) {
  v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
}

// Two FP32 values -> two FP8 codes with the hardware's round-to-nearest-even, saturating
// conversion.
__device__ __forceinline__ uint16_t cvt_fp8x2(float lo, float hi, Fp8Format f) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE,
                                  f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
}

__device__ __forceinline__ uint32_t warp_max(uint32_t v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

// Order-independent NaN-propagating max of |x| (numerics/scale.h abs_bits) into one global word.
__device__ __forceinline__ void block_amax_to_global(uint32_t v, uint32_t* out, uint32_t* smem8) {
  v = warp_max(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem8[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? smem8[lane] : 0u;
    v = warp_max(v);
    if (lane == 0 && v && out != nullptr) atomicMax(out, v);  // null: not wanted
  }
}

// ---------------------------------------------------------------------------------------------------
// 1x128 row-wise quantization, the hot path of activations and gradients. 16 threads own one group
// of 128 elements (8 each: one 16-byte load for BF16), reduce its amax with shuffles and store 8
// codes as one 8-byte word. Persistent grid sized to the SMs' resident blocks; each iteration loads
// two groups before using either, so two 16-byte loads per thread are in flight. Few blocks, so the
// global amax needs few atomics. kVec = 8 needs cols % 8 == 0 (every thread's chunk aligned and
// either whole or absent); kVec = 1 is the element-wise fallback for any shape.
template <typename InT, int kVec>
struct Chunk1x128 {
  // The loaded values in the input's own width until they are used (BF16: 4 registers for 8
  // values), so that several chunks can be in flight per thread.
  using Raw = std::conditional_t<kVec == 8 && sizeof(InT) == 2, uint4, float[8]>;
  Raw raw;
  int64_t g, r, c;

  __device__ __forceinline__ void load(const InT* __restrict__ in, int64_t cols, int64_t groups,
                                       int64_t groups_per_row, int64_t group) {
    g = group;
    const bool live = g < groups;
    r = live ? g / groups_per_row : 0;
    c = live ? (g % groups_per_row) * kGroup + (threadIdx.x % 16) * 8 : cols;
    if constexpr (kVec == 8 && sizeof(InT) == 2) {
      raw = c < cols ? *reinterpret_cast<const uint4*>(in + r * cols + c) : make_uint4(0, 0, 0, 0);
    } else if constexpr (kVec == 8) {
      const float4 z = make_float4(0, 0, 0, 0);
      const float4 lo = c < cols ? *reinterpret_cast<const float4*>(in + r * cols + c) : z;
      const float4 hi = c < cols ? *reinterpret_cast<const float4*>(in + r * cols + c + 4) : z;
      raw[0] = lo.x, raw[1] = lo.y, raw[2] = lo.z, raw[3] = lo.w, raw[4] = hi.x, raw[5] = hi.y,
      raw[6] = hi.z, raw[7] = hi.w;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) raw[i] = c + i < cols ? load_float(in, r * cols + c + i) : 0.0f;
    }
  }

  // All 32 lanes call this (the shuffles need them); returns the group's amax bits. The scale goes
  // to (r, c / 128) in `layout` (core/scale_layout.h) of the (rows, groups_per_row) groups.
  __device__ __forceinline__ uint32_t store(int64_t rows, int64_t cols, int64_t groups,
                                            int64_t groups_per_row, ScaleLayout layout,
                                            const ScaleRule& rule, uint8_t* __restrict__ data,
                                            float* __restrict__ scale_inv) const {
    float v[8];
    if constexpr (kVec == 8 && sizeof(InT) == 2) {
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
        v[2 * i] = bits_float(w[i] << 16), v[2 * i + 1] = bits_float(w[i] & 0xFFFF0000u);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = raw[i];
    }
    uint32_t a = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) a = max(a, abs_bits(v[i]));
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) a = max(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
    if (g >= groups) return a;
    const float scale = compute_scale(bits_float(a), rule);
    if (threadIdx.x % 16 == 0)  // c: the group's first column
      store_1x128_scale(scale_inv, layout, r, c / kGroup, rows, groups_per_row,
                        scale_inverse(scale));
    uint16_t q[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      q[i] = cvt_fp8x2(rn::mul(v[2 * i], scale), rn::mul(v[2 * i + 1], scale), rule.format);
    if constexpr (kVec == 8) {
      if (c < cols)
        *reinterpret_cast<uint2*>(data + r * cols + c) = make_uint2(
            q[0] | (static_cast<uint32_t>(q[1]) << 16), q[2] | (static_cast<uint32_t>(q[3]) << 16));
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (c + i < cols) data[r * cols + c + i] = static_cast<uint8_t>(q[i / 2] >> (8 * (i % 2)));
    }
    return a;
  }
};

template <typename InT, int kVec>
__global__ void __launch_bounds__(256)
    quantize_1x128_kernel(const InT* __restrict__ in, int64_t rows, int64_t cols, ScaleRule rule,
                          uint8_t* __restrict__ data, float* __restrict__ scale_inv,
                          ScaleLayout layout, uint32_t* amax_out) {
  static_assert(kVec == 8 || kVec == 1, "8-wide vectors or scalars");
  // Chunks in flight per thread: enough bytes outstanding per SM to cover DRAM latency at full
  // bandwidth.
  constexpr int kInFlight = kVec == 8 && sizeof(InT) == 2 ? 4 : 2;
  __shared__ uint32_t warp_amax[8];
  const int64_t groups_per_row = ceil_div(cols, kGroup);
  const int64_t groups = rows * groups_per_row;
  // A warp owns two adjacent groups per chunk (lanes 0-15 and 16-31); every lane of a warp runs the
  // same number of iterations, so the shuffles always see all 32 lanes.
  const int64_t warp_group = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32 * 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x / 16;
  const int64_t mine = (threadIdx.x % 32) / 16;
  uint32_t running = 0;
  Chunk1x128<InT, kVec> chunk[kInFlight];
  for (int64_t g0 = warp_group; g0 < groups; g0 += kInFlight * stride) {
#pragma unroll
    for (int k = 0; k < kInFlight; ++k)
      chunk[k].load(in, cols, groups, groups_per_row, g0 + k * stride + mine);
#pragma unroll
    for (int k = 0; k < kInFlight; ++k)
      running = max(running, chunk[k].store(rows, cols, groups, groups_per_row, layout, rule, data,
                                            scale_inv));
  }
  block_amax_to_global(running, amax_out, warp_amax);
}

// ---------------------------------------------------------------------------------------------------
// 128x128 tile kernel: every granularity, the column-wise (transposed) copy, or both from one read.
//
// Where a group's scale comes from, for one output copy, seen from the tile:
enum class ScaleSource : uint8_t {
  kRowInTile,     // one amax per tile row (1x128 row-wise; 128x1 of the transpose)
  kColInTile,     // one amax per tile column (128x1 row-wise; 1x128 of the transpose)
  kTile,          // one amax per tile (128x128)
  kGlobalScalar,  // per-tensor: a precomputed amax, or a given (delayed) scale
  kGlobalPerRow,  // row-wise granularity: precomputed amax per row
  kGlobalPerCol,  // row-wise granularity of the transpose: precomputed amax per column
};

struct TileOutput {
  uint8_t* data = nullptr;  // null: this copy is not written
  float* scale_inv = nullptr;
  ScaleSource source = ScaleSource::kTile;
  Granularity granularity = Granularity::k128x128;  // as applied to this copy's own matrix
  ScaleLayout layout = ScaleLayout::kKMajor;        // k1x128: where its scales go
};

struct TileParams {
  int64_t rows = 0, cols = 0;
  ScaleRule rule;
  TileOutput rowwise;                     // (rows, cols)
  TileOutput columnwise;                  // (cols, rows)
  const uint32_t* global_amax = nullptr;  // (1) abs bits, for kGlobalScalar
  const float* given_scale = nullptr;     // (1), overrides global_amax
  const uint32_t* row_amax = nullptr;     // (rows) abs bits, for kGlobalPerRow
  const uint32_t* col_amax = nullptr;     // (cols) abs bits, for kGlobalPerCol
  uint32_t* amax_out = nullptr;           // (1) abs bits: max |x| over the tensor
  bool aligned_input = true;              // input aligned to 4 elements: vector loads allowed
  // k128x128 only, > 0: the rows are stacked matrices of batch_rows rows each (a multiple of 128,
  // the grouped experts' (E Out, In)); the column-wise copy is each matrix transposed, stacked:
  // (rows / batch_rows, cols, batch_rows), its scales likewise.
  int64_t batch_rows = 0;
};

// Where the tile kernel's values come from: the input tensor itself (a source type could also
// compute them; the fused AdamW has its own kernel, ops/adamw/adamw_block_kernels.cuh); `load`
// returns the 4 values of (r, c..c+3), 0 outside the matrix, packed in InT's width as Held.
template <typename InT>
struct TensorSource {
  const InT* in;
  template <typename Held>
  __device__ __forceinline__ Held load(int64_t r, int64_t c, int64_t rows, int64_t cols,
                                       bool vec) const {
    if (vec && r < rows && c < cols) return *reinterpret_cast<const Held*>(in + r * cols + c);
    float f[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      f[i] = (r < rows && c + i < cols) ? load_float(in, r * cols + c + i) : 0.0f;
    if constexpr (sizeof(InT) == 2)
      return make_uint2(float_to_bf16(f[0]) | (float_bits(f[1]) & 0xFFFF0000u),
                        float_to_bf16(f[2]) | (float_bits(f[3]) & 0xFFFF0000u));
    else
      return make_float4(f[0], f[1], f[2], f[3]);
  }
};

// Offset of the scale_inv entry of element (r, c) of a (rows, cols) matrix (scale.h layouts; 1x128
// in either layout of core/scale_layout.h).
__device__ __forceinline__ int64_t scale_offset(Granularity g, ScaleLayout layout, int64_t r,
                                                int64_t c, int64_t rows, int64_t cols) {
  switch (g) {
    case Granularity::kTensor:
      return 0;
    case Granularity::kRow:
      return r;
    case Granularity::k1x128:
      return scale_1x128_offset(layout, r, c / kGroup, rows, ceil_div(cols, kGroup));
    case Granularity::k128x1:
      return (r / kGroup) * cols + c;
    case Granularity::k128x128:
      return (r / kGroup) * ceil_div(cols, kGroup) + c / kGroup;
  }
  return 0;
}

struct TileSmem {
  uint8_t q[kTile * kSmemStride];  // codes of the transposed copy, [tile row][tile col]
  uint32_t col_part[8][kTile];     // per-warp column amax partials
  uint32_t row_amax[kTile];
  uint32_t col_amax[kTile];
  float scale[2][kTile];  // [copy][row or col index]
  uint32_t warp_amax[8];
};

// Fills s.scale[copy][i] with the scale of tile row i (sources by row) or tile column i (by column)
// and writes the scale_inv entries this tile owns. Called by all threads; i = threadIdx.x < 128.
__device__ __forceinline__ void tile_scales(const TileParams& p, const TileOutput& o, int copy,
                                            int64_t r0, int64_t c0, uint32_t tile_amax,
                                            TileSmem& s) {
  const int i = threadIdx.x;
  if (i >= kTile) return;
  // Rows and columns of this copy's own matrix: the transpose swaps them.
  const bool t = copy == 1;
  const int64_t my_rows = t ? p.cols : p.rows, my_cols = t ? p.rows : p.cols;
  const int64_t gr = r0 + i, gc = c0 + i;  // global row / column of X for index i
  uint32_t amax = tile_amax;
  const bool given = o.source == ScaleSource::kGlobalScalar && p.given_scale;
  if (!given) switch (o.source) {
      case ScaleSource::kRowInTile:
        amax = s.row_amax[i];
        break;
      case ScaleSource::kColInTile:
        amax = s.col_amax[i];
        break;
      case ScaleSource::kTile:
        break;
      case ScaleSource::kGlobalScalar:
        amax = *p.global_amax;
        break;
      case ScaleSource::kGlobalPerRow:
        amax = gr < p.rows ? p.row_amax[gr] : 0u;
        break;
      case ScaleSource::kGlobalPerCol:
        amax = gc < p.cols ? p.col_amax[gc] : 0u;
        break;
    }
  const float scale = given ? *p.given_scale : compute_scale(bits_float(amax), p.rule);
  s.scale[copy][i] = scale;
  // The entry for tile index i: which (row, col) of this copy's matrix it belongs to. Sources by
  // column of X index X columns; in the transpose these are rows.
  const bool by_col = o.source == ScaleSource::kColInTile || o.source == ScaleSource::kGlobalPerCol;
  int64_t xr = by_col ? r0 : gr, xc = by_col ? gc : c0;  // an element of X in this group
  if (xr >= p.rows || xc >= p.cols) return;
  int64_t mr = t ? xc : xr, mc = t ? xr : xc;
  // Global sources are shared by many tiles: only the first tile along the shared axis writes.
  if (o.source == ScaleSource::kGlobalScalar && (r0 || c0 || i)) return;
  if (o.source == ScaleSource::kGlobalPerRow && c0) return;
  if (o.source == ScaleSource::kGlobalPerCol && r0) return;
  if (o.source == ScaleSource::kTile && i) return;
  if (o.granularity == Granularity::k1x128)  // with the MN-major padding
    store_1x128_scale(o.scale_inv, o.layout, mr, mc / kGroup, my_rows, ceil_div(my_cols, kGroup),
                      scale_inverse(scale));
  else
    o.scale_inv[scale_offset(o.granularity, o.layout, mr, mc, my_rows, my_cols)] =
        scale_inverse(scale);
}

__device__ __forceinline__ float tile_scale_of(const TileOutput& o, const TileSmem& s, int copy,
                                               int r, int c) {
  const bool by_col = o.source == ScaleSource::kColInTile || o.source == ScaleSource::kGlobalPerCol;
  return s.scale[copy][by_col ? c : r];
}

// Writes the transposed codes staged in s.q ([r][c]) as rows of the (cols, rows) output: 8 lanes
// cover 128 consecutive output bytes, 16 each; the odd stride keeps the column reads conflict-free.
__device__ __forceinline__ void store_transposed(const TileSmem& s, uint8_t* out, int64_t rows,
                                                 int64_t cols, int64_t r0, int64_t c0) {
  const bool vec = rows % 16 == 0;
  for (int item = threadIdx.x; item < kTile * 8; item += kTileThreads) {
    const int c = item / 8, k = item % 8;
    const int64_t oc = c0 + c;
    if (oc >= cols) continue;
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 16; ++j)
      w[j / 4] |= static_cast<uint32_t>(s.q[(16 * k + j) * kSmemStride + c]) << (8 * (j % 4));
    const int64_t orow = r0 + 16 * k;
    if (vec && orow < rows) {
      *reinterpret_cast<uint4*>(out + oc * rows + orow) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      for (int j = 0; j < 16 && orow + j < rows; ++j)
        out[oc * rows + orow + j] = static_cast<uint8_t>(w[j / 4] >> (8 * (j % 4)));
    }
  }
}

// One block per 128x128 tile. A warp covers one tile row per step (4 elements a lane), 8 rows per
// step, 16 steps; the 64 values a thread holds stay in registers between the amax pass and the
// cast.
template <typename InT, typename Source = TensorSource<InT>>
__global__ void __launch_bounds__(kTileThreads, sizeof(InT) == 2 ? 3 : 2)
    quantize_tile_kernel(Source src, TileParams p) {
  __shared__ TileSmem s;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile,
                c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const bool vec = p.cols % 4 == 0 && p.aligned_input;
  // The tile stays in registers between the amax pass and the cast, in the input's own width (BF16
  // packed two to a register): 32 registers for BF16 instead of 64, so more tiles fit on an SM.
  using Held = std::conditional_t<sizeof(InT) == 2, uint2, float4>;
  Held held[16];
  uint32_t colmax[4] = {0, 0, 0, 0};
#pragma unroll
  for (int step = 0; step < 16; ++step) {
    const int64_t r = r0 + step * 8 + warp, c = c0 + lane * 4;
    held[step] = src.template load<Held>(r, c, p.rows, p.cols, vec);
    float v[4];
    unpack4(held[step], v);
    uint32_t rowmax = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t a = abs_bits(v[i]);
      rowmax = max(rowmax, a);
      colmax[i] = max(colmax[i], a);
    }
    rowmax = warp_max(rowmax);
    if (lane == 0) s.row_amax[step * 8 + warp] = rowmax;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) s.col_part[warp][lane * 4 + i] = colmax[i];
  __syncthreads();
  if (threadIdx.x < kTile) {
    uint32_t m = 0;
#pragma unroll
    for (int w = 0; w < 8; ++w) m = max(m, s.col_part[w][threadIdx.x]);
    s.col_amax[threadIdx.x] = m;
  }
  __syncthreads();
  uint32_t tile_amax = threadIdx.x < kTile ? s.row_amax[threadIdx.x] : 0u;
  block_amax_to_global(tile_amax, p.amax_out, s.warp_amax);
  // block_amax_to_global leaves the eight warp maxima in s.warp_amax (synchronised): the tile's
  // amax.
  tile_amax = 0;
#pragma unroll
  for (int w = 0; w < 8; ++w) tile_amax = max(tile_amax, s.warp_amax[w]);
  if (p.rowwise.data) tile_scales(p, p.rowwise, 0, r0, c0, tile_amax, s);
  // The column-wise copy of a stacked matrix (batch_rows > 0): this tile's matrix b, seen alone.
  TileParams pc = p;
  int64_t cr0 = r0;
  if (p.batch_rows > 0) {
    const int64_t b = r0 / p.batch_rows;
    cr0 = r0 - b * p.batch_rows;
    pc.rows = p.batch_rows;
    pc.columnwise.data += b * p.cols * p.batch_rows;
    pc.columnwise.scale_inv += b * ceil_div(p.cols, kGroup) * (p.batch_rows / kGroup);
  }
  if (p.columnwise.data) tile_scales(pc, pc.columnwise, 1, cr0, c0, tile_amax, s);
  __syncthreads();
#pragma unroll
  for (int step = 0; step < 16; ++step) {
    const int tr = step * 8 + warp, tc = lane * 4;
    float v[4];
    unpack4(held[step], v);
    const int64_t r = r0 + tr, c = c0 + tc;
    if (p.rowwise.data && r < p.rows) {
      uint8_t q[4];
#pragma unroll
      for (int i = 0; i < 4; i += 2) {
        const uint16_t pair = cvt_fp8x2(
            rn::mul(v[i], tile_scale_of(p.rowwise, s, 0, tr, tc + i)),
            rn::mul(v[i + 1], tile_scale_of(p.rowwise, s, 0, tr, tc + i + 1)), p.rule.format);
        q[i] = static_cast<uint8_t>(pair), q[i + 1] = static_cast<uint8_t>(pair >> 8);
      }
      if (vec && c < p.cols) {
        *reinterpret_cast<uint32_t*>(p.rowwise.data + r * p.cols + c) =
            q[0] | (q[1] << 8) | (q[2] << 16) | (static_cast<uint32_t>(q[3]) << 24);
      } else {
        for (int i = 0; i < 4; ++i)
          if (c + i < p.cols) p.rowwise.data[r * p.cols + c + i] = q[i];
      }
    }
    if (p.columnwise.data) {
#pragma unroll
      for (int i = 0; i < 4; i += 2) {
        const uint16_t pair = cvt_fp8x2(
            rn::mul(v[i], tile_scale_of(p.columnwise, s, 1, tr, tc + i)),
            rn::mul(v[i + 1], tile_scale_of(p.columnwise, s, 1, tr, tc + i + 1)), p.rule.format);
        s.q[tr * kSmemStride + tc + i] = static_cast<uint8_t>(pair);
        s.q[tr * kSmemStride + tc + i + 1] = static_cast<uint8_t>(pair >> 8);
      }
    }
  }
  if (p.columnwise.data) {
    __syncthreads();
    store_transposed(s, pc.columnwise.data, pc.rows, p.cols, cr0, c0);
  }
}

// ---------------------------------------------------------------------------------------------------
// Small kernels: amax reductions for the per-tensor and row-wise scale sources, dequantization and
// the delayed-scaling history update.

template <typename InT>
__global__ void __launch_bounds__(256)
    amax_kernel(const InT* __restrict__ in, int64_t n, uint32_t* out) {
  __shared__ uint32_t warp_amax[8];
  uint32_t m = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    m = max(m, abs_bits(load_float(in, i)));
  block_amax_to_global(m, out, warp_amax);
}

// One block per row: out[r] = max_c |x[r, c]| as abs bits.
template <typename InT>
__global__ void __launch_bounds__(256)
    row_amax_kernel(const InT* __restrict__ in, int64_t cols, uint32_t* out) {
  __shared__ uint32_t warp_amax[8];
  const int64_t r = blockIdx.x;
  uint32_t m = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    m = max(m, abs_bits(load_float(in, r * cols + c)));
  m = warp_max(m);
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < 8; ++w) m = max(m, warp_amax[w]);
    out[r] = max(m, warp_amax[0]);
  }
}

// out[c] = max_r |x[r, c]|: a thread per column over a slab of rows, merged with atomicMax (the max
// of unsigned words does not depend on the order). `out` must be zeroed first.
template <typename InT>
__global__ void __launch_bounds__(256)
    col_amax_kernel(const InT* __restrict__ in, int64_t rows, int64_t cols, int64_t rows_per_block,
                    uint32_t* out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t rbeg = static_cast<int64_t>(blockIdx.y) * rows_per_block;
  const int64_t rend = min(rows, rbeg + rows_per_block);
  uint32_t m = 0;
  for (int64_t r = rbeg; r < rend; ++r) m = max(m, abs_bits(load_float(in, r * cols + c)));
  if (m) atomicMax(out + c, m);
}

// x = q * scale_inv, 8 consecutive elements of a row per thread: one 8-byte load of codes and, with
// kVec, 16- or 32-byte stores (cols % 8 == 0); the scale is looked up per element unless the
// granularity gives the 8 one group (1x128, row, tensor).
template <typename OutT, bool kVec>
__global__ void __launch_bounds__(256)
    dequantize_kernel(const uint8_t* __restrict__ q, const float* __restrict__ sinv, int64_t rows,
                      int64_t cols, Granularity g, ScaleLayout layout, Fp8Format f,
                      OutT* __restrict__ out) {
  const int64_t chunks_per_row = ceil_div(cols, 8);
  const int64_t chunks = rows * chunks_per_row;
  const bool shared_scale =
      g == Granularity::k1x128 || g == Granularity::kRow || g == Granularity::kTensor;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < chunks;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / chunks_per_row, c = (k % chunks_per_row) * 8;
    const int64_t base = r * cols + c;
    uint8_t code[8];
    if constexpr (kVec) {
      const uint2 w = *reinterpret_cast<const uint2*>(q + base);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        code[i] = static_cast<uint8_t>((i < 4 ? w.x : w.y) >> (8 * (i % 4)));
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) code[i] = c + i < cols ? q[base + i] : 0;
    }
    const float s0 = sinv[scale_offset(g, layout, r, c, rows, cols)];
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float s = (shared_scale || c + i >= cols)
                          ? s0
                          : sinv[scale_offset(g, layout, r, c + i, rows, cols)];
      v[i] = rn::mul(fp8_to_float(code[i], f), s);
    }
    if constexpr (kVec && sizeof(OutT) == 4) {
      reinterpret_cast<float4*>(out + base)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(out + base)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else if constexpr (kVec) {
      uint32_t w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        w[i] = float_to_bf16(v[2 * i]) | (static_cast<uint32_t>(float_to_bf16(v[2 * i + 1])) << 16);
      *reinterpret_cast<uint4*>(out + base) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (c + i >= cols) break;
        if constexpr (sizeof(OutT) == 4)
          out[base + i] = v[i];
        else
          out[base + i] = float_to_bf16(v[i]);
      }
    }
  }
}

// Single block: history[step % len] = amax; reduce; scale = rule(reduced) unless reduced is 0 or
// non-finite, in which case the previous scale stays.
static __global__ void __launch_bounds__(256)
    delayed_scaling_update_kernel(float* history, int64_t len, const float* amax, int64_t step,
                                  bool reduce_max, ScaleRule rule, float* scale, float* scale_inv) {
  __shared__ uint32_t warp_amax[8];
  const float a = *amax;
  uint32_t m = abs_bits(a);
  if (reduce_max)
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x)
      m = max(m, i == step % len ? abs_bits(a) : abs_bits(history[i]));
  m = warp_max(m);
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 0; w < 8; ++w) m = max(m, warp_amax[w]);
  history[step % len] = a;
  if (m != 0 && m < 0x7F800000u) {
    const float s = compute_scale(bits_float(m), rule);
    *scale = s;
    *scale_inv = scale_inverse(s);
  }
}

}  // namespace octet::cuda::kernels
