// Backend::memset_ranges on the CPU backend (the interface's default: memset on each range) against
// std::memset on a copy; tests/backend/memset_gpu_test.cpp has the CUDA backend's fill kernel.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/backend.h"

namespace octet {
namespace {

TEST(Memset, RangesOnTheCpuMatchMemsetOnEach) {
  Context ctx = make_context(Device::kCpu);
  Tensor t = Tensor::empty(ctx, {1000}, DType::kU8);
  std::vector<uint8_t> expected(1000);
  for (int i = 0; i < 1000; ++i)
    expected[i] = t.data_as<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  auto* p = t.data_as<uint8_t>();
  const std::vector<MemsetRange> ranges = {{p + 1, 17}, {p + 100, 0}, {p + 500, 333}, {p + 999, 1}};
  ctx.be().memset_ranges(ranges, 0xC3);
  for (const MemsetRange& r : ranges)
    std::memset(expected.data() + (static_cast<uint8_t*>(r.dst) - p), 0xC3,
                static_cast<size_t>(r.bytes));
  EXPECT_EQ(std::memcmp(expected.data(), p, expected.size()), 0);
}

}  // namespace
}  // namespace octet
