// Attention on column windows (HeadView) on CUDA: cuDNN reading q, k, v through row strides and
// writing dv into a window gives bitwise the compact path's results (T = 1's special case
// included), caches one graph per layout, and refuses windows it cannot read.
#include <gtest/gtest.h>

#include <string>

#include "attention_view_test_util.h"
#if OCTET_WITH_CUDNN
#include "ops/attention/attention_cudnn.h"
#endif

namespace octet {
namespace {

TEST(AttentionViewGpu, WindowsMatchCompactBitwise) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  // The baseline's MLA (Dn 64, Dr 32, Dv 64): v the last 64 columns of 128, dv written back there.
  test::expect_views_match_compact(gpu,
                                   {.B = 2,
                                    .T = 97,
                                    .H = 4,
                                    .dqk = 96,
                                    .dv = 64,
                                    .wq = 96,
                                    .cq = 0,
                                    .wk = 96,
                                    .ck = 0,
                                    .wv = 128,
                                    .cv = 64,
                                    .wdv = 128,
                                    .cdv = 64},
                                   DType::kBF16, 31);
  // Every operand a window; DeepSeek-V3's head dims (Dn = Dv = 128, Dr = 64).
  test::expect_views_match_compact(gpu,
                                   {.B = 1,
                                    .T = 130,
                                    .H = 2,
                                    .dqk = 192,
                                    .dv = 128,
                                    .wq = 200,
                                    .cq = 8,
                                    .wk = 256,
                                    .ck = 64,
                                    .wv = 256,
                                    .cv = 128,
                                    .wdv = 264,
                                    .cdv = 136},
                                   DType::kBF16, 32);
}

TEST(AttentionViewGpu, SingleTokenWritesDvIntoTheWindow) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  test::expect_views_match_compact(gpu,
                                   {.B = 3,
                                    .T = 1,
                                    .H = 2,
                                    .dqk = 24,
                                    .dv = 16,
                                    .wq = 24,
                                    .cq = 0,
                                    .wk = 24,
                                    .ck = 0,
                                    .wv = 32,
                                    .cv = 16,
                                    .wdv = 32,
                                    .cdv = 16},
                                   DType::kBF16, 34);
}

#if OCTET_WITH_CUDNN
TEST(AttentionViewGpu, OneGraphPerLayout) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  const Tensor q = test::random_tensor({1, 16, 2, 16}, DType::kBF16, 1).to(gpu, Device::kCuda);
  const Tensor wide = test::random_tensor({1, 16, 2, 32}, DType::kBF16, 2).to(gpu, Device::kCuda);
  attention_forward(gpu, {.q = q, .k = q, .v = q});
  const size_t graphs = attention_state(gpu).graphs.size();
  attention_forward(gpu, {.q = q, .k = q, .v = HeadView(wide, 16, 16)});
  EXPECT_EQ(attention_state(gpu).graphs.size(), graphs + 1) << "a strided v needs its own graph";
  attention_forward(gpu, {.q = q, .k = q, .v = HeadView(wide, 0, 16)});
  EXPECT_EQ(attention_state(gpu).graphs.size(), graphs + 1)
      << "the same strides at another column reuse the graph";
}
#endif

TEST(AttentionViewGpu, RefusesUnalignedWindows) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  const Tensor q = test::random_tensor({1, 8, 2, 16}, DType::kBF16, 1).to(gpu, Device::kCuda);
  const Tensor wide = test::random_tensor({1, 8, 2, 28}, DType::kBF16, 2).to(gpu, Device::kCuda);
  try {
    attention_forward(gpu, {.q = q, .k = q, .v = HeadView(wide, 12, 16)});
    ADD_FAILURE() << "expected octet::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace octet
