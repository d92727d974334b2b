// Attention on column windows (HeadView) on the CPU: bitwise the compact results, dv written into a
// window without touching its neighbours, and clear errors for windows that do not fit.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "attention_view_test_util.h"

namespace octet {
namespace {

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& words) {
  try {
    fn();
    ADD_FAILURE() << "expected octet::Error";
  } catch (const Error& e) {
    for (const auto& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << "'" << w << "' not in: " << e.what();
  }
}

TEST(AttentionView, WindowsMatchCompactBitwise) {
  Context cpu = make_context(Device::kCpu);
  // MLA's shape: v the last Dv columns of (Dn + Dv) rows, dv written back there; and odd windows
  // (not multiples of 8 are fine on the CPU) for q and k.
  test::expect_views_match_compact(cpu,
                                   {.B = 2,
                                    .T = 9,
                                    .H = 3,
                                    .dqk = 24,
                                    .dv = 16,
                                    .wq = 24,
                                    .cq = 0,
                                    .wk = 29,
                                    .ck = 3,
                                    .wv = 32,
                                    .cv = 16,
                                    .wdv = 32,
                                    .cdv = 16},
                                   DType::kBF16, 11);
  test::expect_views_match_compact(cpu,
                                   {.B = 1,
                                    .T = 5,
                                    .H = 2,
                                    .dqk = 16,
                                    .dv = 8,
                                    .wq = 20,
                                    .cq = 4,
                                    .wk = 16,
                                    .ck = 0,
                                    .wv = 13,
                                    .cv = 5,
                                    .wdv = 8,
                                    .cdv = 0},
                                   DType::kF32, 12);
}

TEST(AttentionView, ClearErrors) {
  Context cpu = make_context(Device::kCpu);
  const Tensor q = test::random_tensor({1, 4, 2, 16}, DType::kBF16, 1);
  const Tensor wide = test::random_tensor({1, 4, 2, 24}, DType::kBF16, 2);
  expect_error([&] { attention_forward(cpu, {.q = q, .k = q, .v = HeadView(wide, 12, 16)}); },
               {"v", "[12, 28)", "W = 24"});
  expect_error([&] { attention_forward(cpu, {.q = q, .k = HeadView(wide, 0, 8), .v = q}); },
               {"k", "D = 16"});
  const auto f = attention_forward(cpu, {.q = q, .k = q, .v = q});
  const Tensor other = test::random_tensor({1, 4, 3, 24}, DType::kBF16, 3);
  expect_error(
      [&] {
        attention_backward(cpu, {.q = q,
                                 .k = q,
                                 .v = q,
                                 .o = f.o,
                                 .lse = f.lse,
                                 .grad_o = f.o,
                                 .grad_v_into = HeadView(other, 8, 16)});
      },
      {"grad_v_into", "[1, 4, 2, 24]"});
}

}  // namespace
}  // namespace octet
