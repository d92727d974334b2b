// CUDA attention (cuDNN's fused SDPA) against the CPU reference on odd and prime T, several B, H
// and head dims, the causal mask, bitwise determinism, memory linear in T at T = 8192, and clear
// errors.
//
// Tolerances. The CPU reference runs in FP64 on the same BF16 inputs, so the difference is cuDNN's
// own rounding: FP32 accumulation (~1e-6 relative), P rounded to BF16 before P.V and dS rounded to
// BF16 before dS.K / dS^T.Q (2^-9 relative per element, independent signs, so the relative
// Frobenius error of a sum of many such terms stays near 2^-9 ~ 2e-3), and the BF16 rounding of
// every output (2^-9). The bound is 1e-2 (about 5x the expected error) for o, dq, dk, dv; lse is
// FP32 from FP32 scores of exact BF16 products: 1e-4 absolute (times a log T growth). The measured
// errors are printed by each case.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#if OCTET_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "backend/backend.h"
#include "numerics/fp8.h"
#include "ops/attention/attention.h"
#include "test_util.h"
#if OCTET_WITH_CUDNN
#include "ops/attention/attention_cudnn.h"
#endif

namespace octet {
namespace {

using test::bitwise_equal;
using test::random_tensor;

struct Devices {
  Context cpu = make_context(Device::kCpu);
  Context gpu = make_context(Device::kCuda);
};
Devices& devices() {
  static Devices d;
  return d;
}

// Every byte 0xFF: NaN in F32 and BF16, so an output element the kernels skip shows up as NaN.
void poison_pool(Context& gpu, int64_t bytes) {
  Tensor t = Tensor::empty(gpu, {bytes}, DType::kU8);
  gpu.be().memset(t.data(), 0xFF, bytes);
}

double value(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kF32 ? t.data_as<const float>()[i]
                                  : bf16_to_float(t.data_as<const uint16_t>()[i]);
}

// ||got - want||_F / max(||want||_F, 1e-3 * sqrt(n)); fails on a non-finite element (an unwritten,
// poisoned one included). The floor (an RMS of 1e-3, far below that of any gradient here) makes
// tensors that are zero in exact arithmetic compare absolutely: at T = 1, dq = dk = 0 because D =
// dO . o = dP.
::testing::AssertionResult rel_frobenius(const Tensor& want, const Tensor& got, double bound,
                                         const char* name, double* measured = nullptr) {
  if (want.shape() != got.shape())
    return ::testing::AssertionFailure() << name << ": shape " << shape_str(got.shape())
                                         << ", expected " << shape_str(want.shape());
  double e2 = 0, r2 = 0, max_abs = 0;
  int64_t worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double w = value(want, i), g = value(got, i);
    if (!std::isfinite(g))
      return ::testing::AssertionFailure()
             << name << ": element " << i << " (row " << i / got.cols() << ", col "
             << i % got.cols() << ") is " << g << " (unwritten or overflow)";
    e2 += (g - w) * (g - w);
    r2 += w * w;
    if (std::abs(g - w) > max_abs) max_abs = std::abs(g - w), worst = i;
  }
  const double floor2 = 1e-6 * static_cast<double>(want.numel());
  const double rel = want.numel() ? std::sqrt(e2 / std::max(r2, floor2)) : 0.0;
  if (measured) *measured = rel;
  if (rel <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << name << ": relative Frobenius error " << rel << " > " << bound << "; largest |diff| "
         << max_abs << " at row " << worst / got.cols() << ", col " << worst % got.cols()
         << " (want " << value(want, worst) << ", got " << value(got, worst) << ")";
}

::testing::AssertionResult max_abs_diff(const Tensor& want, const Tensor& got, double bound,
                                        const char* name) {
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double w = value(want, i), g = value(got, i);
    if (!(std::abs(g - w) <= bound))
      return ::testing::AssertionFailure()
             << name << "[" << i << "]: want " << w << ", got " << g << " (bound " << bound << ")";
  }
  return ::testing::AssertionSuccess();
}

Tensor scaled(const Tensor& t, float s) {
  Tensor r = Tensor::empty(t.shape(), t.dtype());
  for (int64_t i = 0; i < t.numel(); ++i) r.data_as<uint16_t>()[i] = float_to_bf16(s * value(t, i));
  return r;
}

struct Inputs {
  Tensor q, k, v, dO;
};
Inputs make_inputs(int64_t B, int64_t T, int64_t H, int64_t dqk, int64_t dv, uint64_t seed,
                   float q_gain = 1.0f) {
  Inputs in;
  in.q = random_tensor({B, T, H, dqk}, DType::kBF16, seed);
  if (q_gain != 1.0f) in.q = scaled(in.q, q_gain);
  in.k = random_tensor({B, T, H, dqk}, DType::kBF16, seed + 1);
  in.v = random_tensor({B, T, H, dv}, DType::kBF16, seed + 2);
  in.dO = random_tensor({B, T, H, dv}, DType::kBF16, seed + 3);
  return in;
}

// ---------------------------------------------------------------------------------------------------

struct Dims {
  int dqk, dv;
};
using Param = std::tuple<int64_t /*T*/, int64_t /*H*/, Dims>;
class AttentionGpu : public ::testing::TestWithParam<Param> {};

void compare_with_cpu(int64_t B, int64_t T, int64_t H, Dims d, float scale, float q_gain,
                      uint64_t seed, bool deterministic = true) {
  auto& [cpu, gpu] = devices();
  const Inputs in = make_inputs(B, T, H, d.dqk, d.dv, seed, q_gain);
  const std::string where =
      "T=" + std::to_string(T) + " H=" + std::to_string(H) + " Dqk=" + std::to_string(d.dqk) +
      " Dv=" + std::to_string(d.dv) + " scale=" + std::to_string(scale) +
      " q_gain=" + std::to_string(q_gain) + (deterministic ? "" : " (atomics)");
  const auto want =
      attention_forward(cpu, {.q = in.q, .k = in.k, .v = in.v, .softmax_scale = scale});
  const Tensor qg = in.q.to(gpu, Device::kCuda), kg = in.k.to(gpu, Device::kCuda),
               vg = in.v.to(gpu, Device::kCuda);
  const Tensor dog = in.dO.to(gpu, Device::kCuda);
  poison_pool(gpu, 8 * in.q.nbytes() + (4 << 20));
  const auto got = attention_forward(gpu, {.q = qg, .k = kg, .v = vg, .softmax_scale = scale});
  double e_o = 0;
  ASSERT_TRUE(rel_frobenius(want.o, got.o.to_host(gpu), 1e-2, "o", &e_o)) << where;
  ASSERT_TRUE(
      max_abs_diff(want.lse, got.lse.to_host(gpu), 1e-4 * (1 + std::log(double(T) + 1)), "lse"))
      << where;

  // Backward from the same o and lse on both sides (the CPU's), so only the backward kernels
  // differ.
  const auto gw = attention_backward(cpu, {.q = in.q,
                                           .k = in.k,
                                           .v = in.v,
                                           .o = want.o,
                                           .lse = want.lse,
                                           .grad_o = in.dO,
                                           .softmax_scale = scale});
  poison_pool(gpu, 8 * in.q.nbytes() + (4 << 20));
  const auto gg = attention_backward(gpu, {.q = qg,
                                           .k = kg,
                                           .v = vg,
                                           .o = want.o.to(gpu, Device::kCuda),
                                           .lse = want.lse.to(gpu, Device::kCuda),
                                           .grad_o = dog,
                                           .softmax_scale = scale,
                                           .deterministic = deterministic});
  double e_dq = 0, e_dk = 0, e_dv = 0;
  ASSERT_TRUE(rel_frobenius(gw.grad_q, gg.grad_q.to_host(gpu), 1e-2, "dq", &e_dq)) << where;
  ASSERT_TRUE(rel_frobenius(gw.grad_k, gg.grad_k.to_host(gpu), 1e-2, "dk", &e_dk)) << where;
  ASSERT_TRUE(rel_frobenius(gw.grad_v, gg.grad_v.to_host(gpu), 1e-2, "dv", &e_dv)) << where;
  std::printf("[ measured ] %s: rel Frobenius o %.2e dq %.2e dk %.2e dv %.2e\n", where.c_str(), e_o,
              e_dq, e_dk, e_dv);
}

TEST_P(AttentionGpu, MatchesCpuForwardAndBackward) {
  OCTET_REQUIRE_GPU();
  const auto& [T, H, d] = GetParam();
  // B = 1 and 2 alternate over the cases, so both appear with every T.
  const int64_t B = 1 + (T + H) % 2;
  compare_with_cpu(B, T, H, d, 0.0f, 1.0f, 1000 + T * 7 + H);
}

INSTANTIATE_TEST_SUITE_P(
    OddShapes, AttentionGpu,
    ::testing::Combine(::testing::Values(1, 17, 127, 129, 1000), ::testing::Values(1, 3),
                       ::testing::Values(Dims{96, 64}, Dims{192, 128}, Dims{64, 64})));

// Head dims across cuDNN's range (multiples of 8 up to 256), Dqk above, below and equal to Dv.
TEST(AttentionGpuSpecial, OtherHeadDims) {
  OCTET_REQUIRE_GPU();
  for (Dims d : {Dims{8, 8}, Dims{16, 16}, Dims{40, 24}, Dims{128, 128}, Dims{256, 256},
                 Dims{256, 64}, Dims{48, 208}, Dims{160, 96}, Dims{32, 256}, Dims{200, 136}})
    compare_with_cpu(1, 131, 2, d, 0.0f, 1.0f, 77 + d.dqk + d.dv);
}

// The non-deterministic backward (FP32 atomics over key blocks, `deterministic = false`) within
// the same bounds of the FP64 oracle, at the model's head dims and odd lengths.
TEST(AttentionGpuSpecial, AtomicsBackwardMatchesCpu) {
  OCTET_REQUIRE_GPU();
  for (int64_t T : {1, 129, 1000})
    for (Dims d : {Dims{96, 64}, Dims{192, 128}})
      compare_with_cpu(2, T, 3, d, 0.0f, 1.0f, 500 + T + d.dqk, /*deterministic=*/false);
}

// Several heads and batches at a prime T: the strides that describe (B, T, H, D) to cuDNN.
TEST(AttentionGpuSpecial, ManyHeadsAndBatches) {
  OCTET_REQUIRE_GPU();
  compare_with_cpu(3, 257, 7, {192, 128}, 0.0f, 1.0f, 31);
  compare_with_cpu(4, 64, 16, {96, 64}, 0.0f, 1.0f, 32);
}

// Sharp softmax (large scores) exercises the online rescaling; a DeepSeek-style explicit scale too.
TEST(AttentionGpuSpecial, SharpSoftmaxAndExplicitScale) {
  OCTET_REQUIRE_GPU();
  compare_with_cpu(1, 257, 2, {192, 128}, 0.0f, 6.0f, 5);
  compare_with_cpu(2, 200, 3, {96, 64}, 0.1353f, 1.0f, 6);
}

TEST(AttentionGpuSpecial, CausalMaskIgnoresFutureTokens) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const int64_t B = 2, T = 300, H = 3;
  const Dims d{192, 128};
  for (int64_t t0 : {77, 128, 129}) {
    Inputs in = make_inputs(B, T, H, d.dqk, d.dv, 99);
    auto run = [&](const Inputs& x) {
      const Tensor qg = x.q.to(gpu, Device::kCuda), kg = x.k.to(gpu, Device::kCuda),
                   vg = x.v.to(gpu, Device::kCuda);
      auto f = attention_forward(gpu, {.q = qg, .k = kg, .v = vg, .softmax_scale = 0.0f});
      auto g = attention_backward(gpu, {.q = qg,
                                        .k = kg,
                                        .v = vg,
                                        .o = f.o,
                                        .lse = f.lse,
                                        .grad_o = x.dO.to(gpu, Device::kCuda),
                                        .softmax_scale = 0.0f});
      return std::tuple{f.o.to_host(gpu), f.lse.to_host(gpu), g.grad_q.to_host(gpu)};
    };
    const auto [o1, lse1, dq1] = run(in);
    Inputs fut = in;
    fut.q = scaled(in.q, 1.0f), fut.k = scaled(in.k, 1.0f), fut.v = scaled(in.v, 1.0f),
    fut.dO = scaled(in.dO, 1.0f);
    for (Tensor* t : {&fut.q, &fut.k, &fut.v, &fut.dO}) {  // rewrite every position >= t0
      const int64_t row = H * t->size(3);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = t0 * row; i < T * row; ++i) {
          uint16_t& e = t->data_as<uint16_t>()[b * T * row + i];
          e = float_to_bf16(-2.5f * bf16_to_float(e) + 0.25f);
        }
    }
    const auto [o2, lse2, dq2] = run(fut);
    const int64_t orow = H * d.dv, qrow = H * d.dqk;
    for (int64_t b = 0; b < B; ++b) {
      ASSERT_EQ(std::memcmp(o1.data_as<uint16_t>() + b * T * orow,
                            o2.data_as<uint16_t>() + b * T * orow, t0 * orow * 2),
                0)
          << "o at positions < " << t0 << " changed when only later tokens changed (batch " << b
          << ")";
      ASSERT_EQ(std::memcmp(dq1.data_as<uint16_t>() + b * T * qrow,
                            dq2.data_as<uint16_t>() + b * T * qrow, t0 * qrow * 2),
                0)
          << "dq at positions < " << t0 << " changed when only later tokens changed (batch " << b
          << ")";
      for (int64_t h = 0; h < H; ++h)
        ASSERT_EQ(std::memcmp(lse1.data_as<float>() + (b * H + h) * T,
                              lse2.data_as<float>() + (b * H + h) * T, t0 * 4),
                  0)
            << "lse changed before " << t0;
      EXPECT_NE(std::memcmp(o1.data_as<uint16_t>() + (b * T + T - 1) * orow,
                            o2.data_as<uint16_t>() + (b * T + T - 1) * orow, orow * 2),
                0)
          << "the last position's output did not change: the edit was not visible";
    }
  }
}

