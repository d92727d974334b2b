// Who writes what of a checkpoint: the plan that lets every rank write its own part of the same
// files in parallel (train/checkpoint_save.h writes it).
//
// A checkpoint is a set of safetensors files whose layouts (io/safetensors_parts.h) every rank
// computes alike. What a rank can write is what it holds: a Holding says that elements [begin,
// end) of one tensor are on these ranks (each holds them whole). make_checkpoint_plan deals the
// holdings to writers:
//   - held by one rank (a ZeRO-1 shard of the AdamW moments): that rank writes it;
//   - held by several (a replicated weight): a run of consecutive holdings with the same ranks is
//     cut into equal byte shares, one contiguous share per rank, at element boundaries.
// Every element of every tensor is written exactly once (checked), and each file's header by one
// rank. The plan depends on the holdings and the world size only, so every rank computes the same
// one without communicating.
//
// training_checkpoint() describes the trainer's checkpoint (trainer.h): the model files exactly as
// write_checkpoint lays them out (F32, kAsIs, shards of at most shard_bytes with transformers'
// rule, model.safetensors.index.json when several) and optimizer.safetensors exactly as
// AdamWOptimizer::state_dict's tensors are written. Its holdings today:
//   weights   every rank where the masters are whole (weight_holders); with ZeRO-1's sharded
//             masters (ZeroAdamW::master_released), each piece's owner, from its master shard;
//   moments   ZeRO-1: each piece's owner (ZeroLayout); one process: rank 0;
//   step      rank 0 (a host value).
// Expert parallelism (train/expert_parallel.h, EP = P): a routed expert's weights are held by its
// data group only (the W / P ranks with its EP rank: weight_holders), its moments by their ZeRO-1
// owners in that group (world rank d P + e for data rank d and EP rank e), the replicated moments
// as with data parallelism; nothing is gathered, and the files stay the same at every grid.
//
// Resume at any world size and grid (load_training_checkpoint): each rank reads only what it holds
// (io::read_safetensors_ranges): its experts' weights, not the other ranks' (model_resume_ranges),
// and its ZeRO-1 pieces' rows of the moments (zero_resume_ranges, ep_resume_ranges).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors_parts.h"
#include "model/checkpoint.h"
#include "model/model.h"

namespace octet::train {

class ZeroAdamW;
class EpAdamW;
class AdamWOptimizer;

struct PlanFile {
  std::string name;  // inside the checkpoint directory
  std::vector<io::TensorDecl> tensors;
  std::map<std::string, std::string> metadata;
};

struct Holding {
  size_t file = 0, tensor = 0;  // into PlanFile list and its tensors
  int64_t begin = 0, end = 0;   // elements
  std::vector<int> ranks;       // who holds them, ascending
  // Where this rank holds element `begin` (contiguous to `end`): device memory of the context, or
  // host memory when on_host. Null on a rank not in `ranks`.
  const void* data = nullptr;
  bool on_host = false;
};

struct WriteRange {
  size_t file = 0, tensor = 0;
  int64_t begin = 0, end = 0;
  int rank = 0;
  const void* data = nullptr;  // the writing rank's source (see Holding)
  bool on_host = false;
};

struct CheckpointPlan {
  int world = 1;
  std::vector<PlanFile> files;
  std::vector<io::SafetensorsLayout> layouts;  // per file
  std::vector<int> header_writer;              // per file
  std::vector<WriteRange> ranges;              // every element of every tensor once

  int64_t bytes_of(int rank) const;  // data bytes rank writes
};

// Deals the holdings (above). Throws when they miss or repeat an element, or name a rank outside
// [0, world).
CheckpointPlan make_checkpoint_plan(std::vector<PlanFile> files,
                                    const std::vector<Holding>& holdings, int world);

// The ranks that hold checkpoint weight `spec` whole: every rank, but a routed expert with
// ep > 1 (of `experts` routed experts): the data group of its EP rank, {e, e + ep, ...}.
std::vector<int> weight_holders(const TensorSpec& spec, int world, int ep = 1, int64_t experts = 0);

struct TrainingCheckpoint {
  std::vector<PlanFile> files;
  std::vector<Holding> holdings;
  std::string index_json;   // model.safetensors.index.json's text; empty for a single shard
  ModelConfig config_json;  // what config.json holds (write_model_config)
};

struct TrainingSources {
  Model* model = nullptr;
  ZeroAdamW* zero = nullptr;                 // ZeRO-1 (any world size), or
  EpAdamW* ep = nullptr;                     // expert parallelism (sharded experts), or
  AdamWOptimizer* optim = nullptr;           // one process
  const int64_t* optimizer_steps = nullptr;  // host value, read at the snapshot
  int rank = 0, world = 1;
  int64_t shard_bytes = 5'000'000'000;  // write_checkpoint's default
};
TrainingCheckpoint training_checkpoint(const TrainingSources& s);

// The element ranges of optimizer.safetensors this rank's ZeRO-1 pieces need on resume (at any
// world size): what io::read_safetensors_ranges reads.
io::ElementRanges zero_resume_ranges(const ZeroAdamW& zero, int rank);
// The same for expert parallelism (world rank `rank`): the replicated pieces' rows and this
// rank's experts' pieces' rows of the whole (E, ...) moments.
io::ElementRanges ep_resume_ranges(const EpAdamW& ep, int rank);
// The model files' ranges this rank reads: nothing of another expert-parallel rank's experts
// (empty lists), every other tensor whole (not named).
io::ElementRanges model_resume_ranges(Model& model);

// Loads checkpoint `dir` (any world size and grid) into s.model and s's optimizer, each rank
// reading only the elements it holds (above). Not collective. Returns the checkpoint's warnings.
std::vector<std::string> load_training_checkpoint(Context& ctx, const std::string& dir,
                                                  const TrainingSources& s);

}  // namespace octet::train
