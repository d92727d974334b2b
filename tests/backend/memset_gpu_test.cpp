// The CUDA backend's memset and memset_ranges (a fill kernel, backend/cuda_backend.cu) against the
// host's std::memset on the same bytes: every alignment of the start and end inside a 16-byte slot,
// sizes from one byte to tens of megabytes, more ranges than one launch takes, every byte outside
// the ranges left as it was, and a captured graph that holds one kernel node and no memset node.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_graph.h"
#include "test_util.h"

namespace octet {
namespace {

// A device buffer and its host mirror, both holding the same random bytes.
struct Mirror {
  Context& ctx;
  std::vector<uint8_t> host;
  Tensor dev;
  Mirror(Context& c, int64_t bytes, uint32_t seed) : ctx(c), host(static_cast<size_t>(bytes)) {
    std::mt19937 rng(seed);
    for (auto& b : host) b = static_cast<uint8_t>(rng());
    dev = Tensor::empty(ctx, {bytes}, DType::kU8);
    ctx.be().copy(dev.data(), host.data(), bytes, CopyKind::kHostToDevice);
  }
  uint8_t* at(int64_t offset) { return dev.data_as<uint8_t>() + offset; }
  void set(int64_t offset, int byte, int64_t bytes) {
    std::memset(host.data() + offset, byte, static_cast<size_t>(bytes));
  }
  ::testing::AssertionResult matches() {
    std::vector<uint8_t> got(host.size());
    ctx.be().copy(got.data(), dev.data(), static_cast<int64_t>(got.size()),
                  CopyKind::kDeviceToHost);
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != host[i])
        return ::testing::AssertionFailure()
               << "byte " << i << ": expected " << int{host[i]} << ", got " << int{got[i]};
    return ::testing::AssertionSuccess();
  }
};

TEST(MemsetGpu, EveryAlignmentAndSize) {
  OCTET_REQUIRE_GPU();
  Context ctx = make_context(Device::kCuda);
  Mirror m(ctx, 1 << 16, 1);
  int byte = 0;
  for (int64_t offset : {0, 1, 3, 8, 15, 16, 17, 31, 4097})
    for (int64_t bytes : {1, 2, 5, 15, 16, 17, 31, 32, 33, 255, 4096, 4099, 40001}) {
      byte = (byte + 77) % 256;
      ctx.be().memset(m.at(offset), byte, bytes);
      m.set(offset, byte, bytes);
      ASSERT_TRUE(m.matches()) << "offset " << offset << ", " << bytes << " bytes";
    }
  ctx.be().memset(m.at(5), 0, 0);  // nothing
  EXPECT_TRUE(m.matches());
}

TEST(MemsetGpu, LargeRangeWithUnalignedEnds) {
  OCTET_REQUIRE_GPU();
  Context ctx = make_context(Device::kCuda);
  const int64_t bytes = (int64_t{48} << 20) + 9;
  Mirror m(ctx, bytes + 64, 2);
  ctx.be().memset(m.at(7), 0xFF, bytes);
  m.set(7, 0xFF, bytes);
  EXPECT_TRUE(m.matches());
}

// 150 ranges (three launches of at most 64), of random sizes and alignments, some empty, in random
// order with gaps between them.
TEST(MemsetGpu, ManyRangesMatchMemsetOnEach) {
  OCTET_REQUIRE_GPU();
  Context ctx = make_context(Device::kCuda);
  std::mt19937 rng(3);
  std::vector<std::pair<int64_t, int64_t>> spans;  // offset, bytes
  int64_t at = 0;
  for (int i = 0; i < 150; ++i) {
    at += static_cast<int64_t>(rng() % 40);  // a gap
    const int64_t bytes =
        i % 17 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % (i % 5 == 0 ? 70000 : 300));
    spans.push_back({at, bytes});
    at += bytes;
  }
  std::shuffle(spans.begin(), spans.end(), rng);
  Mirror m(ctx, at + 16, 4);
  std::vector<MemsetRange> ranges;
  for (auto [offset, bytes] : spans) {
    ranges.push_back({m.at(offset), bytes});
    m.set(offset, 0, bytes);
  }
  ctx.be().memset_ranges(ranges, 0);
  EXPECT_TRUE(m.matches());
}

TEST(MemsetGpu, CapturedAsOneKernelNode) {
  OCTET_REQUIRE_GPU();
  Context ctx = make_context(Device::kCuda);
  if (!cuda_graphs_supported(ctx)) GTEST_SKIP() << "no CUDA graphs here";
  Mirror m(ctx, 1 << 20, 5);
  const std::vector<MemsetRange> ranges = {{m.at(3), 1000}, {m.at(5000), 4}, {m.at(9000), 700001}};
  CudaGraph graph;
  graph.capture(ctx, "memset_ranges", [&] { ctx.be().memset_ranges(ranges, 0x5A); });
  EXPECT_EQ(graph.nodes(), 1);  // one kernel, no memset node
  EXPECT_TRUE(m.matches());     // captured, not run
  graph.replay(ctx);
  for (const MemsetRange& r : ranges) m.set(static_cast<uint8_t*>(r.dst) - m.at(0), 0x5A, r.bytes);
  EXPECT_TRUE(m.matches());
}

}  // namespace
}  // namespace octet
