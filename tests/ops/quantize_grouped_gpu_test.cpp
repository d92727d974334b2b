// ops/quantize/quantize_grouped.h on CUDA against the CPU reference, bit for bit: balanced, skewed,
// empty and all-to-one layouts with a padded tail, K not a multiple of 128, current and delayed
// scales, both column-wise scale layouts; and no host wait (the counts stay on the device).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "ops/quantize/quantize_grouped.h"
#include "test_util.h"

namespace octet::test {
namespace {

Context& gpu() {
  static Context ctx = make_context(Device::kCuda);
  return ctx;
}
Context& cpu() {
  static Context ctx = make_context(Device::kCpu);
  return ctx;
}

Tensor sizes_tensor(const std::vector<int32_t>& sizes) {
  Tensor t = Tensor::empty({static_cast<int64_t>(sizes.size())}, DType::kI32);
  std::memcpy(t.data(), sizes.data(), sizes.size() * 4);
  return t;
}

void expect_same(const Tensor& c, const Tensor& g, const std::string& what) {
  ASSERT_EQ(c.defined(), g.defined()) << what;
  if (c.defined()) EXPECT_TRUE(bitwise_equal(c, g.to_host(gpu()))) << what;
}

TEST(QuantizeGroupedGpu, MatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  std::vector<int32_t> balanced(32, 128), skewed(32, 0), empty(32, 0), all_to_one(32, 0);
  for (size_t e = 0; e < 32; ++e) skewed[e] = static_cast<int32_t>(128 * ((e * 7) % 4));
  all_to_one[5] = 1024;
  empty[0] = 0;  // nothing routed: the whole tensor is tail
  const std::vector<std::pair<const char*, std::vector<int32_t>>> layouts = {
      {"balanced", balanced}, {"skewed", skewed}, {"empty", empty}, {"all-to-one", all_to_one}};
  for (const auto& [name, sizes] : layouts) {
    int64_t used = 0;
    for (int32_t m : sizes) used += m;
    const int64_t rows = std::max<int64_t>(used, 1024) + 128;  // a padded tail
    for (const int64_t cols : {int64_t{704}, int64_t{200}}) {
      const Tensor x = random_tensor({rows, cols}, DType::kBF16, 17, Dist::kOutliers);
      const Tensor gx = x.to(gpu(), Device::kCuda);
      for (const bool delayed : {false, true}) {
        GroupedQuantizeArgs a{
            .input = x,
            .group_sizes = sizes_tensor(sizes),
            .format = delayed ? Fp8Format::kE5M2 : Fp8Format::kE4M3,
            .output = QuantizeOutput::kBoth,
            .columnwise_granularity = delayed ? Granularity::k1x128 : Granularity::k128x128};
        if (delayed) {
          a.scale = Tensor::empty({32}, DType::kF32);
          for (int e = 0; e < 32; ++e) a.scale.data_as<float>()[e] = 0.5f + 0.37f * e;
        }
        const GroupedQuantTensor c = quantize_grouped_tensorwise(cpu(), a);
        GroupedQuantizeArgs ga = a;
        ga.input = gx;
        ga.group_sizes = a.group_sizes.to(gpu(), Device::kCuda);
        if (delayed) ga.scale = a.scale.to(gpu(), Device::kCuda);
        gpu().synchronize();
        const int64_t before = gpu().be().host_waits();
        const GroupedQuantTensor g = quantize_grouped_tensorwise(gpu(), ga);
        EXPECT_EQ(gpu().be().host_waits(), before) << "the grouped quantization waited";
        const std::string what = std::string(name) + " cols=" + std::to_string(cols) +
                                 (delayed ? " delayed" : " current");
        expect_same(c.q.data, g.q.data, what + ": row-wise data");
        expect_same(c.q.scale_inv, g.q.scale_inv, what + ": row-wise scales");
        expect_same(c.q.columnwise_data, g.q.columnwise_data, what + ": column-wise data");
        expect_same(c.q.columnwise_scale_inv, g.q.columnwise_scale_inv,
                    what + ": column-wise scales");
        expect_same(c.amax, g.amax, what + ": amax");
        expect_same(c.scale_inv, g.scale_inv, what + ": scale_inv");
      }
    }
  }
}

}  // namespace
}  // namespace octet::test
