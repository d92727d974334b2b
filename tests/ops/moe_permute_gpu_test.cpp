// CUDA moe_permute family against the CPU reference, bit for bit: maps (stable sort, padding, empty
// experts), BF16 / F32 / FP8 payloads with scales, combine, combine backward and gather-back, on
// odd sizes and DeepSeek-V3's routing shape; determinism across runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "backend/backend.h"
#include "ops/moe_permute/moe_permute.h"
#include "ops/moe_permute/moe_row_weight.h"
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

void poison_pool(Context& gpu, int64_t bytes) {
  Tensor t = Tensor::empty(gpu, {bytes}, DType::kU8);
  gpu.be().memset(t.data(), 0xA5, bytes);
}

Tensor to_gpu(const Tensor& t) {
  return t.to(devices().gpu, Device::kCuda);
}
Tensor to_cpu(const Tensor& t) {
  return t.to_host(devices().gpu);
}

// Distinct experts per token, skewed toward low ids; the last `empty_tail` experts get no token.
Tensor random_routing(int64_t T, int64_t k, int64_t E, uint64_t seed, int64_t empty_tail) {
  Tensor t = Tensor::empty({T, k}, DType::kI32);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const int64_t usable = E - empty_tail;
  for (int64_t i = 0; i < T; ++i) {
    int32_t* row = t.data_as<int32_t>() + i * k;
    for (int64_t j = 0; j < k; ++j) {
      int32_t e;
      do {
        const double v = u(rng);
        e = static_cast<int32_t>(
            std::min<int64_t>(usable - 1, static_cast<int64_t>(v * v * usable)));
      } while (std::find(row, row + j, e) != row + j);
      row[j] = e;
    }
  }
  return t;
}

::testing::AssertionResult same_map(const PermuteMap& want, const PermuteMap& got) {
  if (want.num_rows != got.num_rows)
    return ::testing::AssertionFailure() << "num_rows " << want.num_rows << " vs " << got.num_rows;
  const std::pair<const char*, std::pair<Tensor, Tensor>> parts[] = {
      {"row_of", {want.row_of, got.row_of}},
      {"token_of", {want.token_of, got.token_of}},
      {"counts", {want.counts, got.counts}},
      {"group_sizes", {want.group_sizes, got.group_sizes}},
      {"offsets", {want.offsets, got.offsets}}};
  for (const auto& [name, pair] : parts) {
    auto r = bitwise_equal(pair.first, to_cpu(pair.second));
    if (!r) return r << " [" << name << "]";
  }
  return ::testing::AssertionSuccess();
}

// A map built on the GPU from the same routing, for ops whose inputs live there.
PermuteMap gpu_map(const Tensor& idx, int64_t E, PermutePadding pad) {
  return moe_permute_map(devices().gpu,
                         {.topk_idx = to_gpu(idx), .num_experts = E, .padding = pad});
}

struct Case {
  int64_t T, k, E, empty_tail, D;
};

std::string describe(const Case& c, PermutePadding pad) {
  std::ostringstream os;
  os << "T=" << c.T << " k=" << c.k << " E=" << c.E << " empty=" << c.empty_tail << " D=" << c.D
     << (pad == PermutePadding::kTo128 ? " pad128" : " nopad");
  return os.str();
}

class MoePermuteGpu : public ::testing::TestWithParam<Case> {};

