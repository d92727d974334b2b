// The checkpoint plan (train/checkpoint_plan.h): every element written exactly once, a piece held
// by one rank written by that rank, replicated tensors shared out evenly in contiguous runs, the
// same plan on every rank, and holdings that miss or repeat elements refused.
#include "train/checkpoint_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace octet::train {
namespace {

std::vector<PlanFile> files() {
  PlanFile a{
      "a.safetensors",
      {{"w0", DType::kF32, {10, 100}}, {"w1", DType::kF32, {7}}, {"w2", DType::kF32, {50, 100}}},
      {{"format", "pt"}}};
  PlanFile b{"b.safetensors", {{"m", DType::kBF16, {6000}}, {"step", DType::kI64, {1}}}, {}};
  return {a, b};
}

// Replicated weights on every rank; the BF16 tensor in pieces of 1000 dealt round-robin; the step
// on rank 0.
std::vector<Holding> holdings(int world) {
  std::vector<Holding> h;
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  for (size_t t = 0; t < 3; ++t)
    h.push_back({.file = 0, .tensor = t, .end = t == 0 ? 1000 : t == 1 ? 7 : 5000, .ranks = all});
  for (int p = 0; p < 6; ++p)
    h.push_back(
        {.file = 1, .tensor = 0, .begin = p * 1000, .end = (p + 1) * 1000, .ranks = {p % world}});
  h.push_back({.file = 1, .tensor = 1, .end = 1, .ranks = {0}});
  return h;
}

TEST(CheckpointPlan, EveryElementOnceOwnersWriteTheirPiecesReplicasShared) {
  for (int world : {1, 2, 3, 4, 5}) {
    SCOPED_TRACE(world);
    const CheckpointPlan p = make_checkpoint_plan(files(), holdings(world), world);
    std::map<std::pair<size_t, size_t>, std::vector<std::pair<int64_t, int64_t>>> seen;
    std::vector<int64_t> replicated(static_cast<size_t>(world), 0);
    for (const WriteRange& r : p.ranges) {
      ASSERT_LT(r.begin, r.end);
      seen[{r.file, r.tensor}].emplace_back(r.begin, r.end);
      if (r.file == 1 && r.tensor == 0) EXPECT_EQ(r.rank, (r.begin / 1000) % world);
      if (r.file == 1 && r.tensor == 1) EXPECT_EQ(r.rank, 0);
      if (r.file == 0) replicated[static_cast<size_t>(r.rank)] += (r.end - r.begin) * 4;
    }
    for (auto& [key, v] : seen) {
      std::sort(v.begin(), v.end());
      int64_t at = 0;
      for (const auto& [b, e] : v) {
        EXPECT_EQ(b, at);
        at = e;
      }
      EXPECT_EQ(at, shape_numel(p.files[key.first].tensors[key.second].shape));
    }
    EXPECT_EQ(seen.size(), 5u);
    // 6007 F32 elements shared out: equal to within an element.
    const auto [lo, hi] = std::minmax_element(replicated.begin(), replicated.end());
    EXPECT_LE(*hi - *lo, 4);
    // Each rank's share of the replicated run is one contiguous stretch: at most one range per
    // tensor per rank.
    std::map<std::pair<int, size_t>, int> per;
    for (const WriteRange& r : p.ranges)
      if (r.file == 0) EXPECT_EQ(++per[std::make_pair(r.rank, r.tensor)], 1);
    // Headers: one writer per file.
    ASSERT_EQ(p.header_writer.size(), 2u);
    EXPECT_EQ(p.layouts[0].file_bytes, static_cast<int64_t>(p.layouts[0].prefix.size()) + 6007 * 4);
    // The same plan whatever rank computes it (no pointers here): a pure function.
    const CheckpointPlan q = make_checkpoint_plan(files(), holdings(world), world);
    ASSERT_EQ(q.ranges.size(), p.ranges.size());
    for (size_t i = 0; i < p.ranges.size(); ++i) EXPECT_EQ(q.ranges[i].rank, p.ranges[i].rank);
  }
}

TEST(CheckpointPlan, MissingOrRepeatedElementsAreRefused) {
  std::vector<Holding> gap = holdings(2);
  gap[3].end = 999;  // piece 0 of m ends early
  try {
    make_checkpoint_plan(files(), gap, 2);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor m: elements not held from 999"), std::string::npos)
        << e.what();
  }
  std::vector<Holding> twice = holdings(2);
  twice.push_back({.file = 1, .tensor = 0, .begin = 500, .end = 600, .ranks = {1}});
  try {
    make_checkpoint_plan(files(), twice, 2);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("held twice"), std::string::npos) << e.what();
  }
  std::vector<Holding> outside = holdings(2);
  outside[0].ranks = {0, 2};
  EXPECT_THROW(make_checkpoint_plan(files(), outside, 2), Error);
}

}  // namespace
}  // namespace octet::train
