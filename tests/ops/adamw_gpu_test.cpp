// CUDA adamw family against the CPU reference, bit for bit: the AdamW step over several steps with
// and without the optional inputs, the global norm (more tensors than one launch takes, chunk
// edges), the clipping coefficient and the non-finite flag.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "numerics/fp8.h"
#include "ops/adamw/adamw.h"
#include "ops/quantize/quantize.h"
#include "test_util.h"

namespace octet {
namespace {

using test::bitwise_equal;

struct Devices {
  Context cpu = make_context(Device::kCpu);
  Context gpu = make_context(Device::kCuda);
};

Devices& devices() {
  static Devices d;
  return d;
}

Tensor to_gpu(const Tensor& t) {
  return t.to(devices().gpu, Device::kCuda);
}
Tensor to_cpu(const Tensor& t) {
  return t.to_host(devices().gpu);
}

Tensor bf16_of(const Tensor& f, bool absolute) {
  Tensor t = Tensor::empty(f.shape(), DType::kBF16);
  for (int64_t i = 0; i < f.numel(); ++i) {
    const float v = f.data_as<float>()[i];
    t.data_as<uint16_t>()[i] = float_to_bf16(absolute ? std::fabs(v) : v);
  }
  return t;
}

Tensor scalar(DType dt, double v) {
  Tensor t = Tensor::empty({1}, dt);
  if (dt == DType::kF32)
    t.data_as<float>()[0] = static_cast<float>(v);
  else
    t.data_as<int32_t>()[0] = static_cast<int32_t>(v);
  return t;
}

class AdamWGpu : public ::testing::TestWithParam<int64_t> {};

TEST_P(AdamWGpu, StepsMatchCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const int64_t n = GetParam();
  AdamWArgs c{
      .param = test::random_tensor({n}, DType::kF32, 1),
      .grad = Tensor(),
      .exp_avg = bf16_of(test::random_tensor({n}, DType::kF32, 2), false),
      .exp_avg_sq = bf16_of(test::random_tensor({n}, DType::kF32, 3, test::Dist::kWide), true)};
  c.param_bf16 = Tensor::empty({n}, DType::kBF16);
  AdamWArgs g{.param = to_gpu(c.param),
              .grad = Tensor(),
              .exp_avg = to_gpu(c.exp_avg),
              .exp_avg_sq = to_gpu(c.exp_avg_sq)};
  g.param_bf16 = Tensor::empty(gpu, {n}, DType::kBF16);
  for (int64_t step = 1; step <= 4; ++step) {
    SCOPED_TRACE("n = " + std::to_string(n) + ", step " + std::to_string(step));
    c.grad = test::random_tensor({n}, DType::kF32, 10 + step,
                                 step == 2 ? test::Dist::kWide : test::Dist::kOutliers);
    g.grad = to_gpu(c.grad);
    // Step 3 scales the gradient; step 4 is skipped through found_inf.
    c.grad_scale = step == 3 ? scalar(DType::kF32, 0.3) : Tensor();
    g.grad_scale = step == 3 ? to_gpu(c.grad_scale) : Tensor();
    c.found_inf = step == 4 ? scalar(DType::kI32, 1) : Tensor();
    g.found_inf = step == 4 ? to_gpu(c.found_inf) : Tensor();
    for (AdamWArgs* a : {&c, &g}) {
      a->lr = 1e-3f * static_cast<float>(step);
      a->weight_decay = step == 2 ? 0.0f : 0.1f;
      a->step = step;
    }
    adamw_step(cpu, c);
    adamw_step(gpu, g);
    ASSERT_TRUE(bitwise_equal(c.param, to_cpu(g.param))) << "param";
    ASSERT_TRUE(bitwise_equal(c.exp_avg, to_cpu(g.exp_avg))) << "exp_avg";
    ASSERT_TRUE(bitwise_equal(c.exp_avg_sq, to_cpu(g.exp_avg_sq))) << "exp_avg_sq";
    if (step < 4) ASSERT_TRUE(bitwise_equal(c.param_bf16, to_cpu(g.param_bf16))) << "param_bf16";
  }
}

// Multiples of 4 take the 4-wide kernel, the others the scalar one.
INSTANTIATE_TEST_SUITE_P(Sizes, AdamWGpu,
                         ::testing::Values(1, 127, 1481, 4097, (1 << 20) + 3, 4, 1024,
                                           (1 << 20) + 4));

// The fused optimizer + 128x128 weight quantization (the one-pass kernel of
// adamw_block_kernels.cuh) against the CPU (the update, then quantize()), bit for bit, over steps
// with clipping, a NaN clipping coefficient on a skipped step and a found_inf of 0: model weights,
// stacked experts with the per-expert column-wise copy, ragged tiles on the vector path (rows not a
// multiple of 16 or 128, cols a multiple of 4 but not 128), the scalar paths (cols not a multiple
// of 4, master and gradient not 16-byte aligned), both FP8 formats, both scale roundings and the
// step's constants read from the device (adamw_device_consts) or given by the host.
struct BlockCase {
  int64_t rows, cols, batch_rows;
  Fp8Format format;
  ScaleRounding rounding = ScaleRounding::kExact;
  bool device_consts = false;
  bool misaligned = false;  // master and gradient one element past a 16-byte boundary
};

class AdamWBlockQuantizeGpu : public ::testing::TestWithParam<BlockCase> {};

BlockQuantOutput block_output(Context& ctx, const BlockCase& c) {
  const int64_t sr = (c.rows + 127) / 128, sc = (c.cols + 127) / 128;
  const int64_t b = c.batch_rows ? c.rows / c.batch_rows : 1;
  const int64_t br = c.batch_rows ? c.batch_rows : c.rows;
  const DType d8 = fp8_dtype(c.format);
  BlockQuantOutput o;
  o.format = c.format;
  o.rounding = c.rounding;
  o.rows = c.rows;
  o.cols = c.cols;
  o.batch_rows = c.batch_rows;
  o.data = Tensor::empty(ctx, {c.rows, c.cols}, d8);
  o.scale_inv = Tensor::empty(ctx, {sr, sc}, DType::kF32);
  o.columnwise_data = Tensor::empty(ctx, {b, c.cols, br}, d8);
  o.columnwise_scale_inv = Tensor::empty(ctx, {b, sc, (br + 127) / 128}, DType::kF32);
  return o;
}

// An f32 tensor of n elements on the GPU holding `host`, one element past a 16-byte boundary (a
// view into `storage`, which keeps it alive).
Tensor misaligned_gpu(const Tensor& host, Tensor& storage) {
  storage = Tensor::empty(devices().gpu, {host.numel() + 1}, DType::kF32);
  Tensor view =
      Tensor::wrap(storage.data_as<float>() + 1, {host.numel()}, DType::kF32, Device::kCuda);
  devices().gpu.be().copy(view.data(), host.data(), host.nbytes(), CopyKind::kHostToDevice);
  return view;
}

TEST_P(AdamWBlockQuantizeGpu, MatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const BlockCase bc = GetParam();
  const int64_t n = bc.rows * bc.cols;
  AdamWArgs c{
      .param = test::random_tensor({n}, DType::kF32, 5, test::Dist::kOutliers),
      .grad = Tensor(),
      .exp_avg = bf16_of(test::random_tensor({n}, DType::kF32, 6), false),
      .exp_avg_sq = bf16_of(test::random_tensor({n}, DType::kF32, 7, test::Dist::kWide), true)};
  Tensor p_storage, g_storage;
  AdamWArgs g{.param = bc.misaligned ? misaligned_gpu(c.param, p_storage) : to_gpu(c.param),
              .grad = Tensor(),
              .exp_avg = to_gpu(c.exp_avg),
              .exp_avg_sq = to_gpu(c.exp_avg_sq)};
  const BlockQuantOutput oc = block_output(cpu, bc), og = block_output(gpu, bc);
  Tensor consts_c = Tensor::empty({2 * kAdamWConstsFloats}, DType::kF32);
  Tensor consts_g = Tensor::empty(gpu, {2 * kAdamWConstsFloats}, DType::kF32);
  for (int64_t step = 1; step <= 4; ++step) {
    SCOPED_TRACE(std::to_string(bc.rows) + "x" + std::to_string(bc.cols) + " batch " +
                 std::to_string(bc.batch_rows) + ", step " + std::to_string(step));
    c.grad = test::random_tensor({n}, DType::kF32, 20 + step, test::Dist::kOutliers);
    g.grad = bc.misaligned ? misaligned_gpu(c.grad, g_storage) : to_gpu(c.grad);
    // Step 2 clips; step 3 is skipped with a NaN coefficient (what a non-finite norm gives); step 4
    // passes a found_inf of 0.
    const double clip = step == 2 ? 0.3 : std::numeric_limits<double>::quiet_NaN();
    c.grad_scale = step == 2 || step == 3 ? scalar(DType::kF32, clip) : Tensor();
    g.grad_scale = c.grad_scale.data() ? to_gpu(c.grad_scale) : Tensor();
    c.found_inf = step >= 3 ? scalar(DType::kI32, step == 3 ? 1 : 0) : Tensor();
    g.found_inf = c.found_inf.data() ? to_gpu(c.found_inf) : Tensor();
    for (AdamWArgs* a : {&c, &g}) {
      a->lr = 1e-2f * static_cast<float>(step);
      a->weight_decay = step == 4 ? 0.0f : 0.1f;
      a->step = step;
    }
    if (bc.device_consts) {
      // The steps taken so far live on the device; lr and weight_decay go through the consts.
      Tensor taken = Tensor::empty({1}, DType::kI64);
      taken.data_as<int64_t>()[0] = step - 1;
      const Tensor taken_g = to_gpu(taken);
      adamw_device_consts(cpu, {.lr = c.lr, .steps_taken = taken, .out = consts_c});
      adamw_device_consts(gpu, {.lr = g.lr, .steps_taken = taken_g, .out = consts_g});
      const int64_t at = step == 4 ? kAdamWConstsFloats : 0;  // step 4: the no-decay half
      c.consts = Tensor::wrap(consts_c.data_as<float>() + at, {kAdamWConstsFloats}, DType::kF32,
                              Device::kCpu);
      g.consts = Tensor::wrap(consts_g.data_as<float>() + at, {kAdamWConstsFloats}, DType::kF32,
                              Device::kCuda);
      for (AdamWArgs* a : {&c, &g}) a->lr = 123.0f, a->step = 99;  // ignored with consts
    }
    adamw_step_block_quantize(cpu, c, oc);
    adamw_step_block_quantize(gpu, g, og);
    ASSERT_TRUE(bitwise_equal(c.param, to_cpu(g.param))) << "param";
    ASSERT_TRUE(bitwise_equal(c.exp_avg, to_cpu(g.exp_avg))) << "exp_avg";
    ASSERT_TRUE(bitwise_equal(c.exp_avg_sq, to_cpu(g.exp_avg_sq))) << "exp_avg_sq";
    ASSERT_TRUE(bitwise_equal(oc.data, to_cpu(og.data))) << "data";
    ASSERT_TRUE(bitwise_equal(oc.scale_inv, to_cpu(og.scale_inv))) << "scale_inv";
    ASSERT_TRUE(bitwise_equal(oc.columnwise_data, to_cpu(og.columnwise_data))) << "columnwise";
    ASSERT_TRUE(bitwise_equal(oc.columnwise_scale_inv, to_cpu(og.columnwise_scale_inv)))
        << "columnwise_scale_inv";
  }
  // And the GPU outputs are what quantize() makes of the GPU's updated master.
  QuantizeArgs qa;
  qa.input = to_gpu(to_cpu(g.param)).reshape({bc.rows, bc.cols});
  qa.format = bc.format;
  qa.granularity = Granularity::k128x128;
  qa.rounding = bc.rounding;
  qa.output = QuantizeOutput::kBoth;
  const QuantTensor q = quantize(gpu, qa);
  EXPECT_TRUE(bitwise_equal(to_cpu(q.data), to_cpu(og.data)));
  EXPECT_TRUE(
      bitwise_equal(to_cpu(q.scale_inv), to_cpu(og.scale_inv).reshape(q.scale_inv.shape())));
  if (bc.batch_rows == 0)
    EXPECT_TRUE(bitwise_equal(to_cpu(q.columnwise_data),
                              to_cpu(og.columnwise_data).reshape(q.columnwise_data.shape())));
}

constexpr Fp8Format kE4 = Fp8Format::kE4M3, kE5 = Fp8Format::kE5M2;
constexpr ScaleRounding kExact = ScaleRounding::kExact, kPow2 = ScaleRounding::kPow2;

INSTANTIATE_TEST_SUITE_P(
    Shapes, AdamWBlockQuantizeGpu,
    ::testing::Values(BlockCase{1408, 1024, 0, kE4}, BlockCase{4 * 256, 384, 256, kE4},
                      BlockCase{3 * 128, 200, 128, kE5}, BlockCase{200, 72, 0, kE4},
                      BlockCase{129, 7, 0, kE4}, BlockCase{1, 4, 0, kE4},
                      // rows a multiple of 16, not of 128: partial tiles on every vector path
                      BlockCase{144, 260, 0, kE4, kPow2}, BlockCase{300, 516, 0, kE5, kPow2, true},
                      BlockCase{2 * 128, 6, 128, kE4, kExact, true},
                      BlockCase{3 * 256, 1152, 256, kE4, kPow2, true},
                      BlockCase{640, 520, 0, kE4, kExact, false, true},
                      BlockCase{2 * 128, 132, 128, kE5, kPow2, true, true}));

// The batched launch (adamw_step_block_quantize_many, the optimizer's path) against the CPU, bit for
// bit, over more parameters than one launch takes (56): the tile lookup at every parameter's edges,
// the largest-first order, and parameters of every path (stacked, ragged, scalar, misaligned, E5M2,
// power-of-2 scales, device constants) in one launch. Two steps: one plain, one clipped.
TEST(AdamWBlockQuantizeManyGpu, MatchesCpuBitwiseOverMoreThanOneLaunch) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const BlockCase kinds[] = {{200, 72, 0, kE4},  {2 * 128, 132, 128, kE5, kPow2},
                             {129, 7, 0, kE4},   {144, 260, 0, kE4, kPow2, false, true},
                             {1, 4, 0, kE4},     {3 * 128, 200, 128, kE4, kExact, true},
                             {640, 520, 0, kE5}, {4 * 256, 384, 256, kE4, kPow2, true}};
  constexpr int kParams = 67;
  std::vector<BlockQuantStep> c(kParams), g(kParams);
  std::vector<Tensor> storage(2 * kParams);
  Tensor consts_c = Tensor::empty({2 * kAdamWConstsFloats}, DType::kF32);
  Tensor consts_g = Tensor::empty(gpu, {2 * kAdamWConstsFloats}, DType::kF32);
  for (int i = 0; i < kParams; ++i) {
    const BlockCase& bc = kinds[i % 8];
    const int64_t n = bc.rows * bc.cols;
    c[i].args =
        AdamWArgs{.param = test::random_tensor({n}, DType::kF32, 1000 + i, test::Dist::kOutliers),
                  .grad = Tensor(),
                  .exp_avg = bf16_of(test::random_tensor({n}, DType::kF32, 2000 + i), false),
                  .exp_avg_sq = bf16_of(
                      test::random_tensor({n}, DType::kF32, 3000 + i, test::Dist::kWide), true)};
    g[i].args = AdamWArgs{.param = bc.misaligned ? misaligned_gpu(c[i].args.param, storage[2 * i])
                                                 : to_gpu(c[i].args.param),
                          .grad = Tensor(),
                          .exp_avg = to_gpu(c[i].args.exp_avg),
                          .exp_avg_sq = to_gpu(c[i].args.exp_avg_sq)};
    c[i].out = block_output(cpu, bc);
    g[i].out = block_output(gpu, bc);
  }
  for (int64_t step = 1; step <= 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Tensor clip_c = scalar(DType::kF32, 0.3);
    const Tensor clip_g = to_gpu(clip_c);
    Tensor taken = Tensor::empty({1}, DType::kI64);
    taken.data_as<int64_t>()[0] = step - 1;
    adamw_device_consts(cpu, {.lr = 0.02f, .steps_taken = taken, .out = consts_c});
    adamw_device_consts(gpu, {.lr = 0.02f, .steps_taken = to_gpu(taken), .out = consts_g});
    for (int i = 0; i < kParams; ++i) {
      const BlockCase& bc = kinds[i % 8];
      const int64_t n = bc.rows * bc.cols;
      c[i].args.grad =
          test::random_tensor({n}, DType::kF32, 4000 + 100 * step + i, test::Dist::kOutliers);
      g[i].args.grad = bc.misaligned ? misaligned_gpu(c[i].args.grad, storage[2 * i + 1])
                                     : to_gpu(c[i].args.grad);
      c[i].args.grad_scale = step == 2 ? clip_c : Tensor();
      g[i].args.grad_scale = step == 2 ? clip_g : Tensor();
      for (AdamWArgs* a : {&c[i].args, &g[i].args}) {
        a->lr = 1e-2f;
        a->step = step;
        a->weight_decay = i % 3 == 0 ? 0.0f : 0.1f;
      }
      if (bc.device_consts) {
        c[i].args.consts = Tensor::wrap(consts_c.data_as<float>(), {kAdamWConstsFloats},
                                        DType::kF32, Device::kCpu);
        g[i].args.consts = Tensor::wrap(consts_g.data_as<float>(), {kAdamWConstsFloats},
                                        DType::kF32, Device::kCuda);
      }
    }
    adamw_step_block_quantize_many(cpu, c);
    adamw_step_block_quantize_many(gpu, g);
    for (int i = 0; i < kParams; ++i) {
      SCOPED_TRACE("parameter " + std::to_string(i));
      ASSERT_TRUE(bitwise_equal(c[i].args.param, to_cpu(g[i].args.param))) << "param";
      ASSERT_TRUE(bitwise_equal(c[i].args.exp_avg, to_cpu(g[i].args.exp_avg))) << "exp_avg";
      ASSERT_TRUE(bitwise_equal(c[i].args.exp_avg_sq, to_cpu(g[i].args.exp_avg_sq))) << "v";
      ASSERT_TRUE(bitwise_equal(c[i].out.data, to_cpu(g[i].out.data))) << "data";
      ASSERT_TRUE(bitwise_equal(c[i].out.scale_inv, to_cpu(g[i].out.scale_inv))) << "scale_inv";
      ASSERT_TRUE(bitwise_equal(c[i].out.columnwise_data, to_cpu(g[i].out.columnwise_data)))
          << "columnwise";
      ASSERT_TRUE(
          bitwise_equal(c[i].out.columnwise_scale_inv, to_cpu(g[i].out.columnwise_scale_inv)))
          << "columnwise_scale_inv";
    }
  }
}

TEST(GradNormGpu, MatchesCpuBitwiseOverManyTensors) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  std::vector<Tensor> host, dev;
  // 45 tensors: more than one launch's 32, with empty ones and sizes around the 4096-element
  // chunks.
  const int64_t sizes[] = {1, 0, 4095, 4096, 4097, 127, 1481, 8191, 8193, 300007, 0, 3};
  for (int i = 0; i < 45; ++i) {
    const int64_t n = sizes[i % 12] + (i / 12) * 13;
    host.push_back(test::random_tensor({n}, DType::kF32, 500 + i,
                                       i % 3 ? test::Dist::kOutliers : test::Dist::kGaussian));
    dev.push_back(to_gpu(host.back()));
  }
  const Tensor want = global_grad_norm(cpu, host);
  const Tensor got = global_grad_norm(gpu, dev);
  ASSERT_TRUE(bitwise_equal(want, to_cpu(got))) << "norm " << want.data_as<float>()[0];
  ASSERT_TRUE(bitwise_equal(want, to_cpu(global_grad_norm(gpu, dev)))) << "second run";
  for (float max_norm : {1.0f, 1e6f}) {
    ASSERT_TRUE(bitwise_equal(grad_clip_coefficient(cpu, want, max_norm),
                              to_cpu(grad_clip_coefficient(gpu, got, max_norm))))
        << "clip coefficient, max_norm " << max_norm;
  }
  EXPECT_EQ(to_cpu(global_grad_norm(gpu, {})).data_as<float>()[0], 0.0f);
}

TEST(GradNormGpu, NonfiniteFlag) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  std::vector<Tensor> host;
  for (int i = 0; i < 40; ++i)
    host.push_back(test::random_tensor({1000 + 37 * i}, DType::kF32, 900 + i));
  auto flag = [&](const std::vector<Tensor>& h) {
    std::vector<Tensor> d;
    for (const Tensor& t : h) d.push_back(to_gpu(t));
    return to_cpu(nonfinite_flag(gpu, d)).data_as<int32_t>()[0];
  };
  EXPECT_EQ(flag(host), 0);
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (int where : {0, 31, 32, 39}) {
      host[where].data_as<float>()[host[where].numel() - 1] = bad;
      EXPECT_EQ(flag(host), 1) << "value " << bad << " in tensor " << where;
      EXPECT_EQ(nonfinite_flag(cpu, host).data_as<int32_t>()[0], 1);
      host[where].data_as<float>()[host[where].numel() - 1] = 0.25f;
    }
  }
  EXPECT_EQ(flag(host), 0);
}

}  // namespace
}  // namespace octet