TEST(AttentionGpuSpecial, BitwiseDeterministic) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  for (Dims d : {Dims{192, 128}, Dims{256, 256}}) {
    const Inputs in = make_inputs(2, 333, 3, d.dqk, d.dv, 4242);
    const Tensor qg = in.q.to(gpu, Device::kCuda), kg = in.k.to(gpu, Device::kCuda),
                 vg = in.v.to(gpu, Device::kCuda);
    const Tensor dog = in.dO.to(gpu, Device::kCuda);
    std::vector<Tensor> runs[2];
    for (int r = 0; r < 2; ++r) {
      poison_pool(gpu, 64 << 20);
      const auto f = attention_forward(gpu, {.q = qg, .k = kg, .v = vg, .softmax_scale = 0.0f});
      const auto g = attention_backward(gpu, {.q = qg,
                                              .k = kg,
                                              .v = vg,
                                              .o = f.o,
                                              .lse = f.lse,
                                              .grad_o = dog,
                                              .softmax_scale = 0.0f});
      for (const Tensor& t : {f.o, f.lse, g.grad_q, g.grad_k, g.grad_v})
        runs[r].push_back(t.to_host(gpu));
    }
    const char* names[] = {"o", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; ++i)
      EXPECT_TRUE(bitwise_equal(runs[0][i], runs[1][i]))
          << names[i] << " differs between two runs, Dqk=" << d.dqk;
  }
}

