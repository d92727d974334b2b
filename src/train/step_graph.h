// The training step as CUDA graphs (issue 11): the weight preparation with the gradients' zeroing,
// the forward + backward of each micro-batch and the optimizer update are each captured once and
// replayed, so a step costs the host a few graph launches instead of thousands of kernel launches.
//
// GraphedSection is one such piece: `body` runs eagerly the first time a key is seen (that first
// run makes what a capture cannot: cuBLASLt/cuDNN plans and workspaces, constant tensors, the rope
// tables), is captured the second time (and the capture replayed at once), and replayed from then
// on. A different key (other shapes, other tensors read, new prepared-weight buffers) drops the
// graph and starts over. What always runs eagerly, and why:
//   - the first run of each key (above);
//   - everything on the CPU, and any section with graphs off (config key `cuda_graphs`);
//   - with several ranks (data parallel, ZeRO-1): the NCCL collectives and the sharded optimizer
//     are not captured; the trainer turns graphs off;
//   - delayed-scaling recipes (fp8-tensor-delayed): their amax-history slot is a host counter
//     passed to the kernels, which a replay would freeze; the trainer turns graphs off;
//   - steps that probe the sites' numerics (sites_every): the probe reads values to the host;
//   - the validation, the BF16 shadow and the spike rollback (they run between steps);
//   - a capture that fails (an op that waits for the device or allocates on first use): the error
//     is kept (failure()), the section stays eager for the rest of the run, and the trainer says so.
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

class GraphedSection {
 public:
  explicit GraphedSection(std::string what) : what_(std::move(what)) {}

  enum class Ran : uint8_t { kEager, kCaptured, kReplayed };
  // See above. With graphs off (or unsupported by ctx) always kEager.
  Ran run(Context& ctx, bool graphs, const std::string& key, const std::function<void()>& body);
  void invalidate();

  int64_t replays() const { return graph_.replays(); }
  bool captured() const { return graph_.captured(); }
  const std::string& failure() const { return failure_; }

 private:
  std::string what_;
  std::string key_;
  int64_t seen_ = 0;  // runs with key_
  CudaGraph graph_;
  std::map<std::string, CastCounts> casts_;  // counted by the captured body
  std::string failure_;
};

// The forward + backward of one micro-batch, graphed. The batch is uploaded from pinned memory
// without waiting (PinnedUploader) into this object's fixed device buffers (the next micro-batch's
// upload is ordered after the running one on the stream, so one pair serves all), and the outputs (losses, expert loads) are copied per micro-batch, since a replay
// overwrites them. The same path runs with graphs off, so eager and graphed steps compute the same.
class MicroBatchGraphs {
 public:
  explicit MicroBatchGraphs(Context& ctx) : uploader_(ctx, 8) {}

  // `weights_key` names the prepared weights the forward reads (it changes whenever they move).
  ModelLosses run(Context& ctx, bool graphs, Model& model, const ModelBatch& host_batch,
                  float grad_scale, const std::string& weights_key);
  void invalidate();
  int64_t replays() const { return section_.replays(); }
  const std::string& failure() const { return section_.failure(); }
  int64_t upload_waits() const { return uploader_.waits(); }

 private:
  PinnedUploader uploader_;
  Tensor ids_, targets_;  // on the device, (B, T)
  GraphedSection section_{"the forward + backward of a micro-batch"};
  ModelLosses captured_;  // the graph's outputs
};

}  // namespace octet::train
