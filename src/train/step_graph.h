// The training step as CUDA graphs (issue 11): the weight preparation with the gradients' zeroing,
// the forward + backward of each micro-batch and the optimizer update are each captured once and
// replayed, so a step costs the host a few graph launches instead of thousands of kernel launches.
//
// GraphedSection is one such piece. A key (shapes, tensors read, prepared-weight buffers) runs
// eagerly for one round, which makes what a capture cannot (cuBLASLt/cuDNN plans and workspaces,
// constant tensors, the rope tables); it is captured at the start of the next round (and the
// capture replayed at once), and replayed from then on. A round is what one step runs of the
// section: one run of the preparation or the optimizer, `grad_accum` runs of the micro-batch. A
// different key drops the graph and starts over. Capturing only where a round starts keeps each
// step on one side: its micro-batches all run eagerly or all replay the one graph. (Capturing at
// the second run held the first micro-batch's eager working set in the stream-ordered pool and
// the graph's own copy in graph memory in one step: grad_accum = 2 on the baseline model peaked at
// 20.4 GiB in its capture steps against 13.7 GiB eager.) Where a working set changes sides (after
// a capture, before and after eager work in a graphed run: a probe step's micro-batches, whose
// graph keeps its memory mapped, the shadow, the validation), the memory cached on the old side is
// given back (release_cached_device_memory, backend/cuda_graph.h). What always runs eagerly, and
// why:
//   - the first round of each key (above);
//   - everything on the CPU, and any section with graphs off (config key `cuda_graphs`);
//   - with several ranks (data parallel, ZeRO-1): the NCCL collectives and the sharded optimizer
//     are not captured; the trainer turns graphs off;
//   - delayed-scaling recipes (fp8-tensor-delayed): their amax-history slot is a host counter
//     passed to the kernels, which a replay would freeze; the trainer turns graphs off;
//   - steps that probe the sites' numerics (sites_every): the probe reads values to the host;
//   - the validation, the BF16 shadow and the spike rollback (they run between steps);
//   - a capture that fails (an op that waits for the device or allocates on first use): the error
//     is kept (failure()), the section stays eager for the rest of the run, and the trainer says so.
//     The failed capture ran the body's host code once already, so the body runs again eagerly:
//     a body must leave the host state it reads as it found it, or set it again first
//     (MicroBatchGraphs does: its backward clears Parameter::grad_fresh as it writes).
// The casts the ops count on the host (core/cast_counter.h) are recorded at capture and added again
// on every replay, so metrics.jsonl counts them the same with graphs on or off.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "backend/cuda_graph.h"
#include "core/cast_counter.h"
#include "model/model.h"

namespace octet::train {

// GraphedSection's choice for one run, as host logic alone (so that the CPU tests it): eager
// through a key's first round, the capture where the next round starts, replays after.
class CaptureSchedule {
 public:
  enum class Action : uint8_t { kEager, kCapture, kReplay };
  struct Choice {
    Action action = Action::kEager;
    bool drop = false;  // a graph is captured for another key: drop it (and its memory)
  };
  // `round_start`: this run opens a round (a step's first micro-batch; every run of a section that
  // runs once a step). `captured`: whether a graph of the current key exists.
  Choice next(const std::string& key, bool round_start, bool captured);
  void reset();

 private:
  std::string key_;
  int64_t rounds_ = 0;  // rounds begun with key_
};

class GraphedSection {
 public:
  explicit GraphedSection(std::string what) : what_(std::move(what)) {}

  enum class Ran : uint8_t { kEager, kCaptured, kReplayed };
  // See above. With graphs off (or unsupported by ctx) always kEager.
  Ran run(Context& ctx, bool graphs, const std::string& key, const std::function<void()>& body,
          bool round_start = true);
  void invalidate();

  int64_t replays() const { return graph_.replays(); }
  bool captured() const { return graph_.captured(); }
  const std::string& failure() const { return failure_; }
  // For the tests of the failure path: the next capture fails after its body ran, as one the
  // runtime refuses at its end does.
  void fail_next_capture() { fail_next_capture_ = true; }

 private:
  // An eager run after the graph ran: the graph's mapped working set is given back first.
  void release_if_mapped(Context& ctx);

  std::string what_;
  CaptureSchedule schedule_;
  CudaGraph graph_;
  bool mapped_ = false;      // the graph ran since the memory release numbered released_at_
  int64_t released_at_ = 0;  // device_memory_releases() when it last ran
  std::map<std::string, CastCounts> casts_;  // counted by the captured body
  std::string failure_;
  bool fail_next_capture_ = false;
};

// The forward + backward of one micro-batch, graphed: one graph for all the step's micro-batches,
// replayed once each (the gradients accumulate in the parameters' buffers, which the graph reads
// and writes where they are). The batch is uploaded from pinned memory without waiting
// (PinnedUploader) into this object's fixed device buffers (the next micro-batch's upload is
// ordered after the running one on the stream, so one pair serves all), and the outputs (losses,
// expert loads) are copied per micro-batch, since a replay overwrites them. The same path runs
// with graphs off, so eager and graphed steps compute the same.
class MicroBatchGraphs {
 public:
  explicit MicroBatchGraphs(Context& ctx) : uploader_(ctx, 8) {}

  // `weights_key` names the prepared weights the forward reads (it changes whenever they move);
  // `first_of_step`: this is the step's first micro-batch (a round of the section, see above).
  ModelLosses run(Context& ctx, bool graphs, Model& model, const ModelBatch& host_batch,
                  float grad_scale, const std::string& weights_key, bool first_of_step = true);
  void invalidate();
  int64_t replays() const { return section_.replays(); }
  const std::string& failure() const { return section_.failure(); }
  void fail_next_capture() { section_.fail_next_capture(); }  // GraphedSection's
  int64_t upload_waits() const { return uploader_.waits(); }

 private:
  PinnedUploader uploader_;
  Tensor ids_, targets_;  // on the device, (B, T)
  GraphedSection section_{"the forward + backward of a micro-batch"};
  ModelLosses captured_;  // the graph's outputs
};

}  // namespace octet::train
