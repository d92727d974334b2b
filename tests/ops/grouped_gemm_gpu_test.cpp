// GPU tests of ops/grouped_gemm: CUDA against the CPU reference for MoE layouts with empty and
// skewed experts, FP8 and BF16, Fprop/Dgrad and Wgrad (= and +=), outputs poisoned with NaN before
// the call.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "backend/backend.h"
#include "grouped_gemm_test_util.h"

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

Fp8Operand to_gpu(const Fp8Operand& op) {
  Fp8Operand o = op;
  o.data = op.data.to(gpu(), Device::kCuda);
  o.scale_inv = op.scale_inv.to(gpu(), Device::kCuda);
  return o;
}

Tensor dev(const Tensor& t) {
  return t.to(gpu(), Device::kCuda);
}

// FP8 against the CPU reference: see kFp8Tol in gemm_gpu_test.cpp (Hopper's ~14-bit adds inside
// each 128-element chunk give about 1.3e-4).
constexpr double kFp8Tol = 2.5e-4;

void expect_close(const Tensor& cpu_out, const Tensor& gpu_out, double tol,
                  const std::string& what) {
  const std::vector<double> ref = to_doubles(cpu_out), got = to_doubles(gpu_out.to_host(gpu()));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(std::isfinite(got[i]))
        << what << ": element " << i << " (row " << i / cpu_out.cols() << ") is " << got[i]
        << " (not written?)";
  const double err = rel_frobenius(ref, got);
  std::printf("  %-50s rel err vs CPU reference %.3e\n", what.c_str(), err);
  EXPECT_LE(err, tol) << what << ": " << worst_element(ref, got, cpu_out.cols());
}

// X as the MoE layer makes its Wgrad operand: 1x128 rows with power-of-2 scales, then the
// scaling-aware transpose's 128x128 column-wise copy (CPU).
QuantTensor transposed_pow2(const Tensor& x) {
  QuantizeArgs qa;
  qa.input = x;
  qa.granularity = Granularity::k1x128;
  qa.rounding = ScaleRounding::kPow2;
  QuantTensor qx = quantize(cpu(), qa);
  scaling_aware_transpose(cpu(), qx);
  return qx;
}

const std::vector<std::vector<int64_t>> kLayouts = {
    {0, 37, 0, 200, 19, 1, 0, 300},  // 8 experts, empty and skewed
    {512, 0, 0, 0, 0, 0, 0, 1},      // nearly everything on one expert
    {16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16},  // balanced, small
};

TEST(GroupedGemmGpu, Fp8FpropMatchesCpu) {
  OCTET_REQUIRE_GPU();
  for (const auto& sizes : kLayouts) {
    // K of 4, 2, 1, 3 and 5 tiles of 128: each path of the Hopper kernel's K loop, which promotes
    // K tiles in pairs (grouped_gemm_sm90_overlap_mma.cuh).
    for (const auto [n, k] :
         {std::pair<int64_t, int64_t>{256, 512}, {72, 208}, {136, 128}, {128, 384}, {64, 640}}) {
      const int64_t rows = static_cast<int64_t>(total(sizes)),
                    experts = static_cast<int64_t>(sizes.size());
      const Tensor x = random_tensor({rows, k}, DType::kF32, 1);
      const QuantTensor qx =
          quant(cpu(), x, Granularity::k1x128, Fp8Format::kE4M3, QuantizeOutput::kRowwise);
      std::vector<Tensor> w;
      for (int64_t e = 0; e < experts; ++e)
        w.push_back(random_tensor({n, k}, DType::kF32, 100 + e));
      const StackedWeights sw = stack_experts(cpu(), w);
      for (DType out : {DType::kF32, DType::kBF16}) {
        Tensor dc = make_output(rows, n, out);
        grouped_gemm_fp8(cpu(), {.a = rowwise_operand(qx),
                                 .b = sw.op,
                                 .group_sizes = group_sizes_tensor(sizes, DType::kI32),
                                 .d = dc});
        Tensor dg = dev(make_output(rows, n, out, 0xFF));
        grouped_gemm_fp8(gpu(), {.a = to_gpu(rowwise_operand(qx)),
                                 .b = to_gpu(sw.op),
                                 .group_sizes = dev(group_sizes_tensor(sizes, DType::kI64)),
                                 .d = dg});
        expect_close(dc, dg, out == DType::kF32 ? kFp8Tol : 4e-3,
                     "fp8 fprop E=" + std::to_string(experts) + " N=" + std::to_string(n) +
                         " K=" + std::to_string(k) + " " + std::string(dtype_name(out)));
      }
    }
  }
}

