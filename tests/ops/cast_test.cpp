// The cast family on the CPU: BF16 rounding (ties to even, NaN, inf, overflow, subnormals), the
// transpose of odd shapes and of 3-D inputs (matrix view), y += x with one FP32 add in every dtype
// pairing, and argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/backend.h"
#include "norm_act_test_util.h"
#include "ops/cast/cast.h"
#include "ops/cast/cast_backends.h"
#include "ops/cast/storage_round_bf16.h"

namespace octet {
namespace {

using test::random_tensor;

Context& cpu() {
  static Context c = make_context(Device::kCpu);
  return c;
}

Tensor f32_tensor(const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kF32);
  std::memcpy(t.data(), v.data(), v.size() * sizeof(float));
  return t;
}

uint16_t bf16_at(const Tensor& t, int64_t i) {
  return t.data_as<const uint16_t>()[i];
}

TEST(Cast, F32ToBf16RoundsToNearestEven) {
  const float inf = std::numeric_limits<float>::infinity();
  // 1 + 2^-8 is halfway between BF16 1.0 and 1 + 2^-7: ties go to the even code (1.0); 1 + 3*2^-8
  // is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: goes up. Just above a tie rounds up.
  const Tensor x = f32_tensor({1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f,
                               -2.5f, inf, -inf, std::nanf(""), 3.4e38f, 0x1p-130f, 0.0f, -0.0f});
  const Tensor y = cast(cpu(), x, DType::kBF16);
  ASSERT_EQ(y.dtype(), DType::kBF16);
  ASSERT_EQ(y.shape(), x.shape());
  const uint16_t want[] = {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020, 0x7F80,
                           0xFF80, 0,      0x7F80, 0x0008, 0x0000, 0x8000};
  for (int64_t i = 0; i < 12; ++i) {
    if (i == 7) {
      EXPECT_EQ(bf16_at(y, i) & 0x7FFF, 0x7FFF) << "NaN stays NaN";
      continue;
    }
    EXPECT_EQ(bf16_at(y, i), want[i]) << "element " << i << " (" << x.data_as<float>()[i] << ")";
  }
}

TEST(Cast, RoundTripsAndSameDtypeCopies) {
  const Tensor b = random_tensor({3, 5, 41}, DType::kBF16, 11);
  const Tensor f = cast(cpu(), b, DType::kF32);
  ASSERT_EQ(f.shape(), b.shape());
  for (int64_t i = 0; i < b.numel(); ++i)
    ASSERT_EQ(f.data_as<float>()[i], bf16_to_float(bf16_at(b, i))) << "element " << i;
  EXPECT_TRUE(test::bitwise_equal(b, cast(cpu(), f, DType::kBF16)));
  const Tensor same = cast(cpu(), b, DType::kBF16);
  EXPECT_NE(same.data(), b.data()) << "a cast returns a new tensor";
  EXPECT_TRUE(test::bitwise_equal(b, same));
  const Tensor x = random_tensor({129}, DType::kF32, 12, test::Dist::kWide);
  EXPECT_TRUE(test::bitwise_equal(x, cast(cpu(), x, DType::kF32)));
}

TEST(Cast, TransposeBatchedTransposesEachMatrix) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kU8}) {
    Tensor x = Tensor::empty({3, 5, 7}, dt);
    for (int64_t i = 0; i < x.nbytes(); ++i)
      static_cast<unsigned char*>(x.data())[i] = static_cast<unsigned char>(i * 7 % 251);
    const Tensor t = transpose_batched(cpu(), x);
    ASSERT_EQ(t.shape(), (Shape{3, 7, 5}));
    const int64_t es = dtype_size(dt);
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t j = 0; j < 7; ++j)
          ASSERT_EQ(
              std::memcmp(static_cast<const char*>(t.data()) + ((b * 7 + j) * 5 + i) * es,
                          static_cast<const char*>(x.data()) + ((b * 5 + i) * 7 + j) * es, es),
              0)
              << dtype_name(dt) << " at (" << b << ", " << i << ", " << j << ")";
  }
  test::expect_error(
      [&] {
        transpose_batched(cpu(), random_tensor({4, 4}, DType::kF32, 1));
      },
      {"expected (batch, rows, cols)"});
}

