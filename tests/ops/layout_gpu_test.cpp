// copy_columns on CUDA against the CPU reference, bitwise: the 16-byte BF16 path (offsets, widths
// and leading dimensions multiples of 8) and the per-element one, broadcast and sum, mixed dtypes.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "ops/layout/layout.h"
#include "test_util.h"

namespace octet::test {
namespace {

struct Case {
  int64_t src_rows, src_cols, src_col, dst_cols, dst_col, width, repeat;
  CopyMode mode;
  DType src_dtype, dst_dtype;
};

TEST(LayoutGpu, CopyColumnsMatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  Context cpu = make_context(Device::kCpu), gpu = make_context(Device::kCuda);
  const Case cases[] = {
      // MLA's shapes: the rope key broadcast to 16 heads and its backward sum, kv splits.
      {4096, 576, 512, 192, 128, 64, 16, CopyMode::kBroadcast, DType::kBF16, DType::kBF16},
      {4096 * 16, 192, 128, 64, 0, 64, 16, CopyMode::kSum, DType::kBF16, DType::kBF16},
      {4096, 576, 0, 512, 0, 512, 1, CopyMode::kBroadcast, DType::kBF16, DType::kBF16},
      {1000, 256, 8, 136, 16, 120, 1, CopyMode::kSum, DType::kBF16, DType::kBF16},
      // Not 16-byte shaped: the per-element kernel.
      {777, 100, 3, 50, 1, 45, 1, CopyMode::kBroadcast, DType::kBF16, DType::kBF16},
      {96, 40, 4, 40, 8, 20, 3, CopyMode::kSum, DType::kBF16, DType::kBF16},
      {300, 64, 0, 64, 0, 64, 2, CopyMode::kSum, DType::kF32, DType::kBF16},
      {300, 64, 8, 72, 8, 48, 2, CopyMode::kBroadcast, DType::kBF16, DType::kF32},
  };
  for (const Case& c : cases) {
    const int64_t dst_rows =
        c.mode == CopyMode::kSum ? c.src_rows / c.repeat : c.src_rows * c.repeat;
    const Tensor src = random_tensor({c.src_rows, c.src_cols}, c.src_dtype, 7);
    const Tensor init = random_tensor({dst_rows, c.dst_cols}, c.dst_dtype, 8);
    Tensor want = init.to_host(cpu);
    copy_columns(cpu, {.src = src,
                       .src_col = c.src_col,
                       .dst = want,
                       .dst_col = c.dst_col,
                       .width = c.width,
                       .repeat = c.repeat,
                       .mode = c.mode});
    Tensor got = init.to(gpu, Device::kCuda);
    copy_columns(gpu, {.src = src.to(gpu, Device::kCuda),
                       .src_col = c.src_col,
                       .dst = got,
                       .dst_col = c.dst_col,
                       .width = c.width,
                       .repeat = c.repeat,
                       .mode = c.mode});
    EXPECT_TRUE(bitwise_equal(want, got.to_host(gpu)))
        << "src " << c.src_rows << "x" << c.src_cols << " col " << c.src_col << " width " << c.width
        << " repeat " << c.repeat;
  }
}

}  // namespace
}  // namespace octet::test
