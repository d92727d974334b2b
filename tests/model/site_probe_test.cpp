// SiteProbe: the saturated and flushed shares it reports are the ones the site's quantization
// produces, on hand-made tensors whose answer is known.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "model/site_probe.h"

namespace octet {
namespace {

Tensor values(std::initializer_list<float> v, int64_t cols) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size()) / cols, cols}, DType::kF32);
  std::copy(v.begin(), v.end(), t.data_as<float>());
  return t;
}

GemmRecipe per_tensor() {
  GemmRecipe r;
  r.precision = GemmPrecision::kFp8Tensor;
  return r;
}

TEST(SiteProbe, DelayedScaleThatIsTooLargeSaturates) {
  Context ctx = make_context(Device::kCpu);
  SiteProbe p;
  Tensor scale = Tensor::empty({1}, DType::kF32);
  scale.data_as<float>()[0] = 100.0f;  // 1.0 * 100 fits, 5.0 * 100 = 500 > 464 is clamped
  p.record(ctx, GemmSite::kAttnOut, GemmOperand::kActivation, values({1.0f, 5.0f, -6.0f, 0.0f}, 4),
           per_tensor(), &scale);
  const SiteNumerics& s = p.sites().at("attn.out.x");
  EXPECT_EQ(s.elements, 4);
  EXPECT_EQ(s.saturated, 2);
  EXPECT_EQ(s.flushed, 0);
  EXPECT_DOUBLE_EQ(s.amax, 6.0);
}

TEST(SiteProbe, CurrentScalingNeverSaturatesButFlushesTinyValues) {
  Context ctx = make_context(Device::kCpu);
  SiteProbe p;
  // amax 448 -> scale 1; 1e-4 is far below E4M3's smallest subnormal 2^-9.
  p.record(ctx, GemmSite::kDenseDown, GemmOperand::kGradient,
           values({448.0f, 1e-4f, -3.0f, 2e-4f}, 2), per_tensor(), nullptr);
  const SiteNumerics& s = p.sites().at("dense.down.dy");
  EXPECT_EQ(s.saturated, 0);
  EXPECT_EQ(s.flushed, 2);
  EXPECT_DOUBLE_EQ(s.flushed_share(), 0.5);
}

TEST(SiteProbe, TilesScaleEachGroupAndBf16SitesReportAmaxOnly) {
  Context ctx = make_context(Device::kCpu);
  SiteProbe p;
  GemmRecipe block;
  block.precision = GemmPrecision::kFp8Block;
  // One row, one tile: its own amax sets the scale, so 1e-4 next to 1.0 survives (1e-4 * 448 is
  // above the smallest subnormal).
  p.record(ctx, GemmSite::kAttnQUp, GemmOperand::kActivation, values({1.0f, 1e-4f}, 2), block,
           nullptr);
  EXPECT_EQ(p.sites().at("attn.q_up.x").flushed, 0);
  p.record(ctx, GemmSite::kHead, GemmOperand::kActivation, values({2.0f, -7.0f}, 2), GemmRecipe{},
           nullptr);
  EXPECT_DOUBLE_EQ(p.sites().at("head.x").amax, 7.0);
  EXPECT_EQ(p.sites().at("head.x").saturated, 0);
}

}  // namespace
}  // namespace octet
