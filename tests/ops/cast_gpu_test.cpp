// CUDA cast, transpose and add_into against the CPU reference, bit for bit, on odd and prime shapes
// (rows 1, 127, 129, 1481 x cols 7, 129, 1000) in every dtype pairing. The inputs mix Gaussian
// values with the wide-range distribution (subnormals, large exponents) and a few NaN / inf / BF16
// rounding ties, so the rounding paths are all exercised.
//
// Outputs: add_into's y is a caller tensor, so its unwritten elements would keep their input value;
// cast and transpose allocate their outputs, which are taken from the stream-ordered pool right
// after a freed block of 0xFF bytes (NaN in F32 and BF16) of the same size, so an element a kernel
// forgets to write shows up as NaN where the CPU has a finite value (the special values are placed
// where the comparison is still exact: NaN bits must match too).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "backend/backend.h"
#include "norm_act_test_util.h"
#include "ops/cast/cast.h"

namespace octet {
namespace {

using test::random_tensor;

struct Devices {
  Context cpu = make_context(Device::kCpu);
  Context gpu = make_context(Device::kCuda);
};

Devices& devices() {
  static Devices d;
  return d;
}

const int64_t kRows[] = {1, 127, 129, 1481};
const int64_t kCols[] = {7, 129, 1000};
const DType kDtypes[] = {DType::kF32, DType::kBF16};

// Random data with special values sprinkled in (every 97th element), reproducible from the seed.
Tensor input(int64_t rows, int64_t cols, DType dt, uint64_t seed) {
  Tensor t = random_tensor({rows, cols}, DType::kF32, seed);
  const Tensor wide = random_tensor({rows, cols}, DType::kF32, seed + 1, test::Dist::kWide);
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::nanf(""),
                            1.0f + 0x1p-8f,
                            3.4e38f,
                            0x1p-130f,
                            -0.0f};
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (i % 3 == 1) p[i] = wide.data_as<const float>()[i];
    if (i % 97 == 5) p[i] = specials[(i / 97) % 7];
  }
  if (dt == DType::kF32) return t;
  Context& cpu = devices().cpu;
  return cast(cpu, t, DType::kBF16);
}

// Frees a 0xFF-filled block of `bytes` on the GPU so the next allocation of that size reuses it.
void poison_pool(int64_t bytes) {
  Context& gpu = devices().gpu;
  (void)test::poisoned(gpu, {bytes}, DType::kU8);
}

std::string where(const char* op, int64_t r, int64_t c, DType a, DType b) {
  return std::string(op) + " " + std::to_string(r) + "x" + std::to_string(c) + " " +
         std::string(dtype_name(a)) + "->" + std::string(dtype_name(b));
}

TEST(CastGpu, CastMatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  Context& cpu = devices().cpu;
  Context& gpu = devices().gpu;
  for (int64_t r : kRows)
    for (int64_t c : kCols)
      for (DType from : kDtypes)
        for (DType to : kDtypes) {
          const Tensor x = input(r, c, from, static_cast<uint64_t>(r * 7 + c));
          const Tensor want = cast(cpu, x, to);
          const Tensor xd = x.to(gpu, Device::kCuda);
          poison_pool(r * c * dtype_size(to));
          const Tensor got = cast(gpu, xd, to).to_host(gpu);
          EXPECT_TRUE(test::bitwise_equal(want, got)) << where("cast", r, c, from, to);
        }
}

TEST(CastGpu, TransposeMatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  Context& cpu = devices().cpu;
  Context& gpu = devices().gpu;
  for (int64_t r : kRows)
    for (int64_t c : kCols)
      for (DType dt : kDtypes) {
        const Tensor x = input(r, c, dt, static_cast<uint64_t>(r * 11 + c));
        const Tensor want = transpose(cpu, x);
        const Tensor xd = x.to(gpu, Device::kCuda);
        poison_pool(r * c * dtype_size(dt));
        const Tensor got = transpose(gpu, xd).to_host(gpu);
        EXPECT_EQ(got.shape(), (Shape{c, r}));
        EXPECT_TRUE(test::bitwise_equal(want, got)) << where("transpose", r, c, dt, dt);
      }
}

TEST(CastGpu, TransposeOfATallMatrixBeyondOneGridColumn) {
  OCTET_REQUIRE_GPU();
  // 65535 tiles of 32 rows is the grid's y limit: 2^21 + 3 rows take the grid-stride path.
  Context& cpu = devices().cpu;
  Context& gpu = devices().gpu;
  const Tensor x = input((int64_t{1} << 21) + 3, 3, DType::kBF16, 5);
  const Tensor got = transpose(gpu, x.to(gpu, Device::kCuda)).to_host(gpu);
  EXPECT_TRUE(test::bitwise_equal(transpose(cpu, x), got));
}

TEST(CastGpu, AddIntoMatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  Context& cpu = devices().cpu;
  Context& gpu = devices().gpu;
  for (int64_t r : kRows)
    for (int64_t c : kCols)
      for (DType ydt : kDtypes)
        for (DType xdt : kDtypes) {
          const Tensor y0 = input(r, c, ydt, static_cast<uint64_t>(r * 13 + c));
          const Tensor x = input(r, c, xdt, static_cast<uint64_t>(r * 17 + c));
          Tensor want = cast(cpu, y0, ydt);  // a copy
          add_into(cpu, want, x);
          add_into(cpu, want, x);
          Tensor yd = y0.to(gpu, Device::kCuda);
          const Tensor xd = x.to(gpu, Device::kCuda);
          add_into(gpu, yd, xd);  // +=, twice: the second reads what the first wrote
          add_into(gpu, yd, xd);
          EXPECT_TRUE(test::bitwise_equal(want, yd.to_host(gpu)))
              << where("add_into", r, c, xdt, ydt);
        }
}

}  // namespace
}  // namespace octet