// The model's shapes (the baseline's expert gate/up and down projections, N = 704 not a multiple of
// 128), 32 experts with 128-padded counts, and a padded layout whose tail rows past the experts'
// sum must come back zero. On Hopper with CUTLASS these run as one grouped launch that reads the
// counts on the device (grouped_gemm_sm90_fp8_blockwise.cu).
TEST(GroupedGemmGpu, Fp8FpropModelShapesAndPaddedTail) {
  OCTET_REQUIRE_GPU();
  std::vector<int64_t> sizes(32);
  for (size_t e = 0; e < sizes.size(); ++e) sizes[e] = 128 * ((e * 7) % 3);    // 0..256, some empty
  const int64_t used = static_cast<int64_t>(total(sizes)), rows = used + 300;  // 300 tail rows
  const int64_t experts = static_cast<int64_t>(sizes.size());
  for (const auto [n, k] : {std::pair<int64_t, int64_t>{1408, 1024}, {1024, 704}, {704, 1024}}) {
    const Tensor x = random_tensor({rows, k}, DType::kF32, 7);
    const QuantTensor qx =
        quant(cpu(), x, Granularity::k1x128, Fp8Format::kE4M3, QuantizeOutput::kRowwise);
    std::vector<Tensor> w;
    for (int64_t e = 0; e < experts; ++e) w.push_back(random_tensor({n, k}, DType::kF32, 300 + e));
    const StackedWeights sw = stack_experts(cpu(), w);
    Tensor dc = make_output(rows, n, DType::kBF16);
    grouped_gemm_fp8(cpu(), {.a = rowwise_operand(qx),
                             .b = sw.op,
                             .group_sizes = group_sizes_tensor(sizes, DType::kI32),
                             .d = dc});
    Tensor dg = dev(make_output(rows, n, DType::kBF16, 0xFF));
    grouped_gemm_fp8(gpu(), {.a = to_gpu(rowwise_operand(qx)),
                             .b = to_gpu(sw.op),
                             .group_sizes = dev(group_sizes_tensor(sizes, DType::kI32)),
                             .d = dg});
    const Tensor got = dg.to_host(gpu());
    for (int64_t i = used * n; i < rows * n; ++i)
      ASSERT_EQ(got.data_as<const uint16_t>()[i], 0) << "tail row " << i / n << " not zeroed";
    expect_close(dc, dg, 4e-3,
                 "fp8 fprop model shape E=32 N=" + std::to_string(n) + " K=" + std::to_string(k));
    // Bitwise the same on a second run.
    Tensor dg2 = dev(make_output(rows, n, DType::kBF16, 0xFF));
    grouped_gemm_fp8(gpu(), {.a = to_gpu(rowwise_operand(qx)),
                             .b = to_gpu(sw.op),
                             .group_sizes = dev(group_sizes_tensor(sizes, DType::kI32)),
                             .d = dg2});
    EXPECT_TRUE(bitwise_equal(got, dg2.to_host(gpu()))) << "two runs differ, N=" << n;
  }
}