TEST(Cast, TransposeOfTheMatrixView) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const Shape& s : {Shape{1, 7}, Shape{127, 1}, Shape{33, 65}, Shape{2, 3, 17}}) {
      const Tensor x = random_tensor(s, dt, 21);
      const Tensor t = transpose(cpu(), x);
      const int64_t rows = x.rows(), cols = x.cols();
      ASSERT_EQ(t.shape(), (Shape{cols, rows}));
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
          ASSERT_EQ(test::value_at(t, j * rows + i), test::value_at(x, i * cols + j))
              << shape_str(s) << " at (" << i << ", " << j << ")";
      EXPECT_TRUE(test::bitwise_equal(x.reshape({rows, cols}), transpose(cpu(), t)));
    }
  }
}

TEST(Cast, AddIntoIsOneFp32AddAndOneRounding) {
  for (DType ydt : {DType::kF32, DType::kBF16}) {
    for (DType xdt : {DType::kF32, DType::kBF16}) {
      Tensor y = random_tensor({13, 129}, ydt, 31);
      const Tensor y0 = cast(cpu(), y, ydt);
      const Tensor x = random_tensor({13, 129}, xdt, 32);
      add_into(cpu(), y, x);  // +=
      for (int64_t i = 0; i < y.numel(); ++i) {
        const float sum =
            static_cast<float>(test::value_at(y0, i)) + static_cast<float>(test::value_at(x, i));
        const double want = ydt == DType::kF32 ? sum : bf16_to_float(float_to_bf16(sum));
        ASSERT_EQ(test::value_at(y, i), want) << "element " << i;
      }
      add_into(cpu(), y, x);  // accumulates again, never overwrites
      const float twice = static_cast<float>(test::value_at(y0, 0)) +
                          static_cast<float>(test::value_at(x, 0)) +
                          static_cast<float>(test::value_at(x, 0));
      EXPECT_NEAR(test::value_at(y, 0), twice, 1e-2 * std::fabs(twice) + 1e-6);
    }
  }
}

TEST(Cast, AddIntoMakesNaNSumsCanonical) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor y = f32_tensor({inf, -std::nanf(""), 1.0f});
  add_into(cpu(), y, f32_tensor({-inf, 2.0f, 2.0f}));
  uint32_t bits[3];
  std::memcpy(bits, y.data(), sizeof(bits));
  EXPECT_EQ(bits[0], 0x7FFFFFFFu) << "inf - inf";
  EXPECT_EQ(bits[1], 0x7FFFFFFFu) << "-NaN + 2";
  EXPECT_EQ(bits[2], 0x40400000u);
  Tensor yb = cast(cpu(), f32_tensor({inf}), DType::kBF16);
  add_into(cpu(), yb, f32_tensor({-inf}));
  EXPECT_EQ(bf16_at(yb, 0), 0x7FFF);
}

TEST(Cast, EmptyTensors) {
  const Tensor x = Tensor::empty({0, 5}, DType::kF32);
  EXPECT_EQ(cast(cpu(), x, DType::kBF16).numel(), 0);
  EXPECT_EQ(transpose(cpu(), x).shape(), (Shape{5, 0}));
  Tensor y = Tensor::empty({0, 5}, DType::kBF16);
  add_into(cpu(), y, x);
}

TEST(Cast, RejectsBadArguments) {
  const Tensor x = random_tensor({4, 8}, DType::kF32, 41);
  test::expect_error([&] { cast(cpu(), x, DType::kE4M3); }, {"cast", "F32 or BF16", "F8_E4M3"});
  const Tensor i32 = Tensor::empty({4}, DType::kI32);
  test::expect_error([&] { cast(cpu(), i32, DType::kF32); }, {"cast input"});
  test::expect_error([&] { transpose(cpu(), i32); }, {"transpose input"});
  Tensor y = random_tensor({4, 7}, DType::kF32, 42);
  test::expect_error([&] { add_into(cpu(), y, x); }, {"add_into x", "[4, 7]", "[4, 8]"});
  Tensor same = x;
  test::expect_error([&] { add_into(cpu(), same, x); }, {"overlap"});
}