// One cuDNN graph per pass and shape, built on first use and reused; the calls enqueue without
// host synchronisation, so a forward + backward can be captured into a CUDA graph and replayed,
// with the same bits as the eager calls.
TEST(AttentionGpuSpecial, GraphsCachedAndCapturable) {
  OCTET_REQUIRE_GPU();
#if OCTET_WITH_CUDA && OCTET_WITH_CUDNN
  auto& [cpu, gpu] = devices();
  const Inputs in = make_inputs(2, 193, 3, 96, 64, 515);
  const Tensor qg = in.q.to(gpu, Device::kCuda), kg = in.k.to(gpu, Device::kCuda),
               vg = in.v.to(gpu, Device::kCuda), dog = in.dO.to(gpu, Device::kCuda);
  auto eager_f = attention_forward(gpu, {.q = qg, .k = kg, .v = vg, .softmax_scale = 0.0f});
  auto eager_g = attention_backward(gpu, {.q = qg,
                                          .k = kg,
                                          .v = vg,
                                          .o = eager_f.o,
                                          .lse = eager_f.lse,
                                          .grad_o = dog,
                                          .softmax_scale = 0.0f});
  const size_t graphs = attention_state(gpu).graphs.size();
  for (int i = 0; i < 3; ++i) {
    auto f = attention_forward(gpu, {.q = qg, .k = kg, .v = vg, .softmax_scale = 0.0f});
    attention_backward(
        gpu,
        {.q = qg, .k = kg, .v = vg, .o = f.o, .lse = f.lse, .grad_o = dog, .softmax_scale = 0.0f});
  }
  EXPECT_EQ(attention_state(gpu).graphs.size(), graphs) << "a cached shape built a new graph";
  attention_forward(
      gpu, {.q = qg, .k = kg, .v = vg, .softmax_scale = 0.5f});  // another scale is another graph
  EXPECT_EQ(attention_state(gpu).graphs.size(), graphs + 1);

  // Outputs allocated before the capture, so the replayed graph writes into known buffers.
  Tensor o = Tensor::empty(gpu, eager_f.o.shape(), DType::kBF16);
  Tensor lse = Tensor::empty(gpu, eager_f.lse.shape(), DType::kF32);
  Tensor dq = Tensor::empty(gpu, qg.shape(), DType::kBF16);
  gpu.synchronize();
  const auto st = static_cast<cudaStream_t>(gpu.stream);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  {
    auto f = attention_forward(gpu, {.q = qg, .k = kg, .v = vg, .softmax_scale = 0.0f});
    auto g = attention_backward(
        gpu,
        {.q = qg, .k = kg, .v = vg, .o = f.o, .lse = f.lse, .grad_o = dog, .softmax_scale = 0.0f});
    gpu.be().copy(o.data(), f.o.data(), o.nbytes(), CopyKind::kDeviceToDevice);
    gpu.be().copy(lse.data(), f.lse.data(), lse.nbytes(), CopyKind::kDeviceToDevice);
    gpu.be().copy(dq.data(), g.grad_q.data(), dq.nbytes(), CopyKind::kDeviceToDevice);
  }
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess) << "attention broke the capture";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  gpu.be().memset(o.data(), 0xFF, o.nbytes());
  gpu.be().memset(dq.data(), 0xFF, dq.nbytes());
  ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
  gpu.synchronize();
  EXPECT_TRUE(bitwise_equal(eager_f.o.to_host(gpu), o.to_host(gpu))) << "o: replay != eager";
  EXPECT_TRUE(bitwise_equal(eager_f.lse.to_host(gpu), lse.to_host(gpu))) << "lse: replay != eager";
  EXPECT_TRUE(bitwise_equal(eager_g.grad_q.to_host(gpu), dq.to_host(gpu))) << "dq: replay != eager";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
