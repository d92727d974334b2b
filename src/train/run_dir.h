// Run directories: what one training run owns on disk, and the rules that keep a run from damaging
// another run, or itself.
//
// A run directory holds exactly one run:
//   run.json          {"run_id", "created"}: which run this is; written when the run starts
//   config.toml       the resolved configuration (trainer.h)
//   metrics.jsonl     one record per step (metrics.h)
//   checkpoints/      step_N/ and `latest` (trainer.h)
//   .lock             flock()ed by the process training in the directory, for as long as it runs
// A directory that has any of the first four holds a run (one written before run.json existed is
// recognised by the others). Files the trainer did not write are never touched.
//
// The rules (enforced by the trainer, run_training):
//   - A new run into a directory that holds a run is refused, naming the run, unless the caller
//     asks to continue it (resume) or to replace it (RunStart::kOverwrite: the old run's files,
//     and only those, are removed first).
//   - One process per directory: the lock is taken before anything is written, and a second
//     process fails at once, naming the holder's pid.
//   - Staging directories of checkpoint writes that a dead process left behind (step_N.partial,
//     step_N.partial.tmp.XXXXXX) are removed when the lock is taken: the lock proves their writer
//     is gone.
#pragma once

#include <string>

namespace octet::train {

inline constexpr const char* kRunRecordFile = "run.json";

// Holds the directory's lock until destroyed.
class RunDirLock {
 public:
  RunDirLock() = default;
  explicit RunDirLock(int fd) : fd_(fd) {}
  RunDirLock(RunDirLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  RunDirLock& operator=(RunDirLock&& o) noexcept;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  ~RunDirLock();
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Creates `dir` if needed and locks it (flock, exclusive, non-blocking). Throws naming the
// directory and the pid of the process holding it, or why it cannot be created.
RunDirLock lock_run_dir(const std::string& dir);

// Whether `dir` holds a run (see the top of this file).
bool holds_run(const std::string& dir);

// The run id recorded in dir/run.json; "" when there is none (a run from before run.json).
std::string run_id_of(const std::string& dir);

enum class RunStart : uint8_t {
  kRefuseExisting,  // a directory that holds a run is an error
  kOverwrite,       // the run there is removed first, whole
};

// Starts a new run in the locked `dir`: refuses or removes an existing run as `how` says, then
// writes run.json with a fresh run id, which it returns. `removed` (optional) gets a line naming
// what was removed.
std::string start_new_run(const std::string& dir, RunStart how, std::string* removed = nullptr);

// Writes run.json for a run from before run.json existed (a resume of it); returns the run id.
std::string ensure_run_record(const std::string& dir);

// Removes the staging directories of checkpoint writes left in `checkpoints_dir` by dead
// processes. Call with the run directory locked. Returns how many were removed.
int remove_stale_checkpoint_staging(const std::string& checkpoints_dir);

// The run directory that holds checkpoint directory `ckpt` (<run>/checkpoints/step_N), or "" when
// `ckpt` is not inside one.
std::string run_dir_of_checkpoint(const std::string& ckpt);

// `base` when it holds no run, else the first of base-2, base-3, ... that holds none.
std::string first_free_run_dir(const std::string& base);

}  // namespace octet::train
