#include "test_util.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "backend/backend.h"
#include "numerics/fp8.h"

namespace octet::test {

bool has_gpu() {
  return cuda_built() && cuda_device_count() > 0;
}

Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, Dist dist) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  const int64_t cols = t.cols();
  float row_scale = 1.0f;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (cols && i % cols == 0)
      row_scale = (dist == Dist::kOutliers && uni(rng) < 0.05f) ? 0x1p-20f : 1.0f;
    float v = normal(rng);
    if (dist == Dist::kOutliers) {
      v *= row_scale;
      if (uni(rng) < 0.01f) v *= std::ldexp(1.0f, static_cast<int>(uni(rng) * 12));
    } else if (dist == Dist::kWide) {
      v = (uni(rng) < 0.5f ? -1.0f : 1.0f) *
          std::ldexp(1.0f + uni(rng), static_cast<int>(uni(rng) * 80) - 40);
    }
    if (dtype == DType::kF32)
      t.data_as<float>()[i] = v;
    else
      t.data_as<uint16_t>()[i] = float_to_bf16(v);
  }
  return t;
}

void poison(Tensor& t, uint8_t byte) {
  std::memset(t.data(), byte, static_cast<size_t>(t.nbytes()));
}

::testing::AssertionResult bitwise_equal(const Tensor& expected, const Tensor& actual) {
  if (expected.dtype() != actual.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(expected.dtype()) << " vs " << dtype_name(actual.dtype());
  if (expected.shape() != actual.shape())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(expected.shape()) << " vs " << shape_str(actual.shape());
  const int64_t es = dtype_size(expected.dtype()), cols = std::max<int64_t>(expected.cols(), 1);
  const auto* a = static_cast<const uint8_t*>(expected.data());
  const auto* b = static_cast<const uint8_t*>(actual.data());
  int64_t mismatches = 0, first = -1;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    if (std::memcmp(a + i * es, b + i * es, static_cast<size_t>(es)) != 0) {
      if (first < 0) first = i;
      ++mismatches;
    }
  }
  if (!mismatches) return ::testing::AssertionSuccess();
  auto hex = [&](const uint8_t* p) {
    std::ostringstream os;
    os << "0x" << std::hex;
    for (int64_t k = es - 1; k >= 0; --k) os << (p[k] < 16 ? "0" : "") << static_cast<int>(p[k]);
    return os.str();
  };
  return ::testing::AssertionFailure()
         << mismatches << " of " << expected.numel() << " elements differ; first at (row "
         << first / cols << ", col " << first % cols << "): expected " << hex(a + first * es)
         << ", got " << hex(b + first * es);
}

std::string fresh_temp_dir(const std::string& prefix, const std::string& name) {
  const std::filesystem::path p =
      std::filesystem::temp_directory_path() /
      ("octet_" + prefix + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

std::string write_pangram_corpus(const std::string& dir, int lines) {
  std::ostringstream s;
  for (int i = 0; i < lines; ++i)
    s << "The quick brown fox " << i % 7 << " jumps over the lazy dog number " << i % 13
      << ". Pack my box with five dozen liquor jugs.\n";
  const std::string path = dir + "/corpus.txt";
  std::ofstream(path) << s.str();
  return path;
}

}  // namespace octet::test
