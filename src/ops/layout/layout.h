// Column-block copies between matrix views: the glue of the model's splits and concatenations
// (MLA's latent / rope-key split, the per-head concat of k_nope with the shared rope key, the MTP
// concat of [norm(h); norm(emb)]) and of their backward passes.
//
// Both tensors are read as matrices (leading dimensions flattened into rows). `repeat` relates the
// row counts, which lets one op broadcast a row to several (forward of a shared key) and sum
// several rows into one (its backward):
//
//   kBroadcast  dst[r, dst_col + j] = src[r / repeat, src_col + j]
//               rows(dst) = rows(src) * repeat
//   kSum        dst[r, dst_col + j] = sum_{i < repeat} src[r * repeat + i, src_col + j]
//               rows(src) = rows(dst) * repeat
//
// for r over dst's rows and j < width. Columns of dst outside [dst_col, dst_col + width) are not
// touched, so several calls fill one tensor. kSum adds in FP32 in increasing i (deterministic),
// then rounds once to dst's dtype; with repeat = 1 both modes are plain copies (a dtype conversion
// when the dtypes differ: F32 -> BF16 rounds to nearest even). Written (=) into dst.
#pragma once

#include <cstdint>

#include "core/context.h"

namespace octet {

enum class CopyMode : uint8_t { kBroadcast, kSum };

struct CopyColumnsArgs {
  Tensor src;           // (R_src, C_src) f32 | bf16
  int64_t src_col = 0;  // first column read; src_col + width <= C_src
  Tensor dst;           // (R_dst, C_dst) f32 | bf16: columns [dst_col, dst_col + width) written
  int64_t dst_col = 0;  // dst_col + width <= C_dst
  int64_t width = 0;    // >= 0
  int64_t repeat = 1;   // >= 1, see the modes above
  CopyMode mode = CopyMode::kBroadcast;
};

void copy_columns(Context& ctx, const CopyColumnsArgs& args);

// A new (rows, width) tensor of `dtype` holding columns [col, col + width) of x (=).
Tensor slice_columns(Context& ctx, const Tensor& x, int64_t col, int64_t width, DType dtype);

// Zero-filled tensor on the context's device.
Tensor zeros(Context& ctx, const Shape& shape, DType dtype);

}  // namespace octet
