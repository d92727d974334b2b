// Sharded asynchronous checkpoint writes: every rank writes its own part of a checkpoint plan
// (train/checkpoint_plan.h) into the same files, in parallel, from a host snapshot, while the
// training step goes on.
//
// save(), collective (every rank calls it at the same step):
//   1. finish(): the previous save is waited for on every rank (its failure is thrown here);
//   2. rank 0 makes a fresh staging directory <root>/<name>.partial; a barrier;
//   3. the snapshot: this rank's ranges are copied into one host buffer, page-locked on CUDA and
//      allocated once (reused by every later save of the same size), by copies enqueued on the
//      context's stream behind the step's work, then a fence (a CUDA event) is recorded. Nothing
//      waits for the device: the step continues at once;
//   4. a background thread waits for the fence and writes the ranges at their offsets of the
//      plan's files (pwrite; each file's header by one rank), fsyncs them and reports with a
//      marker file in the staging directory: .rank-<r>.ok, or .rank-<r>.failed holding the error;
//   5. rank 0's thread then waits for every rank's marker (up to `timeout`): when all are ok it
//      writes its own small files (config.json, the index, trainer_state.json, ...), removes the
//      markers and renames the staging directory to <root>/<name> (the checkpoint appears whole or
//      not at all; an existing one of that name is replaced), then runs after_commit (`latest`,
//      pruning). A failed rank leaves the staging directory unrenamed.
// finish(), collective: waits for this rank's thread, then every rank learns whether any rank
// failed (a small all-gather) and, if one did, every rank throws the same error naming the first
// failing rank and its message (read from its marker). A crash or kill at any point leaves the
// earlier checkpoints as they were and at most a .partial directory, which readers ignore and
// the next start removes (run_dir.h).
//
// The ranks must see one file system (as they already do for the data cache and the resume).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/comm.h"
#include "io/pinned_host.h"
#include "train/background_writer.h"
#include "train/checkpoint_plan.h"

namespace octet::train {

struct SaveRequest {
  std::string root;  // the checkpoints directory
  std::string name;  // the checkpoint's directory name in it (step_N)
  CheckpointPlan plan;
  // Rank 0's files, written into the staging directory once every rank has written its part:
  // name -> writer given the path.
  std::vector<std::pair<std::string, std::function<void(const std::string& path)>>> rank0_files;
  std::function<void()> after_commit;  // rank 0, after the rename
};

class CheckpointSaver {
 public:
  CheckpointSaver() = default;
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;
  // Stops a rank-0 wait for its peers (the checkpoint is then not committed), waits for the
  // thread, and reports a failure not yet thrown on stderr.
  ~CheckpointSaver();

  // See above. `comm` null: one process.
  void save(Context& ctx, Comm* comm, SaveRequest request);
  // See above; a no-op when no save is in flight.
  void finish(Context& ctx, Comm* comm);

  bool in_flight() const { return state_ != nullptr; }
  int64_t snapshot_capacity() const { return buffer_.capacity(); }
  bool snapshot_pinned() const { return buffer_.pinned(); }

  // Test hook: called on this rank before it writes each of its files (the name in the
  // checkpoint); an exception from it fails this rank's write like an I/O error.
  std::function<void(const std::string& file)> before_write;
  std::chrono::milliseconds timeout = default_comm_timeout();  // rank 0's wait for the markers

  struct State;

 private:
  BackgroundWriter writer_;
  io::PinnedBuffer buffer_;
  std::shared_ptr<State> state_;  // the save in flight
};

}  // namespace octet::train