TEST(GroupedGemmGpu, Bf16FpropMatchesCpu) {
  OCTET_REQUIRE_GPU();
  const std::vector<int64_t>& sizes = kLayouts[0];
  const int64_t rows = static_cast<int64_t>(total(sizes)),
                experts = static_cast<int64_t>(sizes.size()), n = 136, k = 200;
  const Tensor a = random_tensor({rows, k}, DType::kBF16, 1),
               b = random_tensor({experts, n, k}, DType::kBF16, 2);
  Tensor dc = make_output(rows, n, DType::kF32);
  grouped_gemm_bf16(
      cpu(), {.a = a, .b = b, .group_sizes = group_sizes_tensor(sizes, DType::kI32), .d = dc});
  Tensor dg = dev(make_output(rows, n, DType::kF32, 0xFF));
  grouped_gemm_bf16(gpu(), {.a = dev(a),
                            .b = dev(b),
                            .group_sizes = dev(group_sizes_tensor(sizes, DType::kI32)),
                            .d = dg});
  expect_close(dc, dg, 1e-5, "bf16 fprop");
}

// The BF16 experts as the MoE layer runs them on Hopper: BF16 D overwritten (a padded tail zeroed),
// Wgrad from the forward's dY and X accumulated into F32, model shapes, empty and unaligned
// experts; one grouped launch each with the counts read on the device (no host wait).
TEST(GroupedGemmGpu, Bf16OnTheDeviceModelShapes) {
  OCTET_REQUIRE_GPU();
  std::vector<int64_t> sizes(32);
  for (size_t e = 0; e < sizes.size(); ++e) sizes[e] = (e * 37) % 5 == 0 ? 0 : 3 + (e * 53) % 97;
  const int64_t used = static_cast<int64_t>(total(sizes)), rows = used + 40, experts = 32;
  for (const auto [n, k] : {std::pair<int64_t, int64_t>{1408, 1024}, {1024, 704}, {72, 200}}) {
    const std::string shape = " N=" + std::to_string(n) + " K=" + std::to_string(k);
    const Tensor a = random_tensor({rows, k}, DType::kBF16, 21),
                 b = random_tensor({experts, n, k}, DType::kBF16, 22);
    const Tensor sizes_t = group_sizes_tensor(sizes, DType::kI32);
    Tensor dc = make_output(rows, n, DType::kBF16);
    grouped_gemm_bf16(cpu(), {.a = a, .b = b, .group_sizes = sizes_t, .d = dc});
    Tensor dg = dev(make_output(rows, n, DType::kBF16, 0xFF));
    const Tensor ga = dev(a), gb = dev(b), gs = dev(sizes_t);
    int64_t before = gpu().be().host_waits();
    grouped_gemm_bf16(gpu(), {.a = ga, .b = gb, .group_sizes = gs, .d = dg});
    EXPECT_EQ(gpu().be().host_waits(), before) << "the fprop read the counts on the host";
    expect_close(dc, dg, 5e-3, "bf16 fprop, bf16 out" + shape);
    const Tensor got = dg.to_host(gpu());
    for (int64_t i = used * n; i < rows * n; ++i)
      ASSERT_EQ(got.data_as<uint16_t>()[i], 0) << "padded tail not zeroed" << shape;

    // Wgrad: dW_e += dY_e^T X_e with dY (rows, n) and X (rows, k) as the forward has them.
    const Tensor dy = random_tensor({rows, n}, DType::kBF16, 23);
    const Tensor init = random_tensor({experts * n, k}, DType::kF32, 24);
    Tensor wc = init.to_host(cpu());
    grouped_wgrad_bf16(cpu(), {.a = dy,
                               .b = a,
                               .group_sizes = sizes_t,
                               .d = wc.reshape({experts, n, k}),
                               .accumulate = Accumulate::kAdd,
                               .layout = OperandLayout::kMNMajor});
    Tensor wg = dev(init);
    const Tensor gdy = dev(dy);
    before = gpu().be().host_waits();
    grouped_wgrad_bf16(gpu(), {.a = gdy,
                               .b = ga,
                               .group_sizes = gs,
                               .d = wg.reshape({experts, n, k}),
                               .accumulate = Accumulate::kAdd,
                               .layout = OperandLayout::kMNMajor});
    EXPECT_EQ(gpu().be().host_waits(), before) << "the wgrad read the counts on the host";
    expect_close(wc, wg, 1e-5, "bf16 wgrad += from dY and X" + shape);
    const Tensor w = wg.to_host(gpu());
    for (int64_t e = 0; e < experts; ++e)
      if (sizes[static_cast<size_t>(e)] == 0)
        ASSERT_EQ(std::memcmp(w.data_as<float>() + e * n * k, init.data_as<float>() + e * n * k,
                              static_cast<size_t>(n * k * 4)),
                  0)
            << "expert " << e << " has no tokens but its dW changed" << shape;
    // Deterministic: the same bits again.
    Tensor wg2 = dev(init);
    grouped_wgrad_bf16(gpu(), {.a = gdy,
                               .b = ga,
                               .group_sizes = gs,
                               .d = wg2.reshape({experts, n, k}),
                               .accumulate = Accumulate::kAdd,
                               .layout = OperandLayout::kMNMajor});
    EXPECT_TRUE(bitwise_equal(w, wg2.to_host(gpu()))) << "two runs differ" << shape;
  }
}

