#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/check.h"
#include "train/lr_schedule.h"

namespace octet::train {
namespace {

LrSchedule cosine() {
  LrSchedule s;
  s.lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_steps = 10;
  s.total_steps = 111;  // the decay spans steps 10..110: 100 intervals
  return s;
}

TEST(LrSchedule, WarmupIsLinearAndReachesThePeakOnItsLastStep) {
  const LrSchedule s = cosine();
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 0.1);  // (0 + 1) / 10: the first update already moves
  EXPECT_DOUBLE_EQ(lr_at(s, 4), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(s, 9), 1.0);
}

TEST(LrSchedule, WarmupCanStartAboveZero) {
  LrSchedule s = cosine();
  s.warmup_init = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 0.1 + 0.9 * 0.1);
  EXPECT_DOUBLE_EQ(lr_at(s, 9), 1.0);
}

TEST(LrSchedule, CosineDecaysFromThePeakToMinLrAtTheLastStep) {
  const LrSchedule s = cosine();
  EXPECT_DOUBLE_EQ(lr_at(s, 10), 1.0);
  EXPECT_NEAR(lr_at(s, 60), 0.55, 1e-15);  // halfway: min + (lr - min) / 2
  EXPECT_NEAR(lr_at(s, 35), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(lr_at(s, 110), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(s, 500), 0.1);  // past the end: the floor
  for (int64_t t = 11; t <= 110; ++t) EXPECT_LT(lr_at(s, t), lr_at(s, t - 1)) << "step " << t;
}

TEST(LrSchedule, ConstantHoldsThePeakAfterWarmup) {
  LrSchedule s = cosine();
  s.kind = LrScheduleKind::kConstant;
  EXPECT_DOUBLE_EQ(lr_at(s, 4), 0.5);
  for (int64_t t : {10, 60, 110, 1000}) EXPECT_DOUBLE_EQ(lr_at(s, t), 1.0);
}

TEST(LrSchedule, NoWarmupStartsAtThePeakAndShortRunsDoNotDivideByZero) {
  LrSchedule s = cosine();
  s.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 1.0);
  s.warmup_steps = 3;
  s.total_steps = 4;  // one step after warmup: it keeps the peak
  EXPECT_DOUBLE_EQ(lr_at(s, 3), 1.0);
  s.total_steps = 1;
  s.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(lr_at(s, 0), 1.0);
}

TEST(LrSchedule, ValidateNamesTheField) {
  auto message = [](const LrSchedule& s) {
    try {
      s.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  LrSchedule s = cosine();
  EXPECT_EQ(message(s), "");
  s.min_lr = 2.0;
  EXPECT_NE(message(s).find("min_lr"), std::string::npos) << message(s);
  s = cosine();
  s.lr = 0;
  EXPECT_NE(message(s).find("lr must be"), std::string::npos) << message(s);
  s = cosine();
  s.warmup_init = 1.0;
  EXPECT_NE(message(s).find("warmup_init"), std::string::npos) << message(s);
  EXPECT_THROW(lr_at(cosine(), -1), Error);
}

}  // namespace
}  // namespace octet::train
