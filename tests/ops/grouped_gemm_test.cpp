// CPU tests of ops/grouped_gemm: every expert equals the dense GEMM on its slice, empty experts,
// the Wgrad += contract, and the layout rules.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "grouped_gemm_test_util.h"
#include "ops/cast/cast.h"

namespace octet::test {
namespace {

Context& cpu_ctx() {
  static Context ctx = make_context(Device::kCpu);
  return ctx;
}

void expect_error(const std::function<void()>& fn, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "expected an error mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

struct FpropSetup {
  std::vector<int64_t> sizes;
  int64_t n, k;
  Tensor x;  // (sum M_e, K) f32
  QuantTensor qx;
  StackedWeights w;
};

FpropSetup fprop_setup(const std::vector<int64_t>& sizes, int64_t n, int64_t k, uint64_t seed) {
  FpropSetup s{sizes, n, k, {}, {}, {}};
  s.x = random_tensor({static_cast<int64_t>(total(sizes)), k}, DType::kF32, seed);
  s.qx = quant(cpu_ctx(), s.x, Granularity::k1x128, Fp8Format::kE4M3, QuantizeOutput::kRowwise);
  std::vector<Tensor> w;
  for (size_t e = 0; e < sizes.size(); ++e)
    w.push_back(random_tensor({n, k}, DType::kF32, seed + 10 + e));
  s.w = stack_experts(cpu_ctx(), w);
  return s;
}

// Empty and skewed experts; N not a multiple of 128 (rank-3 weight scales), K not a multiple of
// 128.
TEST(GroupedGemm, Fp8EqualsDenseGemmPerExpert) {
  const FpropSetup s = fprop_setup({0, 37, 0, 200, 19, 1}, 72, 200, 21);
  for (DType sizes_dt : {DType::kI32, DType::kI64}) {
    Tensor d = make_output(s.x.rows(), s.n, DType::kF32);
    grouped_gemm_fp8(cpu_ctx(), {.a = rowwise_operand(s.qx),
                                 .b = s.w.op,
                                 .group_sizes = group_sizes_tensor(s.sizes, sizes_dt),
                                 .d = d});
    const std::vector<int64_t> off = offsets_of(s.sizes);
    const int64_t nb = ceil_div(s.n, kGroup);
    for (size_t e = 0; e < s.sizes.size(); ++e) {
      const int64_t m = s.sizes[e];
      if (m == 0) continue;
      Tensor de = make_output(m, s.n, DType::kF32);
      GemmFp8Args dense;
      dense.a = expert_rows(rowwise_operand(s.qx), off[e], m, off[e], m);
      dense.b =
          expert_rows(s.w.op, static_cast<int64_t>(e) * s.n, s.n, static_cast<int64_t>(e) * nb, nb);
      dense.d = de;
      gemm_fp8(cpu_ctx(), dense);
      EXPECT_TRUE(bitwise_equal(de, host_rows(d, off[e], m))) << "expert " << e;
      // And against FP64 of the dequantized inputs.
      const std::vector<double> ref =
          gemm_f64(host_rows(dequantize(cpu_ctx(), s.qx, DType::kF32), off[e], m),
                   host_rows(s.w.dequantized, static_cast<int64_t>(e) * s.n, s.n));
      EXPECT_LE(rel_frobenius(ref, to_doubles(de)), 1e-5) << "expert " << e;
    }
  }
}

TEST(GroupedGemm, Bf16EqualsDenseGemmPerExpert) {
  const std::vector<int64_t> sizes{3, 0, 50, 0};
  const int64_t n = 40, k = 96, rows = static_cast<int64_t>(total(sizes));
  const Tensor a = random_tensor({rows, k}, DType::kBF16, 3),
               b = random_tensor({4, n, k}, DType::kBF16, 4);
  Tensor d = make_output(rows, n, DType::kBF16);
  grouped_gemm_bf16(
      cpu_ctx(), {.a = a, .b = b, .group_sizes = group_sizes_tensor(sizes, DType::kI64), .d = d});
  const std::vector<int64_t> off = offsets_of(sizes);
  for (size_t e = 0; e < sizes.size(); ++e) {
    if (sizes[e] == 0) continue;
    Tensor de = make_output(sizes[e], n, DType::kBF16);
    gemm_bf16(cpu_ctx(), {.a = host_rows(a, off[e], sizes[e]),
                          .b = host_rows(b.reshape({4 * n, k}), e * n, n),
                          .d = de});
    EXPECT_TRUE(bitwise_equal(de, host_rows(d, off[e], sizes[e]))) << "expert " << e;
  }
}

struct WgradSetup {
  std::vector<int64_t> sizes;
  Tensor dy, x;  // (T, N), (T, K) f32
  QuantTensor qdy, qx;
};

WgradSetup wgrad_setup(const std::vector<int64_t>& sizes, int64_t n, int64_t k, uint64_t seed) {
  WgradSetup s{sizes, {}, {}, {}, {}};
  const int64_t t = static_cast<int64_t>(total(sizes));
  s.dy = random_tensor({t, n}, DType::kF32, seed);
  s.x = random_tensor({t, k}, DType::kF32, seed + 1);
  s.qdy =
      quant(cpu_ctx(), s.dy, Granularity::k1x128, Fp8Format::kE4M3, QuantizeOutput::kColumnwise);
  s.qx = quant(cpu_ctx(), s.x, Granularity::k1x128, Fp8Format::kE4M3, QuantizeOutput::kColumnwise);
  return s;
}

// Experts padded to 128 tokens, one empty, the last one partial.
TEST(GroupedGemm, Fp8WgradMatchesFp64AndAccumulates) {
  const int64_t n = 40, k = 72;
  const WgradSetup s = wgrad_setup({128, 0, 256, 77}, n, k, 31);
  const int64_t experts = 4;
  Tensor dw = random_tensor({experts, n, k}, DType::kF32, 32);
  const std::vector<double> before = to_doubles(dw);
  grouped_wgrad_fp8(cpu_ctx(), {.a = columnwise_operand(s.qdy),
                                .b = columnwise_operand(s.qx),
                                .group_sizes = group_sizes_tensor(s.sizes, DType::kI32),
                                .d = dw,
                                .accumulate = Accumulate::kAdd});
  const Tensor dyt = dequantize(cpu_ctx(), s.qdy, DType::kF32, Copy::kColumnwise);  // (N, T)
  const Tensor xt = dequantize(cpu_ctx(), s.qx, DType::kF32, Copy::kColumnwise);    // (K, T)
  const std::vector<int64_t> off = offsets_of(s.sizes);
  const std::vector<double> after = to_doubles(dw);
  for (int64_t e = 0; e < experts; ++e) {
    const std::vector<double> prod =
        gemm_f64(host_cols(dyt, off[e], s.sizes[e]), host_cols(xt, off[e], s.sizes[e]));
    std::vector<double> ref(prod.size()), got(prod.size());
    for (size_t i = 0; i < prod.size(); ++i) {
      ref[i] = before[e * n * k + i] + prod[i];
      got[i] = after[e * n * k + i];
    }
    if (s.sizes[e] == 0) {
      EXPECT_EQ(ref, got) << "an empty expert's += must leave dW unchanged";
    } else {
      EXPECT_LE(rel_frobenius(prod,
                              [&] {
                                std::vector<double> g(prod.size());
                                for (size_t i = 0; i < g.size(); ++i)
                                  g[i] = got[i] - before[e * n * k + i];
                                return g;
                              }()),
                1e-5)
          << "expert " << e;
    }
  }
  // Overwrite: the empty expert's gradient is zero.
  Tensor dw2 = make_output(experts * n, k, DType::kF32);
  grouped_wgrad_fp8(cpu_ctx(), {.a = columnwise_operand(s.qdy),
                                .b = columnwise_operand(s.qx),
                                .group_sizes = group_sizes_tensor(s.sizes, DType::kI32),
                                .d = dw2.reshape({experts, n, k}),
                                .accumulate = Accumulate::kOverwrite});
  for (int64_t i = 0; i < n * k; ++i) ASSERT_EQ(dw2.data_as<float>()[n * k + i], 0.0f);
}

TEST(GroupedGemm, Bf16WgradEmptyExpertIsZero) {
  const std::vector<int64_t> sizes{5, 0, 9};
  const Tensor a = random_tensor({6, 14}, DType::kBF16, 1),
               b = random_tensor({8, 14}, DType::kBF16, 2);
  Tensor dw = make_output(3 * 6, 8, DType::kF32);
  grouped_wgrad_bf16(cpu_ctx(), {.a = a,
                                 .b = b,
                                 .group_sizes = group_sizes_tensor(sizes, DType::kI32),
                                 .d = dw.reshape({3, 6, 8}),
                                 .accumulate = Accumulate::kOverwrite});
  for (int64_t i = 0; i < 48; ++i) EXPECT_EQ(dw.data_as<float>()[48 + i], 0.0f);
  Tensor d0 = make_output(6, 8, DType::kF32);
  gemm_bf16(cpu_ctx(), {.a = host_cols(a, 0, 5), .b = host_cols(b, 0, 5), .d = d0});
  EXPECT_TRUE(bitwise_equal(d0, host_rows(dw, 0, 6)));
}

// Wgrad from the forward's dY and X (kMNMajor) is the K-major Wgrad of their transposes, bitwise.
TEST(GroupedGemm, Bf16WgradFromDyAndXIsTheTransposedCall) {
  const std::vector<int64_t> sizes{5, 0, 9};
  const Tensor dy = random_tensor({14, 6}, DType::kBF16, 3),
               x = random_tensor({14, 8}, DType::kBF16, 4);
  const Tensor init = random_tensor({3 * 6, 8}, DType::kF32, 5);
  Tensor want = init.to_host(cpu_ctx()), got = init.to_host(cpu_ctx());
  grouped_wgrad_bf16(cpu_ctx(), {.a = transpose(cpu_ctx(), dy),
                                 .b = transpose(cpu_ctx(), x),
                                 .group_sizes = group_sizes_tensor(sizes, DType::kI32),
                                 .d = want.reshape({3, 6, 8})});
  grouped_wgrad_bf16(cpu_ctx(), {.a = dy,
                                 .b = x,
                                 .group_sizes = group_sizes_tensor(sizes, DType::kI32),
                                 .d = got.reshape({3, 6, 8}),
                                 .accumulate = Accumulate::kAdd,
                                 .layout = OperandLayout::kMNMajor});
  EXPECT_TRUE(bitwise_equal(want, got));
  expect_error(
      [&] {
        grouped_wgrad_bf16(cpu_ctx(), {.a = dy,
                                       .b = host_rows(x, 0, 13),
                                       .group_sizes = group_sizes_tensor(sizes, DType::kI32),
                                       .d = got.reshape({3, 6, 8}),
                                       .accumulate = Accumulate::kAdd,
                                       .layout = OperandLayout::kMNMajor});
      },
      "A has 14 tokens and B has 13");
}

TEST(GroupedGemmErrors, LayoutRules) {
  const FpropSetup s = fprop_setup({10, 20}, 64, 128, 5);
  Tensor d = make_output(30, 64, DType::kF32);
  expect_error(
      [&] {
        grouped_gemm_fp8(cpu_ctx(), {.a = rowwise_operand(s.qx),
                                     .b = s.w.op,
                                     .group_sizes = group_sizes_tensor({10, 21}, DType::kI32),
                                     .d = d});
      },
      "sum to 31");
  // Fewer rows than A has: the tail of a padded permute, written as zeros.
  grouped_gemm_fp8(cpu_ctx(), {.a = rowwise_operand(s.qx),
                               .b = s.w.op,
                               .group_sizes = group_sizes_tensor({10, 19}, DType::kI32),
                               .d = d});
  for (int64_t j = 0; j < 64; ++j) EXPECT_EQ(d.data_as<float>()[29 * 64 + j], 0.0f);
  expect_error(
      [&] {
        grouped_gemm_fp8(cpu_ctx(), {.a = rowwise_operand(s.qx),
                                     .b = s.w.op,
                                     .group_sizes = group_sizes_tensor({-1, 31}, DType::kI32),
                                     .d = d});
      },
      "negative");
  expect_error(
      [&] {
        grouped_gemm_fp8(cpu_ctx(), {.a = rowwise_operand(s.qx),
                                     .b = s.w.op,
                                     .group_sizes = group_sizes_tensor({10, 10, 10}, DType::kI32),
                                     .d = d});
      },
      "do not split");
  Fp8Operand flat = s.w.op;
  flat.scale_inv = flat.scale_inv.reshape({2, 1});
  expect_error(
      [&] {
        grouped_gemm_fp8(cpu_ctx(), {.a = rowwise_operand(s.qx),
                                     .b = flat,
                                     .group_sizes = group_sizes_tensor({10, 20}, DType::kI32),
                                     .d = d});
      },
      "rank 3");
  const WgradSetup w = wgrad_setup({100, 28}, 16, 16, 6);
  Tensor dw = make_output(2 * 16, 16, DType::kF32);
  expect_error(
      [&] {
        grouped_wgrad_fp8(cpu_ctx(), {.a = columnwise_operand(w.qdy),
                                      .b = columnwise_operand(w.qx),
                                      .group_sizes = group_sizes_tensor(w.sizes, DType::kI32),
                                      .d = dw.reshape({2, 16, 16})});
      },
      "multiple of 128");
}

}  // namespace
}  // namespace octet::test