// DeepSeek-V3's Wgrad pairing as the MoE layer makes it: dY's column-wise copy 1x128 along tokens,
// X's from the scaling-aware transpose (128x128), += into F32 dW, 128-padded experts, some empty
// (their dW must stay as it was), the model's shapes. On Hopper with CUTLASS this is one grouped
// launch that reads the counts on the device.
TEST(GroupedGemmGpu, Fp8WgradFromScalingAwareTransposeModelShapes) {
  OCTET_REQUIRE_GPU();
  std::vector<int64_t> sizes(32);
  for (size_t e = 0; e < sizes.size(); ++e) sizes[e] = 128 * ((e * 5) % 3);  // some empty
  const int64_t t = static_cast<int64_t>(total(sizes)) + 128, experts = 32;  // + a padded tail
  for (const auto [n, k] : {std::pair<int64_t, int64_t>{1408, 1024}, {1024, 704}}) {
    const Tensor dy = random_tensor({t, n}, DType::kF32, 13),
                 x = random_tensor({t, k}, DType::kF32, 14);
    const QuantTensor qdy =
        quant(cpu(), dy, Granularity::k1x128, Fp8Format::kE4M3, QuantizeOutput::kColumnwise);
    const QuantTensor qx = transposed_pow2(x);
    const Tensor sizes_t = group_sizes_tensor(sizes, DType::kI32);
    Tensor dc = random_tensor({experts * n, k}, DType::kF32, 15);
    Tensor dg = dev(dc);
    grouped_wgrad_fp8(cpu(), {.a = columnwise_operand(qdy),
                              .b = columnwise_operand(qx),
                              .group_sizes = sizes_t,
                              .d = dc.reshape({experts, n, k}),
                              .accumulate = Accumulate::kAdd});
    grouped_wgrad_fp8(gpu(), {.a = to_gpu(columnwise_operand(qdy)),
                              .b = to_gpu(columnwise_operand(qx)),
                              .group_sizes = dev(sizes_t),
                              .d = dg.reshape({experts, n, k}),
                              .accumulate = Accumulate::kAdd});
    expect_close(
        dc, dg, kFp8Tol,
        "fp8 wgrad += (128x128 B) E=32 N=" + std::to_string(n) + " K=" + std::to_string(k));
    const Tensor got = dg.to_host(gpu()), init = random_tensor({experts * n, k}, DType::kF32, 15);
    for (int64_t e = 0; e < experts; ++e)
      if (sizes[static_cast<size_t>(e)] == 0)
        ASSERT_EQ(std::memcmp(got.data_as<float>() + e * n * k, init.data_as<float>() + e * n * k,
                              static_cast<size_t>(n * k * 4)),
                  0)
            << "expert " << e << " has no tokens but its dW changed";
    // dW = (the step's first writer of the gradient: the E4M3 instantiation without C), over a dW
    // of NaN bytes: nothing of it is read, and the empty experts' dW_e become 0.
    Tensor oc = make_output(experts * n, k, DType::kF32);
    Tensor og = dev(make_output(experts * n, k, DType::kF32, 0xFF));
    const GroupedWgradFp8Args over{.a = to_gpu(columnwise_operand(qdy)),
                                   .b = to_gpu(columnwise_operand(qx)),
                                   .group_sizes = dev(sizes_t),
                                   .d = og.reshape({experts, n, k}),
                                   .accumulate = Accumulate::kOverwrite};
    ASSERT_TRUE(grouped_wgrad_fp8_overwrites(gpu(), over)) << "the CUTLASS dW = path";
    grouped_wgrad_fp8(cpu(), {.a = columnwise_operand(qdy),
                              .b = columnwise_operand(qx),
                              .group_sizes = sizes_t,
                              .d = oc.reshape({experts, n, k}),
                              .accumulate = Accumulate::kOverwrite});
    grouped_wgrad_fp8(gpu(), over);
    expect_close(oc, og, kFp8Tol,
                 "fp8 wgrad = (128x128 B) E=32 N=" + std::to_string(n) + " K=" + std::to_string(k));
    const Tensor over_got = og.to_host(gpu());
    for (int64_t e = 0; e < experts; ++e)
      if (sizes[static_cast<size_t>(e)] == 0)
        for (int64_t i = 0; i < n * k; ++i)
          ASSERT_EQ(over_got.data_as<float>()[e * n * k + i], 0.0f)
              << "expert " << e << " has no tokens: dW = 0, element " << i;
  }
}