#endif
}

// ---------------------------------------------------------------------------------------------------
// T = 8192: no O(T^2) memory, and sampled rows against an FP64 reference computed for those rows
// only.

struct HeadRef {  // one (b, h) of host bf16 tensors, as doubles
  int64_t T, dqk, dv;
  double scale;
  std::vector<double> q, k, v, dO;
  HeadRef(const Inputs& in, int64_t b, int64_t h, double sc) : scale(sc) {
    T = in.q.size(1), dqk = in.q.size(3), dv = in.v.size(3);
    const int64_t H = in.q.size(2);
    auto take = [&](const Tensor& t, int64_t D, std::vector<double>& out) {
      out.resize(static_cast<size_t>(T * D));
      for (int64_t i = 0; i < T; ++i)
        for (int64_t e = 0; e < D; ++e) out[i * D + e] = value(t, ((b * T + i) * H + h) * D + e);
    };
    take(in.q, dqk, q), take(in.k, dqk, k), take(in.v, dv, v), take(in.dO, dv, dO);
  }
  double score(int64_t i, int64_t j) const {
    double s = 0;
    for (int64_t e = 0; e < dqk; ++e) s += q[i * dqk + e] * k[j * dqk + e];
    return scale * s;
  }
  double dp(int64_t i, int64_t j) const {
    double s = 0;
    for (int64_t e = 0; e < dv; ++e) s += dO[i * dv + e] * v[j * dv + e];
    return s;
  }
  // lse_i, o_i and D_i = dO_i . o_i of query row i.
  void row(int64_t i, double& lse, std::vector<double>& o, double& D) const {
    double m = -INFINITY, l = 0;
    for (int64_t j = 0; j <= i; ++j) m = std::max(m, score(i, j));
    o.assign(static_cast<size_t>(dv), 0.0);
    for (int64_t j = 0; j <= i; ++j) {
      const double p = std::exp(score(i, j) - m);
      l += p;
      for (int64_t e = 0; e < dv; ++e) o[e] += p * v[j * dv + e];
    }
    D = 0;
    for (int64_t e = 0; e < dv; ++e) o[e] /= l, D += dO[i * dv + e] * o[e];
    lse = m + std::log(l);
  }
};