TEST_P(MoePermuteGpu, MapsAndPayloadsMatchCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const Case c = GetParam();
  const Tensor idx = random_routing(c.T, c.k, c.E, 100 + c.T, c.empty_tail);
  const Tensor x = test::random_tensor({c.T, c.D}, DType::kBF16, 3, test::Dist::kOutliers);
  const Tensor x32 = test::random_tensor({c.T, c.D}, DType::kF32, 4);
  const QuantTensor q = quantize(cpu, {.input = x,
                                       .format = Fp8Format::kE4M3,
                                       .granularity = Granularity::k1x128,
                                       .rounding = ScaleRounding::kPow2});
  QuantTensor gq = q;
  gq.data = to_gpu(q.data);
  gq.scale_inv = to_gpu(q.scale_inv);
  gq.amax = to_gpu(q.amax);
  const Tensor gx = to_gpu(x), gx32 = to_gpu(x32);
  for (PermutePadding pad : {PermutePadding::kNone, PermutePadding::kTo128}) {
    SCOPED_TRACE(describe(c, pad));
    const PermuteMap want =
        moe_permute_map(cpu, {.topk_idx = idx, .num_experts = c.E, .padding = pad});
    poison_pool(gpu, 64 << 20);
    const PermuteMap got = gpu_map(idx, c.E, pad);
    ASSERT_TRUE(same_map(want, got));
    ASSERT_TRUE(same_map(want, gpu_map(idx, c.E, pad))) << "second run";

    poison_pool(gpu, 64 << 20);
    ASSERT_TRUE(bitwise_equal(moe_permute(cpu, want, x), to_cpu(moe_permute(gpu, got, gx))))
        << "bf16 payload";
    ASSERT_TRUE(bitwise_equal(moe_permute(cpu, want, x32), to_cpu(moe_permute(gpu, got, gx32))))
        << "f32 payload";
    const QuantTensor pw = moe_permute(cpu, want, q);
    const QuantTensor pg = moe_permute(gpu, got, gq);
    ASSERT_TRUE(bitwise_equal(pw.data, to_cpu(pg.data))) << "fp8 data";
    ASSERT_TRUE(bitwise_equal(pw.scale_inv, to_cpu(pg.scale_inv))) << "fp8 scale_inv";
    // The transposed dispatch (the scaling-aware transpose reading each row from its token's row)
    // against the CPU's permute-then-transpose and the GPU's own two passes.
    {
      const QuantTensor tw = moe_permute_transposed(cpu, want, q);
      poison_pool(gpu, 64 << 20);
      const int64_t before = gpu.be().host_waits();
      const QuantTensor tg = moe_permute_transposed(gpu, got, gq);
      EXPECT_EQ(gpu.be().host_waits(), before) << "the transposed dispatch waited";
      ASSERT_TRUE(bitwise_equal(tw.columnwise_data, to_cpu(tg.columnwise_data)))
          << "transposed data";
      ASSERT_TRUE(bitwise_equal(tw.columnwise_scale_inv, to_cpu(tg.columnwise_scale_inv)))
          << "transposed scale_inv";
      QuantTensor two = moe_permute(gpu, got, gq);
      scaling_aware_transpose(gpu, two);
      ASSERT_TRUE(bitwise_equal(to_cpu(two.columnwise_data), to_cpu(tg.columnwise_data)))
          << "transposed data against permute + transpose on the GPU";
      ASSERT_TRUE(bitwise_equal(to_cpu(two.columnwise_scale_inv), to_cpu(tg.columnwise_scale_inv)))
          << "transposed scale_inv against permute + transpose on the GPU";
      // The 1x128 form of the scales (fp8-flow's dY, the A operand of down's Wgrad).
      const QuantTensor rw = moe_permute_transposed(cpu, want, q, Granularity::k1x128);
      poison_pool(gpu, 64 << 20);
      const QuantTensor rg = moe_permute_transposed(gpu, got, gq, Granularity::k1x128);
      ASSERT_EQ(rg.columnwise_granularity, Granularity::k1x128);
      ASSERT_TRUE(bitwise_equal(rw.columnwise_data, to_cpu(rg.columnwise_data)))
          << "transposed data, 1x128 scales";
      ASSERT_TRUE(bitwise_equal(rw.columnwise_scale_inv, to_cpu(rg.columnwise_scale_inv)))
          << "transposed scale_inv, 1x128 scales";
      QuantTensor per_row = moe_permute(gpu, got, gq);
      scaling_aware_transpose(gpu, per_row, Granularity::k1x128);
      ASSERT_TRUE(
          bitwise_equal(to_cpu(per_row.columnwise_scale_inv), to_cpu(rg.columnwise_scale_inv)))
          << "1x128 scales against permute + transpose on the GPU";
    }

    // The fused dispatch (quantize + permute in one pass) against the CPU's quantize-then-permute,
    // BF16 and F32 inputs, E4M3 with power-of-2 scales and E5M2 exact.
    for (const bool f32 : {false, true}) {
      QuantizeArgs qa{.input = f32 ? x32 : x,
                      .format = Fp8Format::kE4M3,
                      .granularity = Granularity::k1x128,
                      .rounding = ScaleRounding::kPow2};
      if (f32) {
        qa.format = Fp8Format::kE5M2;
        qa.rounding = ScaleRounding::kExact;
      }
      const QuantTensor fw = moe_permute_quantize(cpu, want, qa);
      const QuantTensor ref = moe_permute(cpu, want, quantize(cpu, qa));
      ASSERT_TRUE(bitwise_equal(ref.data, fw.data)) << "fused cpu data, f32=" << f32;
      QuantizeArgs ga = qa;
      ga.input = f32 ? gx32 : gx;
      poison_pool(gpu, 64 << 20);
      const int64_t before = gpu.be().host_waits();
      const QuantTensor fg = moe_permute_quantize(gpu, got, ga);
      EXPECT_EQ(gpu.be().host_waits(), before) << "the fused dispatch waited";
      ASSERT_TRUE(bitwise_equal(fw.data, to_cpu(fg.data))) << "fused data, f32=" << f32;
      ASSERT_TRUE(bitwise_equal(fw.scale_inv, to_cpu(fg.scale_inv)))
          << "fused scale_inv, f32=" << f32;
      ASSERT_TRUE(bitwise_equal(fw.amax, to_cpu(fg.amax))) << "fused amax, f32=" << f32;
      // Keeping the token rows too (fp8-flow): the same dispatch, and the rows are quantize()'s.
      const QuantTensor qw = quantize(cpu, qa);
      const PermuteQuantizeResult kg = moe_permute_quantize_keeping_rows(gpu, got, ga);
      ASSERT_TRUE(bitwise_equal(fw.data, to_cpu(kg.permuted.data))) << "kept: data, f32=" << f32;
      ASSERT_TRUE(bitwise_equal(fw.scale_inv, to_cpu(kg.permuted.scale_inv)))
          << "kept: scale_inv, f32=" << f32;
      ASSERT_TRUE(bitwise_equal(qw.data, to_cpu(kg.rows.data))) << "kept rows, f32=" << f32;
      ASSERT_TRUE(bitwise_equal(qw.scale_inv, to_cpu(kg.rows.scale_inv)))
          << "kept rows' scale_inv, f32=" << f32;
      ASSERT_TRUE(bitwise_equal(qw.amax, to_cpu(kg.rows.amax))) << "kept amax, f32=" << f32;
      // With the routing weights (fp8-flow's forward): the same dispatch and rows, and the
      // weights on the permuted rows are moe_permute_weights' (padding rows 0).
      const Tensor w = test::random_tensor({c.T, c.k}, DType::kF32, 8 + f32);
      poison_pool(gpu, 64 << 20);
      const PermuteQuantizeResult kw = moe_permute_quantize_keeping_rows(gpu, got, ga, to_gpu(w));
      ASSERT_TRUE(bitwise_equal(fw.data, to_cpu(kw.permuted.data))) << "weighted: data";
      ASSERT_TRUE(bitwise_equal(fw.scale_inv, to_cpu(kw.permuted.scale_inv)))
          << "weighted: scale_inv";
      ASSERT_TRUE(bitwise_equal(qw.data, to_cpu(kw.rows.data))) << "weighted: rows";
      const Tensor w_rows = moe_permute_weights(cpu, want, w);
      ASSERT_TRUE(bitwise_equal(w_rows, to_cpu(kw.w_rows))) << "weights on the rows, f32=" << f32;
      ASSERT_TRUE(bitwise_equal(w_rows, moe_permute_quantize_keeping_rows(cpu, want, qa, w).w_rows))
          << "cpu weights on the rows";
    }

    // The fused dispatch with its scaling-aware column-wise copy (fp8-flow's dY): both formats,
    // both forms of the column-wise scales, BF16 (one pass when D % 16 == 0 and R % 16 == 0) and
    // F32 input (the two passes), against the CPU's dispatch-then-transpose and the GPU's own two
    // passes.
    for (const Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (const Granularity cg : {Granularity::k128x128, Granularity::k1x128})
        for (const bool f32 : {false, true}) {
          SCOPED_TRACE(std::string(fmt == Fp8Format::kE4M3 ? "e4m3" : "e5m2") +
                       (cg == Granularity::k1x128 ? " 1x128 scales" : " 128x128 scales") +
                       (f32 ? " f32" : " bf16"));
          const QuantizeArgs qa{.input = f32 ? x32 : x,
                                .format = fmt,
                                .granularity = Granularity::k1x128,
                                .rounding = ScaleRounding::kPow2};
          const QuantTensor tw = moe_permute_quantize_transposed(cpu, want, qa, cg);
          const PermuteQuantizeResult two_cpu = moe_permute_quantize_keeping_rows(cpu, want, qa);
          const QuantTensor ref = moe_permute_transposed(cpu, want, two_cpu.rows, cg);
          ASSERT_TRUE(bitwise_equal(two_cpu.permuted.data, tw.data)) << "cpu data";
          ASSERT_TRUE(bitwise_equal(ref.columnwise_data, tw.columnwise_data)) << "cpu transposed";
          ASSERT_TRUE(bitwise_equal(ref.columnwise_scale_inv, tw.columnwise_scale_inv))
              << "cpu transposed scale_inv";
          QuantizeArgs ga = qa;
          ga.input = f32 ? gx32 : gx;
          poison_pool(gpu, 64 << 20);
          const int64_t before = gpu.be().host_waits();
          const QuantTensor tg = moe_permute_quantize_transposed(gpu, got, ga, cg);
          EXPECT_EQ(gpu.be().host_waits(), before) << "the transposed dispatch waited";
          ASSERT_EQ(tg.columnwise_granularity, cg);
          ASSERT_TRUE(bitwise_equal(tw.data, to_cpu(tg.data))) << "data";
          ASSERT_TRUE(bitwise_equal(tw.scale_inv, to_cpu(tg.scale_inv))) << "scale_inv";
          ASSERT_TRUE(bitwise_equal(tw.amax, to_cpu(tg.amax))) << "amax";
          ASSERT_TRUE(bitwise_equal(tw.columnwise_data, to_cpu(tg.columnwise_data)))
              << "transposed data";
          ASSERT_TRUE(bitwise_equal(tw.columnwise_scale_inv, to_cpu(tg.columnwise_scale_inv)))
              << "transposed scale_inv";
          const PermuteQuantizeResult two = moe_permute_quantize_keeping_rows(gpu, got, ga);
          const QuantTensor tt = moe_permute_transposed(gpu, got, two.rows, cg);
          ASSERT_TRUE(bitwise_equal(to_cpu(tt.columnwise_data), to_cpu(tg.columnwise_data)))
              << "transposed data against the GPU's two passes";
        }
  }
}

TEST_P(MoePermuteGpu, CombineAndBackwardsMatchCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const Case c = GetParam();
  const Tensor idx = random_routing(c.T, c.k, c.E, 200 + c.T, c.empty_tail);
  const Tensor w = test::random_tensor({c.T, c.k}, DType::kF32, 5);
  const Tensor gw = to_gpu(w);
  for (PermutePadding pad : {PermutePadding::kNone, PermutePadding::kTo128}) {
    SCOPED_TRACE(describe(c, pad));
    const PermuteMap want =
        moe_permute_map(cpu, {.topk_idx = idx, .num_experts = c.E, .padding = pad});
    const PermuteMap got = gpu_map(idx, c.E, pad);
    for (DType in_dt : {DType::kBF16, DType::kF32}) {
      const Tensor y = test::random_tensor({want.num_rows, c.D}, in_dt, 6, test::Dist::kOutliers);
      const Tensor gy = to_gpu(y);
      for (DType out_dt : {DType::kBF16, DType::kF32}) {
        SCOPED_TRACE(std::string("in ") + std::string(dtype_name(in_dt)) + " out " +
                     std::string(dtype_name(out_dt)));
        poison_pool(gpu, 64 << 20);
        const Tensor cw =
            moe_combine(cpu, want, {.expert_out = y, .topk_weight = w, .out_dtype = out_dt});
        const Tensor cg =
            moe_combine(gpu, got, {.expert_out = gy, .topk_weight = gw, .out_dtype = out_dt});
        ASSERT_TRUE(bitwise_equal(cw, to_cpu(cg))) << "combine";
        ASSERT_TRUE(bitwise_equal(
            to_cpu(cg), to_cpu(moe_combine(
                            gpu, got, {.expert_out = gy, .topk_weight = gw, .out_dtype = out_dt}))))
            << "combine rerun";
        ASSERT_TRUE(bitwise_equal(moe_permute_backward(cpu, want, y, out_dt),
                                  to_cpu(moe_permute_backward(gpu, got, gy, out_dt))))
            << "permute backward";
        // With the routing weights' gradient from the rows (fp8-flow's backward).
        const Tensor d_rows = test::random_tensor({want.num_rows}, DType::kF32, 9);
        poison_pool(gpu, 64 << 20);
        const PermuteBackwardResult bg =
            moe_permute_backward_with_weights(gpu, got, gy, out_dt, to_gpu(d_rows));
        const PermuteBackwardResult bc =
            moe_permute_backward_with_weights(cpu, want, y, out_dt, d_rows);
        ASSERT_TRUE(bitwise_equal(moe_permute_backward(cpu, want, y, out_dt), bc.d_x))
            << "cpu permute backward with weights";
        ASSERT_TRUE(
            bitwise_equal(moe_permute_weights_backward(cpu, want, d_rows), bc.d_topk_weight))
            << "cpu weights backward";
        ASSERT_TRUE(bitwise_equal(bc.d_x, to_cpu(bg.d_x))) << "permute backward with weights";
        ASSERT_TRUE(bitwise_equal(bc.d_topk_weight, to_cpu(bg.d_topk_weight)))
            << "weights backward from the rows";

        const Tensor dy = test::random_tensor({c.T, c.D}, out_dt, 7);
        poison_pool(gpu, 64 << 20);
        const CombineGrads gw_cpu = moe_combine_backward(
            cpu, want,
            {.d_out = dy, .expert_out = y, .topk_weight = w, .d_expert_out_dtype = in_dt});
        const CombineGrads gw_gpu = moe_combine_backward(gpu, got,
                                                         {.d_out = to_gpu(dy),
                                                          .expert_out = gy,
                                                          .topk_weight = gw,
                                                          .d_expert_out_dtype = in_dt});
        ASSERT_TRUE(bitwise_equal(gw_cpu.d_expert_out, to_cpu(gw_gpu.d_expert_out)))
            << "d_expert_out";
        ASSERT_TRUE(bitwise_equal(gw_cpu.d_topk_weight, to_cpu(gw_gpu.d_topk_weight)))
            << "d_topk_weight";
      }
    }
  }
}

const Case kCases[] = {
    {1, 1, 8, 0, 1},
    // One token over 256 experts: padded to 128, the map has the static bound of rows,
    // floor((T k + 127 E) / 128) * 128 = 32512, which the CPU references walk whole. At D = 7168
    // this one case took 147 s of the GPU suite (an H200 machine), so it takes a D of nine groups;
    // DeepSeek-V3's 7168 is {96, 4, 16, 0, 7168}.
    {1, 8, 256, 0, 1152},
    {127, 2, 8, 1, 129},
    {127, 8, 32, 5, 300},
    {1481, 8, 256, 20, 64},
    {1481, 8, 256, 0, 7},
    {129, 8, 256, 200, 1024},
    {64, 4, 16, 12, 136},
    {300, 1, 8, 7, 200},  // all to one expert
    // The 16-byte paths: the baseline's routing (32 experts top-4, D 1024), DeepSeek-V3's hidden
    // size with 16 experts, a D that is a multiple of 8 but not of 128 (a partial last group), all
    // to one expert, and a skewed routing with empty experts.
    {2048, 4, 32, 0, 1024},
    {96, 4, 16, 0, 7168},
    {300, 4, 16, 0, 1000},
    {200, 1, 8, 7, 256},
    {777, 6, 64, 40, 520},
    {500, 8, 3000, 0, 16},  // more experts than the offsets scan's block: chunks with a carry
};

INSTANTIATE_TEST_SUITE_P(Shapes, MoePermuteGpu, ::testing::ValuesIn(kCases));

// The transposed dispatch's amax covers a token none of whose choices is kept (its tiles never
// read it), as the dispatch's own amax does (it quantizes every token); only the GPU map drops
// invalid ids (the CPU's refuses them), so the reference is the GPU's two passes.
TEST(MoePermuteGpuMisc, TransposedDispatchAmaxCoversDroppedTokens) {
  OCTET_REQUIRE_GPU();
  auto& gpu = devices().gpu;
  Tensor idx = Tensor::empty({3, 2}, DType::kI32);
  const int32_t ids[] = {1, 0, -3, 9, 0, 2};  // token 1: both ids outside [0, 4)
  std::copy(ids, ids + 6, idx.data_as<int32_t>());
  Tensor x = test::random_tensor({3, 256}, DType::kBF16, 11);
  x.data_as<uint16_t>()[256 + 17] = 0x4480;  // 1024 on the dropped token: the amax
  const PermuteMap m = moe_permute_map(
      gpu, {.topk_idx = to_gpu(idx), .num_experts = 4, .padding = PermutePadding::kTo128});
  const QuantizeArgs qa{.input = to_gpu(x),
                        .format = Fp8Format::kE4M3,
                        .granularity = Granularity::k1x128,
                        .rounding = ScaleRounding::kPow2};
  const QuantTensor t = moe_permute_quantize_transposed(gpu, m, qa, Granularity::k1x128);
  const PermuteQuantizeResult two = moe_permute_quantize_keeping_rows(gpu, m, qa);
  const QuantTensor tt = moe_permute_transposed(gpu, m, two.rows, Granularity::k1x128);
  EXPECT_EQ(to_cpu(t.amax).data_as<float>()[0], 1024.0f);
  EXPECT_TRUE(bitwise_equal(to_cpu(two.permuted.amax), to_cpu(t.amax)));
  EXPECT_TRUE(bitwise_equal(to_cpu(two.permuted.data), to_cpu(t.data)));
  EXPECT_TRUE(bitwise_equal(to_cpu(two.permuted.scale_inv), to_cpu(t.scale_inv)));
  EXPECT_TRUE(bitwise_equal(to_cpu(tt.columnwise_data), to_cpu(t.columnwise_data)));
  EXPECT_TRUE(bitwise_equal(to_cpu(tt.columnwise_scale_inv), to_cpu(t.columnwise_scale_inv)));
}

// The gathers' then_add (the MoE layer's shared experts and residual added in the combine's pass)
// against the CPU's op, bit for bit: both out dtypes, the 16-byte path (D % 8 == 0) and the
// element path, padded and unpadded maps, and an inf - inf whose NaN both make canonical.
TEST(MoePermuteGpuMisc, GatherThenAddMatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  const int64_t T = 301, k = 4, E = 16;
  const Tensor idx = random_routing(T, k, E, 61, 3);
  for (PermutePadding pad : {PermutePadding::kNone, PermutePadding::kTo128}) {
    const PermuteMap want =
        moe_permute_map(cpu, {.topk_idx = idx, .num_experts = E, .padding = pad});
    const PermuteMap got = gpu_map(idx, E, pad);
    for (int64_t D : {int64_t{1024}, int64_t{36}}) {
      const Tensor y = test::random_tensor({want.num_rows, D}, DType::kBF16, 62);
      const Tensor w = test::random_tensor({T, k}, DType::kF32, 63);
      for (DType dt : {DType::kBF16, DType::kF32}) {
        Tensor a0 = test::random_tensor({T, D}, dt, 64), a1 = test::random_tensor({T, D}, dt, 65);
        if (dt == DType::kBF16) {
          a0.data_as<uint16_t>()[5] = 0x7F80;  // +inf, then -inf: NaN
          a1.data_as<uint16_t>()[5] = 0xFF80;
        } else {
          a0.data_as<float>()[5] = INFINITY;
          a1.data_as<float>()[5] = -INFINITY;
        }
        const Tensor ga0 = to_gpu(a0), ga1 = to_gpu(a1);
        const std::string what = describe({T, k, E, 3, D}, pad) + " " + std::string(dtype_name(dt));
        const Tensor cw = moe_combine(
            cpu, want, {.expert_out = y, .topk_weight = w, .out_dtype = dt, .then_add = {a0, a1}});
        const Tensor cg = moe_combine(gpu, got,
                                      {.expert_out = to_gpu(y),
                                       .topk_weight = to_gpu(w),
                                       .out_dtype = dt,
                                       .then_add = {ga0, ga1}});
        ASSERT_TRUE(bitwise_equal(cw, to_cpu(cg))) << "combine " << what;
        const Tensor bw = moe_permute_backward(cpu, want, y, dt, {a0, a1});
        const Tensor bg = moe_permute_backward(gpu, got, to_gpu(y), dt, {ga0, ga1});
        ASSERT_TRUE(bitwise_equal(bw, to_cpu(bg))) << "gather back " << what;
        const Tensor b1 = moe_permute_backward(gpu, got, to_gpu(y), dt, {ga1});
        ASSERT_TRUE(bitwise_equal(moe_permute_backward(cpu, want, y, dt, {a1}), to_cpu(b1)))
            << "one addend " << what;
      }
    }
  }
}

TEST(MoePermuteGpuMisc, InvalidIdsAreDroppedNotWritten) {
  OCTET_REQUIRE_GPU();
  auto& [cpu, gpu] = devices();
  Tensor idx = Tensor::empty({3, 2}, DType::kI32);
  const int32_t ids[] = {1, 9, -3, 0, 1, 2};  // 9 and -3 are outside [0, 4)
  std::copy(ids, ids + 6, idx.data_as<int32_t>());
  const PermuteMap m = moe_permute_map(
      gpu, {.topk_idx = to_gpu(idx), .num_experts = 4, .padding = PermutePadding::kNone});
  const Tensor counts = to_cpu(m.counts), row_of = to_cpu(m.row_of);
  EXPECT_EQ(counts.data_as<int32_t>()[0], 1);
  EXPECT_EQ(counts.data_as<int32_t>()[1], 2);
  EXPECT_EQ(counts.data_as<int32_t>()[2], 1);
  EXPECT_EQ(counts.data_as<int32_t>()[3], 0);
  EXPECT_EQ(row_of.data_as<int32_t>()[1], -1);
  EXPECT_EQ(row_of.data_as<int32_t>()[2], -1);
  (void)cpu;
}

}  // namespace
}  // namespace octet