// The per-tensor recipes' backward on Hopper: E5M2 gradients x E4M3 weights / X (the E5M2
// instantiations), Dgrad into BF16 and Wgrad += into F32, 128-padded experts (some empty) and a
// padded tail, K = 704; one grouped launch each, no host wait.
TEST(GroupedGemmGpu, Fp8E5m2GradientsDgradAndWgrad) {
  OCTET_REQUIRE_GPU();
  std::vector<int64_t> sizes(32);
  for (size_t e = 0; e < sizes.size(); ++e) sizes[e] = 128 * ((e * 7) % 3);
  const int64_t used = static_cast<int64_t>(total(sizes)), t = used + 128, experts = 32;
  const int64_t n = 1024, k = 704;  // dY (t, n); W_e (n, k); X (t, k)
  const Tensor dy = random_tensor({t, n}, DType::kF32, 31),
               x = random_tensor({t, k}, DType::kF32, 32);
  const QuantTensor qdy =
      quant(cpu(), dy, Granularity::k1x128, Fp8Format::kE5M2, QuantizeOutput::kBoth);
  std::vector<Tensor> wt;  // W_e^T (k, n), as Dgrad reads it
  for (int64_t e = 0; e < experts; ++e) wt.push_back(random_tensor({k, n}, DType::kF32, 400 + e));
  const StackedWeights sw = stack_experts(cpu(), wt);
  const Tensor sizes_t = group_sizes_tensor(sizes, DType::kI32), gs = dev(sizes_t);
  Tensor dc = make_output(t, k, DType::kBF16);
  grouped_gemm_fp8(cpu(), {.a = rowwise_operand(qdy), .b = sw.op, .group_sizes = sizes_t, .d = dc});
  Tensor dg = dev(make_output(t, k, DType::kBF16, 0xFF));
  const Fp8Operand ga = to_gpu(rowwise_operand(qdy)), gb = to_gpu(sw.op);
  gpu().synchronize();
  int64_t before = gpu().be().host_waits();
  grouped_gemm_fp8(gpu(), {.a = ga, .b = gb, .group_sizes = gs, .d = dg});
  EXPECT_EQ(gpu().be().host_waits(), before) << "the E5M2 dgrad read the counts on the host";
  expect_close(dc, dg, 4e-3, "fp8 dgrad E5M2 x E4M3 E=32 N=704 K=1024");
  const Tensor got = dg.to_host(gpu());
  for (int64_t i = used * k; i < t * k; ++i)
    ASSERT_EQ(got.data_as<const uint16_t>()[i], 0) << "tail row " << i / k << " not zeroed";

  const QuantTensor qx = transposed_pow2(x);
  Tensor wc = random_tensor({experts * n, k}, DType::kF32, 33);
  Tensor wg = dev(wc);
  grouped_wgrad_fp8(cpu(), {.a = columnwise_operand(qdy),
                            .b = columnwise_operand(qx),
                            .group_sizes = sizes_t,
                            .d = wc.reshape({experts, n, k}),
                            .accumulate = Accumulate::kAdd});
  const Fp8Operand wa = to_gpu(columnwise_operand(qdy)), wb = to_gpu(columnwise_operand(qx));
  gpu().synchronize();
  before = gpu().be().host_waits();
  grouped_wgrad_fp8(gpu(), {.a = wa,
                            .b = wb,
                            .group_sizes = gs,
                            .d = wg.reshape({experts, n, k}),
                            .accumulate = Accumulate::kAdd});
  EXPECT_EQ(gpu().be().host_waits(), before) << "the E5M2 wgrad read the counts on the host";
  expect_close(wc, wg, kFp8Tol, "fp8 wgrad += E5M2 x E4M3 (128x128 B) E=32 N=1024 K=704");
}

