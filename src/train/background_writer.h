// One job at a time on a background thread: the trainer's checkpoint writes, so that the step goes
// on while the files are written (the tensors are snapshotted to host memory first).
//
// submit() waits for the previous job, then starts the new one; wait() waits for the current one.
// A job's exception is rethrown by the next wait() or submit(), so a failed write is never lost. The
// destructor waits for the job (a failure then goes to stderr: a destructor cannot throw).
#pragma once

#include <exception>
#include <functional>
#include <thread>

namespace octet::train {

class BackgroundWriter {
 public:
  BackgroundWriter() = default;
  BackgroundWriter(const BackgroundWriter&) = delete;
  BackgroundWriter& operator=(const BackgroundWriter&) = delete;
  ~BackgroundWriter();

  void submit(std::function<void()> job);
  void wait();
  bool busy() const { return thread_.joinable(); }

 private:
  std::thread thread_;
  std::exception_ptr error_;
};

}  // namespace octet::train
