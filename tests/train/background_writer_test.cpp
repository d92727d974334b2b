// The trainer's background checkpoint writer: jobs run one at a time in order, and a job's failure
// reaches the caller at the next wait() or submit() instead of being lost.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "train/background_writer.h"

namespace octet::train {
namespace {

TEST(BackgroundWriter, RunsJobsInOrderOneAtATime) {
  BackgroundWriter w;
  std::vector<int> order;
  std::atomic<int> running{0};
  for (int i = 0; i < 5; ++i)
    w.submit([&, i] {
      EXPECT_EQ(running.fetch_add(1), 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      order.push_back(i);
      running.fetch_sub(1);
    });
  w.wait();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_FALSE(w.busy());
}

TEST(BackgroundWriter, AFailedJobIsReportedOnce) {
  BackgroundWriter w;
  w.submit([] { throw std::runtime_error("disk full"); });
  try {
    w.wait();
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "disk full");
  }
  EXPECT_NO_THROW(w.wait());
  w.submit([] { throw std::runtime_error("again"); });
  EXPECT_THROW(w.submit([] {}), std::runtime_error);  // the next submit reports it
  EXPECT_NO_THROW(w.wait());
}

}  // namespace
}  // namespace octet::train