// storage_round_bf16.h's integer element against the reference, float_to_bf16(storage_round(x,
// 2^k, f)), for every BF16 x (NaN, inf, zeros, subnormals, every tie) and every tile scale 2^k a
// tile holding x can get: k from that of BF16's largest finite amax up to that of amax = |x| (a
// larger amax gives a smaller scale), up to 2^100 for a zero, and k = 0 for every x (a tile with a
// zero, inf or NaN amax). Formats: the ones the model uses and the corners of the supported range.
TEST(Cast, StorageRoundBf16MatchesTheReferenceOnEveryInput) {
  const ExMyFormat formats[] = {kE5M6Format,
                                kE4M3Format,
                                kE5M2Format,
                                {5, 7, ExMyKind::kIeee},
                                {5, 1, ExMyKind::kIeee},
                                {3, 2, ExMyKind::kIeee},
                                {2, 1, ExMyKind::kFiniteOnly},
                                {4, 7, ExMyKind::kFiniteOnly}};
  const auto scale_exp = [](float s) { return static_cast<int>(float_bits(s) >> 23) - 127; };
  for (const ExMyFormat& f : formats) {
    ASSERT_TRUE(storage_bf16_supported(f));
    const StorageBf16Format g = storage_bf16_format(f);
    // The kernel's tile scale comes from max_bits (storage_tile_scale_for_max): the same value.
    ASSERT_EQ(float_bits(bf16_to_float(static_cast<uint16_t>(g.max_bits))),
              float_bits(decode_exmy(f.max_code(), f)));
    const int kmin = scale_exp(storage_tile_scale(bf16_to_float(0x7F7F), f));
    int64_t checked = 0, mismatches = 0;
    for (uint32_t b = 0; b < 0x10000u; ++b) {
      const uint32_t a = b & 0x7FFFu;
      const float x = bf16_to_float(static_cast<uint16_t>(b));
      const int kmax =
          a == 0 ? 100 : (a >= 0x7F80u ? 0 : scale_exp(storage_tile_scale(std::fabs(x), f)));
      for (int k = std::min(kmin, 0); k <= std::max(kmax, 0); ++k) {
        if (k != 0 && (k < kmin || k > kmax)) continue;
        const float s = bits_float(static_cast<uint32_t>(127 + k) << 23);
        const StorageBf16Tile tile = storage_bf16_tile(g, s);
        const uint32_t want = float_to_bf16(storage_round(x, s, f));
        const uint32_t got = storage_round_bf16(b, g, tile);
        uint32_t pair = got, other = 0;
        if (storage_bf16_is_normal(a, tile)) {
          // The pair form, x in the low half next to another value of the normal branch.
          other = (b * 40503u + static_cast<uint32_t>(k)) & 0xFFFFu;
          if (!storage_bf16_is_normal(other & 0x7FFFu, tile)) other = b ^ 0x8000u;
          pair = storage_bf16_normal_pair(b | (other << 16), g, tile);
          pair = (pair >> 16) == storage_round_bf16(other, g, tile) ? pair & 0xFFFFu : ~0u;
        }
        ++checked;
        if ((want != got || want != pair) && ++mismatches <= 5)
          ADD_FAILURE() << "E" << f.exp_bits << "M" << f.man_bits << " x bits 0x" << std::hex << b
                        << " k " << std::dec << k << ": want 0x" << std::hex << want << ", got 0x"
                        << got << ", as a pair with 0x" << other << " 0x" << pair;
      }
    }
    EXPECT_EQ(mismatches, 0) << "E" << f.exp_bits << "M" << f.man_bits;
    EXPECT_GT(checked, 65536 * 50);
  }
  EXPECT_FALSE(storage_bf16_supported({8, 7, ExMyKind::kIeee}));
  EXPECT_FALSE(storage_bf16_supported({5, 10, ExMyKind::kIeee}));
}

}  // namespace
}  // namespace octet