TEST(AttentionGpuSpecial, LongSequenceMemoryAndAccuracy) {
  OCTET_REQUIRE_GPU();
#if OCTET_WITH_CUDA
  auto& [cpu, gpu] = devices();
  const int64_t B = 1, T = 8192, H = 4;
  const Dims d{192, 128};
  const Inputs in = make_inputs(B, T, H, d.dqk, d.dv, 8192);
  const Tensor qg = in.q.to(gpu, Device::kCuda), kg = in.k.to(gpu, Device::kCuda),
               vg = in.v.to(gpu, Device::kCuda);
  const Tensor dog = in.dO.to(gpu, Device::kCuda);
  gpu.synchronize();
  // The backend allocates from the device's default stream-ordered pool: its high-water mark over
  // the calls, above what was in use before them, is every byte the ops allocated.
  cudaMemPool_t pool;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, gpu.device_index), cudaSuccess);
  uint64_t used0 = 0, zero = 0, high = 0;
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used0), cudaSuccess);
  ASSERT_EQ(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero), cudaSuccess);
  size_t free0 = 0, total = 0;
  cudaMemGetInfo(&free0, &total);
  const auto f = attention_forward(gpu, {.q = qg, .k = kg, .v = vg, .softmax_scale = 0.0f});
  const auto g = attention_backward(
      gpu,
      {.q = qg, .k = kg, .v = vg, .o = f.o, .lse = f.lse, .grad_o = dog, .softmax_scale = 0.0f});
  gpu.synchronize();
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high), cudaSuccess);
  size_t free1 = 0;
  cudaMemGetInfo(&free1, &total);
  const int64_t outputs =
      f.o.nbytes() + f.lse.nbytes() + g.grad_q.nbytes() + g.grad_k.nbytes() + g.grad_v.nbytes();
  // Besides the outputs, only the workspace cuDNN asks for (the larger of the two passes': the
  // forward's is freed, stream-ordered, before the backward's is taken).
  const AttentionWorkspace ws = attention_workspace(gpu, B, T, H, d.dqk, d.dv);
  const int64_t workspace = std::max(ws.forward_bytes, ws.backward_bytes);
  std::printf("[ measured ] T=8192: cuDNN workspace forward %.1f MiB, backward %.1f MiB\n",
              ws.forward_bytes / 1048576.0, ws.backward_bytes / 1048576.0);
  const int64_t allocated = static_cast<int64_t>(high) - static_cast<int64_t>(used0);
  const int64_t one_score_matrix = T * T * 2;  // a single (T, T) bf16 matrix of one head
  std::printf(
      "[ measured ] T=8192: allocated %.1f MiB during forward + backward (outputs %.1f MiB, "
      "workspace %.2f MiB); "
      "cudaMemGetInfo free went down by %.1f MiB; one T x T bf16 matrix would be %.0f MiB\n",
      allocated / 1048576.0, outputs / 1048576.0, workspace / 1048576.0,
      (static_cast<double>(free0) - static_cast<double>(free1)) / 1048576.0,
      one_score_matrix / 1048576.0);
  EXPECT_LE(allocated, outputs + workspace + (4 << 20))
      << "attention allocated more than its outputs and cuDNN's workspace";

  // Sampled rows against FP64: o, lse and dq of query rows; dk and dv of the last keys (which only
  // the last queries see, so their reference needs those rows alone).
  const Tensor o = f.o.to_host(gpu), lse = f.lse.to_host(gpu), dq = g.grad_q.to_host(gpu);
  const Tensor dk = g.grad_k.to_host(gpu), dv = g.grad_v.to_host(gpu);
  const double scale = 1.0 / std::sqrt(double(d.dqk));
  double e2[5] = {}, r2[5] = {};
  auto acc = [&](int which, double want, double got) {
    ASSERT_TRUE(std::isfinite(got));
    e2[which] += (got - want) * (got - want), r2[which] += want * want;
  };
  for (int64_t h : {int64_t{0}, H - 1}) {
    const HeadRef ref(in, 0, h, scale);
    std::vector<double> orow;
    for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, int64_t{2049},
                      int64_t{5000}, T - 2, T - 1}) {
      double l_i, D_i;
      ref.row(i, l_i, orow, D_i);
      for (int64_t e = 0; e < d.dv; ++e) acc(0, orow[e], value(o, (i * H + h) * d.dv + e));
      ASSERT_NEAR(value(lse, h * T + i), l_i, 2e-3) << "lse row " << i;
      std::vector<double> dqr(static_cast<size_t>(d.dqk), 0.0);
      for (int64_t j = 0; j <= i; ++j) {
        const double ds = std::exp(ref.score(i, j) - l_i) * (ref.dp(i, j) - D_i);
        for (int64_t e = 0; e < d.dqk; ++e) dqr[e] += ds * ref.k[j * d.dqk + e];
      }
      for (int64_t e = 0; e < d.dqk; ++e)
        acc(1, scale * dqr[e], value(dq, (i * H + h) * d.dqk + e));
    }
    const int64_t first = T - 70;
    std::vector<double> lses(70), Ds(70);
    for (int64_t i = first; i < T; ++i) ref.row(i, lses[i - first], orow, Ds[i - first]);
    for (int64_t j : {T - 1, T - 2, T - 33, T - 70}) {
      std::vector<double> dkr(static_cast<size_t>(d.dqk), 0.0), dvr(static_cast<size_t>(d.dv), 0.0);
      for (int64_t i = j; i < T; ++i) {
        const double p = std::exp(ref.score(i, j) - lses[i - first]);
        const double ds = p * (ref.dp(i, j) - Ds[i - first]);
        for (int64_t e = 0; e < d.dqk; ++e) dkr[e] += ds * ref.q[i * d.dqk + e];
        for (int64_t e = 0; e < d.dv; ++e) dvr[e] += p * ref.dO[i * d.dv + e];
      }
      for (int64_t e = 0; e < d.dqk; ++e)
        acc(2, scale * dkr[e], value(dk, (j * H + h) * d.dqk + e));
      for (int64_t e = 0; e < d.dv; ++e) acc(3, dvr[e], value(dv, (j * H + h) * d.dv + e));
    }
  }
  const char* names[] = {"o", "dq", "dk", "dv"};
  for (int w = 0; w < 4; ++w) {
    const double rel = std::sqrt(e2[w] / r2[w]);
    std::printf("[ measured ] T=8192 sampled rows: %s rel Frobenius %.2e\n", names[w], rel);
    EXPECT_LE(rel, 1e-2) << names[w] << " at T = 8192 (sampled rows)";
  }
  for (const Tensor* t : {&o, &dq, &dk, &dv})
    for (int64_t i = 0; i < t->numel(); i += 97)
      ASSERT_TRUE(std::isfinite(value(*t, i))) << "non-finite at " << i;
