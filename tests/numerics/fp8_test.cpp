#include <gtest/gtest.h>

#include "numerics/fp8.h"

namespace octet {

TEST(Fp8, E4M3KnownValues) {
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(1e9f), 0x7E);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
}

}  // namespace octet