// The Wgrad's setup kernel builds a table of the experts in shared memory, four experts a thread of
// its block: 300 experts (several a thread, a last thread with fewer), int64 counts, most experts
// empty and one of 2048 tokens, as real routing skews them; dW = (the empty experts' dW_e zeroed,
// over NaN bytes) and dW +=.
TEST(GroupedGemmGpu, Fp8WgradManySkewedExperts) {
  OCTET_REQUIRE_GPU();
  const int64_t experts = 300, n = 256, k = 136;
  std::vector<int64_t> sizes(static_cast<size_t>(experts), 0);
  for (size_t e = 0; e < sizes.size(); e += 7) sizes[e] = 128 * static_cast<int64_t>((e / 7) % 4);
  sizes[150] = 2048;
  const int64_t t = static_cast<int64_t>(total(sizes)) + 128;  // + a padded tail
  const Tensor dy = random_tensor({t, n}, DType::kF32, 41),
               x = random_tensor({t, k}, DType::kF32, 42);
  const QuantTensor qdy =
      quant(cpu(), dy, Granularity::k1x128, Fp8Format::kE4M3, QuantizeOutput::kColumnwise);
  const QuantTensor qx = transposed_pow2(x);
  const Tensor sizes_t = group_sizes_tensor(sizes, DType::kI64);
  for (Accumulate acc : {Accumulate::kOverwrite, Accumulate::kAdd}) {
    const bool add = acc == Accumulate::kAdd;
    Tensor dc = add ? random_tensor({experts * n, k}, DType::kF32, 43)
                    : make_output(experts * n, k, DType::kF32);
    Tensor dg = add ? dev(dc) : dev(make_output(experts * n, k, DType::kF32, 0xFF));
    const GroupedWgradFp8Args on_gpu{.a = to_gpu(columnwise_operand(qdy)),
                                     .b = to_gpu(columnwise_operand(qx)),
                                     .group_sizes = dev(sizes_t),
                                     .d = dg.reshape({experts, n, k}),
                                     .accumulate = acc};
    if (!add) ASSERT_TRUE(grouped_wgrad_fp8_overwrites(gpu(), on_gpu)) << "the CUTLASS dW = path";
    grouped_wgrad_fp8(cpu(), {.a = columnwise_operand(qdy),
                              .b = columnwise_operand(qx),
                              .group_sizes = sizes_t,
                              .d = dc.reshape({experts, n, k}),
                              .accumulate = acc});
    grouped_wgrad_fp8(gpu(), on_gpu);
    expect_close(dc, dg, kFp8Tol, add ? "fp8 wgrad += E=300 skewed" : "fp8 wgrad = E=300 skewed");
    const Tensor got = dg.to_host(gpu());
    for (int64_t e = 0; e < experts; ++e)
      if (sizes[static_cast<size_t>(e)] == 0)
        ASSERT_EQ(std::memcmp(got.data_as<float>() + e * n * k, dc.data_as<float>() + e * n * k,
                              static_cast<size_t>(n * k * 4)),
                  0)
            << "expert " << e << " has no tokens: its dW must be " << (add ? "unchanged" : "0");
  }
}

