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

#include <algorithm>
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

// The grouped layers' weight relayout: FP8 bytes, F32 scales and BF16 weights of many experts.
TEST(CastGpu, TransposeBatchedMatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  Context& cpu = devices().cpu;
  Context& gpu = devices().gpu;
  for (const Shape& s : {Shape{32, 176, 128}, Shape{3, 33, 65}, Shape{7, 1, 129}, Shape{32, 11, 8}})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kE4M3}) {
      // FP8: the bytes of a BF16 input (specials included) read as twice as many E4M3 elements.
      const bool fp8 = dt == DType::kE4M3;
      const Tensor x = input(s[0] * s[1], s[2], fp8 ? DType::kBF16 : dt, 17);
      const Tensor xr =
          Tensor::wrap(x.data(), {s[0], s[1], fp8 ? 2 * s[2] : s[2]}, dt, Device::kCpu);
      const Tensor want = transpose_batched(cpu, xr);
      poison_pool(xr.nbytes());
      const Tensor got = transpose_batched(gpu, xr.to(gpu, Device::kCuda)).to_host(gpu);
      EXPECT_TRUE(test::bitwise_equal(want, got)) << shape_str(s) << " " << dtype_name(dt);
    }
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

// input() with its NaNs replaced by 2.5: CPU and GPU division give NaNs different bits, and the
// round_to_storage contract does not fix a NaN's payload (the test below checks NaN against the
// GPU's own element-wise kernel instead).
Tensor finite_input(int64_t rows, int64_t cols, DType dt, uint64_t seed) {
  Tensor t = input(rows, cols, DType::kF32, seed);
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isnan(p[i])) p[i] = 2.5f;
  return dt == DType::kF32 ? t : cast(devices().cpu, t, DType::kBF16);
}

// Widths that are multiples of 8 (1000, 1024, 136) take round_to_storage_vec_kernel; 7 and 129 the
// element-wise kernel. Partial 1x128 tiles at the end of a row in both.
TEST(CastGpu, RoundToStorageMatchesCpuBitwise) {
  OCTET_REQUIRE_GPU();
  Context& cpu = devices().cpu;
  Context& gpu = devices().gpu;
  for (int64_t r : kRows)
    for (int64_t c : {int64_t{7}, int64_t{129}, int64_t{136}, int64_t{1000}, int64_t{1024}})
      for (DType dt : kDtypes)
        for (ExMyFormat f : {kE5M6Format, kE4M3Format}) {
          const Tensor x = finite_input(r, c, dt, static_cast<uint64_t>(r * 19 + c));
          const Tensor want = round_to_storage(cpu, x, f);
          poison_pool(r * c * dtype_size(dt));
          const Tensor got = round_to_storage(gpu, x.to(gpu, Device::kCuda), f).to_host(gpu);
          EXPECT_TRUE(test::bitwise_equal(want, got))
              << where("round_to_storage", r, c, dt, dt) << " man_bits " << f.man_bits;
        }
}

// NaN (and inf) included: the vector kernel against the element-wise one, which a view 2 or 4
// bytes off a 16-byte boundary takes, on the same values.
TEST(CastGpu, RoundToStorageVectorMatchesElementwiseKernel) {
  OCTET_REQUIRE_GPU();
  Context& gpu = devices().gpu;
  const int64_t rows = 129, cols = 1000;
  for (DType dt : kDtypes) {
    const Tensor x = input(rows, cols, dt, 99);
    const int64_t es = dtype_size(dt);
    Tensor aligned = x.to(gpu, Device::kCuda);
    Tensor big = Tensor::empty(gpu, {rows * cols + 1}, dt);
    Tensor shifted =
        Tensor::wrap(static_cast<char*>(big.data()) + es, {rows, cols}, dt, Device::kCuda);
    gpu.be().copy(shifted.data(), aligned.data(), rows * cols * es, CopyKind::kDeviceToDevice);
    const Tensor want = round_to_storage(gpu, shifted, kE5M6Format).to_host(gpu);
    const Tensor got = round_to_storage(gpu, aligned, kE5M6Format).to_host(gpu);
    EXPECT_TRUE(test::bitwise_equal(want, got)) << dtype_name(dt);
  }
}

// BF16 tiles built for storage_round_bf16.h's branches: each 1x128 tile draws its amax exponent
// over BF16's whole range and its values' exponents up to 40 below it, with random signs and
// mantissas (every odd BF16 mantissa is an E5M6 tie), so the tiles' values land in the normal
// range, below it (E5M6 subnormals, rounding up into the smallest normal, down to zero) and at
// the cap; some tiles are all zeros, some hold an inf or a NaN (scale 1, saturation), some BF16
// subnormals.
Tensor storage_edge_input(int64_t rows, int64_t cols, uint64_t seed) {
  Tensor t = Tensor::empty({rows, cols}, DType::kBF16);
  uint16_t* p = t.data_as<uint16_t>();
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  const auto next = [&s] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {
      const uint32_t kind = next() % 16;
      const int top = static_cast<int>(next() % 255);  // the tile's largest exponent field
      for (int64_t c = c0; c < std::min(cols, c0 + 128); ++c) {
        const int e = std::max(0, top - static_cast<int>(next() % 41));
        uint32_t b = (next() & 0x8000u) | (static_cast<uint32_t>(e) << 7) | (next() & 0x7Fu);
        if (kind == 0) b &= 0x8000u;                                     // a tile of signed zeros
        if (kind == 1 && c == c0 + 5) b = 0x7F80u | (next() & 0x8000u);  // inf
        if (kind == 2 && c == c0 + 9) b = 0x7FC1u;                       // NaN
        p[r * cols + c] = static_cast<uint16_t>(b);
      }
    }
  return t;
}

// The BF16 kernel (integer encode, kAuto) and the previous one (kGenericEncode) against the CPU
// reference, NaN included (every path makes a NaN 0x7FFF in BF16): the o_proj input's shape of
// the baseline configuration (B T = 16384, H dv = 1024), rows whose width is not a multiple of 128
// (the tile index by division) and the edge tiles above, in E5M6 and E4M3.
TEST(CastGpu, RoundToStorageBf16KernelsMatchCpuBitwise) {
  OCTET_REQUIRE_GPU();
  Context& cpu = devices().cpu;
  Context& gpu = devices().gpu;
  struct Case {
    int64_t rows, cols;
    bool edge;
  };
  for (const Case& c : {Case{16384, 1024, false}, Case{16384, 1024, true}, Case{129, 1000, true},
                        Case{1481, 136, true}, Case{3, 8, true}})
    for (ExMyFormat f : {kE5M6Format, kE4M3Format}) {
      const Tensor x = c.edge ? storage_edge_input(c.rows, c.cols, static_cast<uint64_t>(c.cols))
                              : input(c.rows, c.cols, DType::kBF16, 7);
      const Tensor want = round_to_storage(cpu, x, f);
      const Tensor xd = x.to(gpu, Device::kCuda);
      for (StorageKernel kernel : {StorageKernel::kAuto, StorageKernel::kGenericEncode}) {
        poison_pool(c.rows * c.cols * 2);
        const Tensor got = round_to_storage(gpu, xd, f, kernel).to_host(gpu);
        EXPECT_TRUE(test::bitwise_equal(want, got))
            << c.rows << "x" << c.cols << (c.edge ? " edge" : "") << " man_bits " << f.man_bits
            << (kernel == StorageKernel::kAuto ? " integer encode" : " generic encode");
      }
    }
}

}  // namespace
}  // namespace octet
