// CPU tests of ops/gemm: the reference against FP64, the recipe's error budget, the emulated
// accumulator, the += contract and the messages for what is not supported.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "gemm_test_util.h"
#include "ops/cast/cast.h"

namespace octet::test {
namespace {

struct Shape3 {
  int64_t m, n, k;
};

Context& cpu_ctx() {
  static Context ctx = make_context(Device::kCpu);
  return ctx;
}

std::vector<double> run_cpu(const GemmCase& c, DType out, AccumulatorEmulation emu = {}) {
  Tensor d = make_output(c.op_a().rows(), c.op_b().rows(), out);
  GemmFp8Args args;
  args.a = c.op_a();
  args.b = c.op_b();
  args.d = d;
  args.emulation = emu;
  gemm_fp8(cpu_ctx(), args);
  return to_doubles(d);
}

class GemmRecipeTest : public ::testing::TestWithParam<std::tuple<Recipe, Pass>> {};

// Odd shapes: M = 1, primes, K not a multiple of 128, N not a multiple of the 128x128 block.
TEST_P(GemmRecipeTest, MatchesFp64OfDequantizedInputs) {
  const auto [recipe, pass] = GetParam();
  for (const Shape3 s :
       {Shape3{1, 64, 256}, Shape3{37, 129, 200}, Shape3{130, 61, 384}, Shape3{5, 7, 1}}) {
    const GemmCase c = make_case(cpu_ctx(), recipe, pass, s.m, s.n, s.k, 1000 + s.m);
    const std::vector<double> ref = dequantized_reference(cpu_ctx(), c);
    const std::vector<double> got = run_cpu(c, DType::kF32);
    EXPECT_LE(rel_frobenius(ref, got), 1e-5) << c.name << ": " << worst_element(ref, got, s.n);
    const std::vector<double> got_bf16 = run_cpu(c, DType::kBF16);
    EXPECT_LE(rel_frobenius(ref, got_bf16), 4e-3)
        << c.name << " bf16 out: " << worst_element(ref, got_bf16, s.n);
  }
}

// DeepGEMM's gate against the unquantized inputs: the recipe's error budget on Gaussian data.
TEST_P(GemmRecipeTest, CalcDiffAgainstUnquantizedInputs) {
  const auto [recipe, pass] = GetParam();
  const GemmCase c = make_case(cpu_ctx(), recipe, pass, 96, 80, 640, 7);
  const std::vector<double> ref = gemm_f64(c.a, c.b);
  const std::vector<double> got = run_cpu(c, DType::kF32);
  // E5M2 gradients (per-tensor recipe, backward) carry 2 mantissa bits: about 4x the E4M3 error.
  const bool e5m2 = recipe == Recipe::kTensor && pass != Pass::kFprop;
  EXPECT_LT(calc_diff(ref, got), e5m2 ? 4e-3 : 1e-3) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    AllRecipes, GemmRecipeTest,
    ::testing::Combine(::testing::Values(Recipe::kTensor, Recipe::kRow, Recipe::kBlockwise),
                       ::testing::Values(Pass::kFprop, Pass::kDgrad, Pass::kWgrad)),
    [](const auto& info) {
      return std::string(recipe_name(std::get<0>(info.param))) + "_" +
             pass_name(std::get<1>(info.param));
    });

// DeepSeek-V3 section 3.3.2: a ~14-bit accumulator loses accuracy as K grows; promoting into FP32
// every 128 elements bounds the loss independently of K.
TEST(GemmEmulation, PromotionBoundsTheLimitedAccumulatorError) {
  auto err = [](int64_t k, AccumulatorEmulation emu) {
    const GemmCase c = make_case(cpu_ctx(), Recipe::kTensor, Pass::kFprop, 8, 8, k, 99);
    return rel_frobenius(dequantized_reference(cpu_ctx(), c), run_cpu(c, DType::kF32, emu));
  };
  const double never_short = err(512, AccumulatorEmulation::hopper(0));
  const double never_long = err(8192, AccumulatorEmulation::hopper(0));
  const double promoted_long = err(8192, AccumulatorEmulation::hopper(128));
  const double fp32_long = err(8192, AccumulatorEmulation::fp32());
  EXPECT_GT(never_long, 5e-3) << "14-bit accumulator without promotion at K=8192";
  EXPECT_GT(never_long, 8 * never_short) << "the error must grow with K";
  EXPECT_LT(promoted_long, 1e-3) << "promotion every 128";
  EXPECT_LT(promoted_long * 20, never_long);
  EXPECT_LT(fp32_long, 1e-6);
}

TEST(GemmEmulation, FullMantissaTruncationIsCloseToFp32) {
  const GemmCase c = make_case(cpu_ctx(), Recipe::kBlockwise, Pass::kFprop, 16, 16, 1024, 5);
  const std::vector<double> ref = dequantized_reference(cpu_ctx(), c);
  EXPECT_LE(rel_frobenius(ref, run_cpu(c, DType::kF32, {23, 128})), 1e-6);
}

TEST(Gemm, AccumulateAddsIntoFp32Destination) {
  const GemmCase c = make_case(cpu_ctx(), Recipe::kBlockwise, Pass::kWgrad, 33, 70, 256, 3);
  Tensor fresh = make_output(33, 70, DType::kF32);
  GemmFp8Args args;
  args.a = c.op_a();
  args.b = c.op_b();
  args.d = fresh;
  gemm_fp8(cpu_ctx(), args);
  Tensor acc = random_tensor({33, 70}, DType::kF32, 4);
  const std::vector<double> before = to_doubles(acc);
  args.d = acc;
  args.accumulate = Accumulate::kAdd;
  gemm_fp8(cpu_ctx(), args);
  for (int64_t i = 0; i < acc.numel(); ++i) {
    const float want = static_cast<float>(before[i]) + fresh.data_as<float>()[i];
    ASSERT_EQ(acc.data_as<float>()[i], want) << "element " << i;
  }
}

TEST(Gemm, EveryOutputElementIsWritten) {
  const GemmCase c = make_case(cpu_ctx(), Recipe::kRow, Pass::kFprop, 9, 11, 48, 8);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor d1 = make_output(9, 11, dt, 0xA5), d2 = make_output(9, 11, dt, 0x3C);
    for (Tensor* d : {&d1, &d2}) {
      GemmFp8Args args;
      args.a = c.op_a();
      args.b = c.op_b();
      args.d = *d;
      gemm_fp8(cpu_ctx(), args);
    }
    EXPECT_TRUE(bitwise_equal(d1, d2)) << dtype_name(dt);
  }
}

TEST(Gemm, EmptyKGivesZeros) {
  Tensor a = Tensor::empty({3, 0}, DType::kBF16), b = Tensor::empty({4, 0}, DType::kBF16);
  Tensor d = make_output(3, 4, DType::kF32);
  gemm_bf16(cpu_ctx(), {.a = a, .b = b, .d = d, .accumulate = Accumulate::kOverwrite});
  for (int64_t i = 0; i < d.numel(); ++i) EXPECT_EQ(d.data_as<float>()[i], 0.0f);
}

// An MN-major operand is the transpose of the K-major one: the same D, bit for bit, in every layout
// pair, for = and +=.
TEST(Gemm, Bf16OperandLayoutsAreTransposes) {
  Context& cpu = cpu_ctx();
  const Tensor a = random_tensor({45, 300}, DType::kBF16, 21),
               b = random_tensor({77, 300}, DType::kBF16, 22);
  const Tensor at = transpose(cpu, a), bt = transpose(cpu, b);  // (K, M), (K, N)
  for (Accumulate acc : {Accumulate::kOverwrite, Accumulate::kAdd}) {
    Tensor want = make_output(45, 77, DType::kF32);
    for (int64_t i = 0; i < want.numel(); ++i) want.data_as<float>()[i] = 0.25f * (i % 7);
    Tensor init = want.to(cpu, Device::kCpu);
    gemm_bf16(cpu, {.a = a, .b = b, .d = want, .accumulate = acc});
    for (auto [la, lb] : {std::pair{OperandLayout::kKMajor, OperandLayout::kMNMajor},
                          std::pair{OperandLayout::kMNMajor, OperandLayout::kKMajor},
                          std::pair{OperandLayout::kMNMajor, OperandLayout::kMNMajor}}) {
      Tensor got = init.to(cpu, Device::kCpu);
      gemm_bf16(cpu, {.a = la == OperandLayout::kKMajor ? a : at,
                      .b = lb == OperandLayout::kKMajor ? b : bt,
                      .d = got,
                      .accumulate = acc,
                      .a_layout = la,
                      .b_layout = lb});
      EXPECT_TRUE(bitwise_equal(want, got)) << "layouts " << int(la) << int(lb);
    }
  }
  Tensor d = make_output(45, 77, DType::kF32);
  try {
    gemm_bf16(cpu, {.a = a,
                    .b = b,
                    .d = d,
                    .accumulate = Accumulate::kOverwrite,
                    .a_layout = OperandLayout::kMNMajor});
    ADD_FAILURE() << "A (45, 300) read MN-major has K = 45, B has K = 300: must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("same K"), std::string::npos) << e.what();
  }
}

TEST(Gemm, Bf16MatchesFp64) {
  const Tensor a = random_tensor({45, 300}, DType::kBF16, 11),
               b = random_tensor({77, 300}, DType::kBF16, 12);
  Tensor d = make_output(45, 77, DType::kF32);
  gemm_bf16(cpu_ctx(), {.a = a, .b = b, .d = d, .accumulate = Accumulate::kOverwrite});
  auto widen = [](const Tensor& t) {
    Tensor f = Tensor::empty(t.shape(), DType::kF32);
    for (int64_t i = 0; i < t.numel(); ++i)
      f.data_as<float>()[i] = bf16_to_float(t.data_as<const uint16_t>()[i]);
    return f;
  };
  const std::vector<double> ref = gemm_f64(widen(a), widen(b));
  EXPECT_LE(rel_frobenius(ref, to_doubles(d)), 1e-6);
}

// --- What is not supported, and the message that says so
// --------------------------------------------------

void expect_error(const std::function<void()>& fn, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "expected an error mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

GemmFp8Args args_for(Granularity ga, Fp8Format fa, Granularity gb, Fp8Format fb, int64_t k = 256) {
  const Tensor x = random_tensor({8, k}, DType::kF32, 1),
               w = random_tensor({16, k}, DType::kF32, 2);
  GemmFp8Args args;
  args.a = rowwise_operand(quant(cpu_ctx(), x, ga, fa, QuantizeOutput::kRowwise));
  args.b = rowwise_operand(quant(cpu_ctx(), w, gb, fb, QuantizeOutput::kRowwise));
  args.d = make_output(8, 16, DType::kF32);
  return args;
}

TEST(GemmErrors, UnsupportedPairings) {
  using G = Granularity;
  using F = Fp8Format;
  expect_error([] { gemm_fp8(cpu_ctx(), args_for(G::kTensor, F::kE5M2, G::kTensor, F::kE5M2)); },
               "E5M2 x E5M2");
  expect_error([] { gemm_fp8(cpu_ctx(), args_for(G::k128x128, F::kE4M3, G::k128x128, F::kE4M3)); },
               "128x128 x 128x128");
  expect_error([] { gemm_fp8(cpu_ctx(), args_for(G::kTensor, F::kE4M3, G::kRow, F::kE4M3)); },
               "supported pairings");
  expect_error([] { gemm_fp8(cpu_ctx(), args_for(G::k1x128, F::kE4M3, G::kTensor, F::kE4M3)); },
               "supported pairings");
  expect_error([] { gemm_fp8(cpu_ctx(), args_for(G::k128x1, F::kE4M3, G::k128x1, F::kE4M3)); },
               "128x1");
  expect_error(
      [] {
        GemmFp8Args a = args_for(G::k1x128, F::kE4M3, G::k128x128, F::kE4M3);
        a.accumulation = Accumulation::kFast;
        gemm_fp8(cpu_ctx(), a);
      },
      "fast accumulation");
  // Mixed formats and fast accumulation with per-tensor scales are fine.
  GemmFp8Args ok = args_for(G::kTensor, F::kE5M2, G::kTensor, F::kE4M3);
  ok.accumulation = Accumulation::kFast;
  EXPECT_NO_THROW(gemm_fp8(cpu_ctx(), ok));
}

TEST(GemmErrors, ShapesAndDestination) {
  using G = Granularity;
  using F = Fp8Format;
  expect_error(
      [] {
        GemmFp8Args a = args_for(G::kRow, F::kE4M3, G::kRow, F::kE4M3);
        a.d = make_output(8, 15, DType::kF32);
        gemm_fp8(cpu_ctx(), a);
      },
      "expected shape [8, 16]");
  expect_error(
      [] {
        GemmFp8Args a = args_for(G::kRow, F::kE4M3, G::kRow, F::kE4M3);
        a.d = make_output(8, 16, DType::kBF16);
        a.accumulate = Accumulate::kAdd;
        gemm_fp8(cpu_ctx(), a);
      },
      "F32 destination");
  expect_error(
      [] {
        GemmFp8Args a = args_for(G::kRow, F::kE4M3, G::kRow, F::kE4M3);
        a.b = args_for(G::kRow, F::kE4M3, G::kRow, F::kE4M3, 128).b;
        gemm_fp8(cpu_ctx(), a);
      },
      "same K");
  expect_error(
      [] {
        GemmFp8Args a = args_for(G::k1x128, F::kE4M3, G::k128x128, F::kE4M3);
        a.b.scale_inv = a.a.scale_inv;
        gemm_fp8(cpu_ctx(), a);
      },
      "scale_inv");
  expect_error(
      [] {
        const Tensor x = random_tensor({8, 64}, DType::kF32, 1);
        columnwise_operand(quant(cpu_ctx(), x, G::k1x128, F::kE4M3, QuantizeOutput::kRowwise));
      },
      "no column-wise copy");
}

}  // namespace
}  // namespace octet::test
