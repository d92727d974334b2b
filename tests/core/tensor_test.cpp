// Tensor shapes: element and byte counts never wrap; a shape too large is one clear error.
#include "core/tensor.h"

#include <gtest/gtest.h>

#include "core/check.h"

namespace octet {
namespace {

TEST(TensorShape, CountsThatWouldOverflowAreErrors) {
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({3, 0, 5}), 0);
  EXPECT_EQ(shape_numel({int64_t{1} << 31, int64_t{1} << 31}), int64_t{1} << 62);
  EXPECT_THROW(shape_numel({int64_t{1} << 32, int64_t{1} << 32}), Error);
  EXPECT_THROW(shape_numel({4, -1}), Error);
  // 2^62 F32 elements: the count fits, the byte size does not (it used to wrap to 0 bytes).
  try {
    Tensor::empty({int64_t{1} << 62}, DType::kF32);
    ADD_FAILURE() << "allocated 2^64 bytes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overflows"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace octet