#endif
}

TEST(AttentionGpuSpecial, RejectsUnsupportedInputs) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  auto expect_error = [](const std::function<void()>& fn, const std::string& word) {
    try {
      fn();
      ADD_FAILURE() << "expected an error mentioning '" << word << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  const Tensor qf = random_tensor({1, 8, 2, 64}, DType::kF32, 1).to(gpu, Device::kCuda);
  expect_error([&] { attention_forward(gpu, {.q = qf, .k = qf, .v = qf, .softmax_scale = 0.0f}); },
               "BF16");
  const Tensor q100 = random_tensor({1, 8, 2, 100}, DType::kBF16, 1).to(gpu, Device::kCuda);
  const Tensor v64 = random_tensor({1, 8, 2, 64}, DType::kBF16, 1).to(gpu, Device::kCuda);
  expect_error(
      [&] { attention_forward(gpu, {.q = q100, .k = q100, .v = v64, .softmax_scale = 0.0f}); },
      "multiples of 8");
  expect_error([&] { attention_check_supported(gpu, 100, 64); }, "multiples of 8");
  attention_check_supported(gpu, 192, 128);
  const Tensor big = random_tensor({1 * 8 * 2 * 64 + 8}, DType::kBF16, 1).to(gpu, Device::kCuda);
  const Tensor misaligned = Tensor::wrap(static_cast<uint16_t*>(big.data()) + 1, {1, 8, 2, 64},
                                         DType::kBF16, Device::kCuda);
  expect_error(
      [&] { attention_forward(gpu, {.q = misaligned, .k = v64, .v = v64, .softmax_scale = 0.0f}); },
      "16-byte aligned");
}

}  // namespace
}  // namespace octet