TEST(GroupedGemmGpu, Fp8WgradMatchesCpuAndAccumulates) {
  OCTET_REQUIRE_GPU();
  const std::vector<int64_t> sizes{128, 0, 384, 0, 256, 128, 0, 80};  // padded to 128, last partial
  const int64_t t = static_cast<int64_t>(total(sizes)), experts = 8, n = 136, k = 264;
  const Tensor dy = random_tensor({t, n}, DType::kF32, 3),
               x = random_tensor({t, k}, DType::kF32, 4);
  const QuantTensor qdy =
      quant(cpu(), dy, Granularity::k1x128, Fp8Format::kE4M3, QuantizeOutput::kColumnwise);
  const QuantTensor qx =
      quant(cpu(), x, Granularity::k1x128, Fp8Format::kE4M3, QuantizeOutput::kColumnwise);
  const Tensor sizes_t = group_sizes_tensor(sizes, DType::kI32);
  for (Accumulate acc : {Accumulate::kOverwrite, Accumulate::kAdd}) {
    Tensor dc = acc == Accumulate::kAdd ? random_tensor({experts * n, k}, DType::kF32, 5)
                                        : make_output(experts * n, k, DType::kF32);
    Tensor dg =
        acc == Accumulate::kAdd ? dev(dc) : dev(make_output(experts * n, k, DType::kF32, 0xFF));
    grouped_wgrad_fp8(cpu(), {.a = columnwise_operand(qdy),
                              .b = columnwise_operand(qx),
                              .group_sizes = sizes_t,
                              .d = dc.reshape({experts, n, k}),
                              .accumulate = acc});
    grouped_wgrad_fp8(gpu(), {.a = to_gpu(columnwise_operand(qdy)),
                              .b = to_gpu(columnwise_operand(qx)),
                              .group_sizes = dev(sizes_t),
                              .d = dg.reshape({experts, n, k}),
                              .accumulate = acc});
    expect_close(dc, dg, kFp8Tol, acc == Accumulate::kAdd ? "fp8 wgrad +=" : "fp8 wgrad =");
  }
}

TEST(GroupedGemmGpu, Bf16WgradMatchesCpu) {
  OCTET_REQUIRE_GPU();
  const std::vector<int64_t> sizes{10, 0, 57, 3};
  const int64_t t = 70, n = 48, k = 40;
  const Tensor a = random_tensor({n, t}, DType::kBF16, 1),
               b = random_tensor({k, t}, DType::kBF16, 2);
  Tensor dc = make_output(4 * n, k, DType::kF32);
  grouped_wgrad_bf16(cpu(), {.a = a,
                             .b = b,
                             .group_sizes = group_sizes_tensor(sizes, DType::kI64),
                             .d = dc.reshape({4, n, k}),
                             .accumulate = Accumulate::kOverwrite});
  Tensor dg = dev(make_output(4 * n, k, DType::kF32, 0xFF));
  grouped_wgrad_bf16(gpu(), {.a = dev(a),
                             .b = dev(b),
                             .group_sizes = dev(group_sizes_tensor(sizes, DType::kI64)),
                             .d = dg.reshape({4, n, k}),
                             .accumulate = Accumulate::kOverwrite});
  expect_close(dc, dg, 1e-5, "bf16 wgrad (unaligned token offsets)");
}

}  // namespace
}  // namespace octet::test
