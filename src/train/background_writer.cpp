#include "train/background_writer.h"

#include <cstdio>

namespace octet::train {

BackgroundWriter::~BackgroundWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "octet: a background checkpoint write failed: %s\n", e.what());
  }
}

void BackgroundWriter::submit(std::function<void()> job) {
  wait();
  thread_ = std::thread([this, job = std::move(job)] {
    try {
      job();
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void BackgroundWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace octet::train
