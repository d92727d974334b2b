#include "train/checkpoint_plan.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "io/safetensors_dir.h"
#include "train/expert_parallel.h"
#include "train/optimizer.h"
#include "train/zero_optimizer.h"

namespace octet::train {
namespace {

const char* const kOptimizerFile = "optimizer.safetensors";

bool is_routed_expert(const TensorSpec& s) {
  return s.role == ParamRole::kExpertsGateUp || s.role == ParamRole::kExpertsDown;
}

// The moments' holdings of one ZeRO-1 optimizer: piece c of parameter c.param is elements
// [base + c.offset, ...) of file tensor first[c.param] (+1 for exp_avg_sq), written by world rank
// world_rank(c.rank); the data is this rank's shards where that is `rank`.
void add_moment_holdings(std::vector<Holding>& out, size_t file, const ZeroAdamW& zero,
                         const std::vector<size_t>& first, int64_t base_experts,
                         const std::function<int(int)>& world_rank, int rank) {
  for (const ZeroLayout::Piece& c : zero.layout().pieces) {
    const Parameter& p = *zero.params()[static_cast<size_t>(c.param)];
    const int64_t base = base_experts == 0 ? 0 : base_experts * (p.value.numel() / p.value.size(0));
    for (int which = 0; which < 2; ++which) {
      Holding h;
      h.file = file;
      h.tensor = first[static_cast<size_t>(c.param)] + static_cast<size_t>(which);
      h.begin = base + c.offset;
      h.end = base + c.offset + c.numel;
      h.ranks = {world_rank(c.rank)};
      if (h.ranks[0] == rank)
        h.data = static_cast<const uint16_t*>(
                     (which == 0 ? zero.exp_avg_shard() : zero.exp_avg_sq_shard()).data()) +
                 c.shard_offset;
      out.push_back(std::move(h));
    }
  }
}

// Each parameter's index in `params` -> its exp_avg's index in the optimizer file (by name).
std::vector<size_t> firsts(const std::vector<Parameter*>& params,
                           const std::map<std::string, size_t>& first_by_name) {
  std::vector<size_t> out;
  out.reserve(params.size());
  for (const Parameter* p : params) out.push_back(first_by_name.at(p->name));
  return out;
}

int64_t elem_bytes(const CheckpointPlan& p, size_t file, size_t tensor) {
  return dtype_size(p.files[file].tensors[tensor].dtype);
}

// Adds [begin, end) of holding h, written by `rank`.
void add_range(CheckpointPlan& p, const Holding& h, int64_t begin, int64_t end, int rank) {
  if (begin >= end) return;
  const int64_t es = elem_bytes(p, h.file, h.tensor);
  const void* data =
      h.data == nullptr ? nullptr : static_cast<const uint8_t*>(h.data) + (begin - h.begin) * es;
  if (!p.ranges.empty()) {  // continues the last range of the same writer: one range
    WriteRange& last = p.ranges.back();
    const void* last_end = last.data == nullptr ? nullptr
                                                : static_cast<const uint8_t*>(last.data) +
                                                      (last.end - last.begin) * es;
    if (last.file == h.file && last.tensor == h.tensor && last.rank == rank && last.end == begin &&
        last.on_host == h.on_host && last_end == data) {
      last.end = end;
      return;
    }
  }
  WriteRange r;
  r.file = h.file;
  r.tensor = h.tensor;
  r.begin = begin;
  r.end = end;
  r.rank = rank;
  r.on_host = h.on_host;
  r.data = data;
  p.ranges.push_back(r);
}

// A run of holdings with the same ranks, cut into ranks.size() equal byte shares.
void deal_run(CheckpointPlan& p, const std::vector<const Holding*>& run, int rotate) {
  const std::vector<int>& ranks = run.front()->ranks;
  const auto k = static_cast<int64_t>(ranks.size());
  int64_t total = 0;
  for (const Holding* h : run) total += (h->end - h->begin) * elem_bytes(p, h->file, h->tensor);
  int64_t at = 0;  // bytes of the run before the current holding
  for (const Holding* h : run) {
    const int64_t es = elem_bytes(p, h->file, h->tensor);
    int64_t e = h->begin;
    while (e < h->end) {
      const int64_t pos = at + (e - h->begin) * es;  // byte position of element e in the run
      const int64_t share = std::min<int64_t>(k - 1, pos * k / std::max<int64_t>(total, 1));
      // The share ends at byte (share + 1) * total / k: the elements starting before it.
      const int64_t share_end = (share + 1) * total / k;
      int64_t stop = h->begin + (share_end - at + es - 1) / es;
      stop = std::clamp<int64_t>(stop, e + 1, h->end);
      add_range(p, *h, e, stop, ranks[static_cast<size_t>((share + rotate) % k)]);
      e = stop;
    }
    at += (h->end - h->begin) * es;
  }
}

// A tensor of `numel` elements at element `offset` of parameter `param` (ZeroAdamW's order) whose
// master is sharded: each piece's part of it is held by the piece's owner (world rank
// world_rank(c.rank)), in its master shard (read where that owner is this rank).
void add_shard_holdings(TrainingCheckpoint& out, const ZeroAdamW& zero, size_t param,
                        int64_t offset, int64_t numel, size_t file, size_t tensor,
                        const std::function<int(int)>& world_rank, int rank) {
  for (const ZeroLayout::Piece& c : zero.layout().pieces) {
    if (c.param != static_cast<int>(param)) continue;
    const int64_t lo = std::max(offset, c.offset);
    const int64_t hi = std::min(offset + numel, c.offset + c.numel);
    if (lo >= hi) continue;
    Holding h;
    h.file = file;
    h.tensor = tensor;
    h.begin = lo - offset;
    h.end = hi - offset;
    h.ranks = {world_rank(c.rank)};
    if (h.ranks[0] == rank)
      h.data = zero.master_shard().data_as<const float>() + c.shard_offset + (lo - c.offset);
    out.holdings.push_back(std::move(h));
  }
}

// A parameter whose master is sharded: its optimizer, its index there, and for a routed expert
// with expert parallelism, that the pieces are of this rank's (E / P, ...) slice.
struct Released {
  const ZeroAdamW* zero = nullptr;
  size_t index = 0;
  bool expert = false;
};

}  // namespace

int64_t CheckpointPlan::bytes_of(int rank) const {
  int64_t n = 0;
  for (const WriteRange& r : ranges)
    if (r.rank == rank) n += (r.end - r.begin) * dtype_size(files[r.file].tensors[r.tensor].dtype);
  return n;
}

CheckpointPlan make_checkpoint_plan(std::vector<PlanFile> files,
                                    const std::vector<Holding>& holdings, int world) {
  OCTET_CHECK(world >= 1, "checkpoint plan: world size must be >= 1, got ", world);
  CheckpointPlan p;
  p.world = world;
  p.files = std::move(files);
  for (size_t f = 0; f < p.files.size(); ++f) {
    p.layouts.push_back(
        io::safetensors_layout(p.files[f].tensors, p.files[f].metadata, p.files[f].name));
    p.header_writer.push_back(static_cast<int>(f % static_cast<size_t>(world)));
  }
  // Coverage: every element of every tensor exactly once.
  std::map<std::pair<size_t, size_t>, std::vector<std::pair<int64_t, int64_t>>> seen;
  for (const Holding& h : holdings) {
    OCTET_CHECK(h.file < p.files.size() && h.tensor < p.files[h.file].tensors.size(),
                "checkpoint plan: a holding names no tensor (file ", h.file, ", tensor ", h.tensor,
                ")");
    const io::TensorDecl& t = p.files[h.file].tensors[h.tensor];
    OCTET_CHECK(h.begin >= 0 && h.begin <= h.end && h.end <= shape_numel(t.shape),
                "checkpoint plan: ", t.name, ": elements [", h.begin, ", ", h.end, ") outside its ",
                shape_numel(t.shape));
    OCTET_CHECK(!h.ranks.empty(), "checkpoint plan: ", t.name, ": held by no rank");
    for (int r : h.ranks)
      OCTET_CHECK(r >= 0 && r < world, "checkpoint plan: ", t.name, ": rank ", r,
                  " outside the world of ", world);
    seen[{h.file, h.tensor}].emplace_back(h.begin, h.end);
  }
  for (size_t f = 0; f < p.files.size(); ++f)
    for (size_t i = 0; i < p.files[f].tensors.size(); ++i) {
      auto& v = seen[{f, i}];
      std::sort(v.begin(), v.end());
      int64_t at = 0;
      for (const auto& [b, e] : v) {
        OCTET_CHECK(b == at, "checkpoint plan: ", p.files[f].name, ": tensor ",
                    p.files[f].tensors[i].name, ": elements ", b < at ? "held twice" : "not held",
                    " from ", std::min(b, at));
        at = e;
      }
      OCTET_CHECK(at == shape_numel(p.files[f].tensors[i].shape),
                  "checkpoint plan: ", p.files[f].name, ": tensor ", p.files[f].tensors[i].name,
                  ": elements not held from ", at);
    }
  // Deal: one holder writes its own; runs of the same several holders are shared out.
  std::vector<const Holding*> run;
  int rotate = 0;
  auto flush = [&] {
    if (run.empty()) return;
    deal_run(p, run, rotate++);
    run.clear();
  };
  for (const Holding& h : holdings) {
    if (h.ranks.size() == 1) {
      flush();
      add_range(p, h, h.begin, h.end, h.ranks[0]);
      continue;
    }
    if (!run.empty() && run.front()->ranks != h.ranks) flush();
    run.push_back(&h);
  }
  flush();
  return p;
}

std::vector<int> weight_holders(const TensorSpec& spec, int world, int ep, int64_t experts) {
  std::vector<int> out;
  if (ep > 1 && is_routed_expert(spec)) {
    const int64_t per_expert = shape_numel(spec.fused_shape) / spec.fused_shape.at(0);
    const int64_t expert = spec.fused_offset / per_expert;
    const auto e = static_cast<int>(expert / (experts / ep));  // its EP rank
    for (int r = e; r < world; r += ep) out.push_back(r);
    return out;
  }
  for (int r = 0; r < world; ++r) out.push_back(r);
  return out;
}

TrainingCheckpoint training_checkpoint(const TrainingSources& s) {
  OCTET_CHECK(s.model && (s.zero || s.ep || s.optim) && s.optimizer_steps,
              "training checkpoint: model, optimizer and step count are required");
  TrainingCheckpoint out;
  Model& model = *s.model;
  const ModelConfig& config = model.config();
  const std::vector<TensorSpec> specs = expected_tensors(config);
  const int ep = s.ep ? s.ep->ep_size() : 1;
  // The model shards: F32 masters in expected_tensors order, transformers' sharding rule (a new
  // shard when the next tensor would overflow a non-empty one), as write_checkpoint does.
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t bytes = shape_numel(specs[i].shape) * 4;
    if (!shards.back().empty() && in_shard + bytes > s.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
  }
  std::map<std::string, const TensorSpec*> by_name;
  for (const TensorSpec& t : specs) by_name[t.name] = &t;
  // ZeRO-1 with sharded masters: the parameters whose masters live in their owners' shards.
  std::map<const Parameter*, Released> released;
  auto add_released = [&](const ZeroAdamW& z, bool expert) {
    for (size_t i = 0; i < z.params().size(); ++i)
      if (z.master_released(i)) released[z.params()[i]] = {&z, i, expert};
  };
  if (s.zero) add_released(*s.zero, false);
  if (s.ep) {
    add_released(s.ep->replicated(), false);
    add_released(s.ep->experts(), true);
  }
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t total = 0;
  for (size_t f = 0; f < shards.size(); ++f) {
    PlanFile pf;
    pf.name = shards.size() == 1 ? io::kSingleShardName : io::shard_file_name(f, shards.size());
    pf.metadata = {{"format", "pt"}};
    for (size_t i : shards[f]) {
      const TensorSpec& t = specs[i];
      pf.tensors.push_back({t.name, DType::kF32, t.shape});
      weight_map[t.name] = pf.name;
      total += shape_numel(t.shape) * 4;
      // Where the model holds it: the shared tensor for an MTP copy, the fused parameter's rows.
      const TensorSpec& src = t.copy_of.empty() ? t : *by_name.at(t.copy_of);
      const Parameter& p = model.parameter(src.fused_name.empty() ? src.name : src.fused_name);
      if (const auto it = released.find(&p); it != released.end()) {
        const Released& r = it->second;
        int64_t offset = src.fused_offset;
        std::function<int(int)> world_rank = [](int c) { return c; };
        if (r.expert) {
          // Expert g of the whole (E, ...) tensor is on EP rank g / (E / P), at g's place in that
          // rank's slice, whose pieces (the same layout on every EP rank) are owned by data ranks:
          // world rank d P + e.
          const int64_t per = p.value.numel() / p.value.size(0);
          const auto er = static_cast<int>(src.fused_offset / per / s.ep->expert_count());
          offset -= static_cast<int64_t>(er) * s.ep->expert_count() * per;
          world_rank = [er, ep](int d) { return d * ep + er; };
        }
        add_shard_holdings(out, *r.zero, r.index, offset, shape_numel(t.shape), out.files.size(),
                           pf.tensors.size() - 1, world_rank, s.rank);
        continue;
      }
      Holding h;
      h.file = out.files.size();
      h.tensor = pf.tensors.size() - 1;
      h.end = shape_numel(t.shape);
      h.ranks = weight_holders(t, s.world, ep, config.n_routed_experts);
      if (std::find(h.ranks.begin(), h.ranks.end(), s.rank) != h.ranks.end()) {
        h.data = model.held_elements(src.name);
        OCTET_CHECK(h.data != nullptr, "training checkpoint: rank ", s.rank, " should hold ",
                    t.name, " but its model does not");
      }
      out.holdings.push_back(std::move(h));
    }
    out.files.push_back(std::move(pf));
  }
  if (shards.size() > 1)
    out.index_json =
        nlohmann::json({{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}})
            .dump(2) +
        "\n";
  // config.json as write_checkpoint writes it for F32 tensors stored as given.
  out.config_json = config;
  out.config_json.extra.erase("quantization_config");
  out.config_json.extra[out.config_json.extra.contains("dtype") ? "dtype" : "torch_dtype"] =
      "float32";

  // optimizer.safetensors: AdamWOptimizer::state_dict's tensors.
  PlanFile opt;
  opt.name = kOptimizerFile;
  // In model order (AdamWOptimizer's; ZeRO-1's and EP's trainable parameters are that order),
  // each moment whole: a sharded expert parameter's (E / P, ...) is (E, ...) in the file.
  const std::vector<Parameter*> params = s.zero ? s.zero->params()
                                         : s.ep ? model.parameters()
                                                : s.optim->params();
  std::map<std::string, size_t> first;  // parameter -> its exp_avg's index in opt
  const size_t file = out.files.size();
  std::set<const Parameter*> sharded;
  if (s.ep)
    for (const Parameter* p : s.ep->experts().params()) sharded.insert(p);
  for (const Parameter* p : params) {
    if (!p->trainable) continue;
    first[p->name] = opt.tensors.size();
    Shape shape = p->value.shape();
    if (sharded.count(p)) shape[0] *= ep;
    opt.tensors.push_back({p->name + ".exp_avg", DType::kBF16, shape});
    opt.tensors.push_back({p->name + ".exp_avg_sq", DType::kBF16, shape});
  }
  opt.tensors.push_back({AdamWOptimizer::kStepTensorName, DType::kI64, {1}});
  if (s.zero) {
    add_moment_holdings(
        out.holdings, file, *s.zero, firsts(s.zero->params(), first), 0, [](int r) { return r; },
        s.rank);
  } else if (s.ep) {
    const EpAdamW& e = *s.ep;
    add_moment_holdings(
        out.holdings, file, e.replicated(), firsts(e.replicated().params(), first), 0,
        [](int r) { return r; }, s.rank);
    // Every EP rank's experts, from this rank's layout: the expert optimizers of all EP ranks
    // have the same shapes over data groups of the same size, so the same pieces.
    const std::vector<size_t> ef = firsts(e.experts().params(), first);
    for (int er = 0; er < ep; ++er)
      add_moment_holdings(
          out.holdings, file, e.experts(), ef, er * e.expert_count(),
          [er, ep](int d) { return d * ep + er; }, er == e.ep_rank() ? s.rank : -1);
  } else {
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i]->trainable) continue;
      for (int which = 0; which < 2; ++which) {
        Holding h;
        h.file = file;
        h.tensor = first.at(params[i]->name) + static_cast<size_t>(which);
        h.end = params[i]->value.numel();
        h.ranks = {0};
        if (s.rank == 0)
          h.data = (which == 0 ? s.optim->exp_avg(i) : s.optim->exp_avg_sq(i)).data();
        out.holdings.push_back(std::move(h));
      }
    }
  }
  Holding step;
  step.file = file;
  step.tensor = opt.tensors.size() - 1;
  step.end = 1;
  step.ranks = {0};
  step.on_host = true;
  if (s.rank == 0) step.data = s.optimizer_steps;
  out.holdings.push_back(std::move(step));
  out.files.push_back(std::move(opt));
  return out;
}

io::ElementRanges zero_resume_ranges(const ZeroAdamW& zero, int rank) {
  io::ElementRanges out;
  for (const ZeroLayout::Piece& c : zero.layout().pieces) {
    if (c.rank != rank) continue;
    const std::string& name = zero.params()[static_cast<size_t>(c.param)]->name;
    out[name + ".exp_avg"].emplace_back(c.offset, c.offset + c.numel);
    out[name + ".exp_avg_sq"].emplace_back(c.offset, c.offset + c.numel);
  }
  // A parameter with no piece here is still read (an empty range list reads nothing of it).
  for (const Parameter* p : zero.params()) {
    out[p->name + ".exp_avg"];
    out[p->name + ".exp_avg_sq"];
  }
  return out;
}

io::ElementRanges ep_resume_ranges(const EpAdamW& ep, int rank) {
  io::ElementRanges out = zero_resume_ranges(ep.replicated(), rank);
  const ZeroAdamW& experts = ep.experts();
  const int data_rank = rank / ep.ep_size();
  for (const Parameter* p : experts.params()) {  // named even when this rank owns no piece
    out[p->name + ".exp_avg"];
    out[p->name + ".exp_avg_sq"];
  }
  for (const ZeroLayout::Piece& c : experts.layout().pieces) {
    if (c.rank != data_rank) continue;
    const Parameter& p = *experts.params()[static_cast<size_t>(c.param)];
    const int64_t base = ep.first_expert() * (p.value.numel() / p.value.size(0));
    for (const char* m : {".exp_avg", ".exp_avg_sq"})
      out[p.name + m].emplace_back(base + c.offset, base + c.offset + c.numel);
  }
  return out;
}

io::ElementRanges model_resume_ranges(Model& model) {
  io::ElementRanges out;
  for (const TensorSpec& t : expected_tensors(model.config()))
    if (t.copy_of.empty() && model.held_elements(t.name) == nullptr) out[t.name];  // none
  return out;
}

std::vector<std::string> load_training_checkpoint(Context& ctx, const std::string& dir,
                                                  const TrainingSources& s) {
  OCTET_CHECK(s.model && (s.zero || s.ep || s.optim),
              "training checkpoint: a model and an optimizer to load into are required");
  const io::ElementRanges model_ranges = model_resume_ranges(*s.model);
  CheckpointReadOptions ro;
  ro.cast = ReadCast::kToF32;
  ro.ranges = &model_ranges;
  const LoadedCheckpoint ck = read_checkpoint(dir, ro);
  std::vector<std::string> warnings = load_checkpoint_into(ctx, *s.model, ck);
  const std::string optim_file = dir + "/" + kOptimizerFile;
  if (s.ep)
    s.ep->load_state_dict(
        ctx, io::read_safetensors_ranges(optim_file, ep_resume_ranges(*s.ep, s.rank)).tensors);
  else if (s.zero)
    s.zero->load_state_dict(
        ctx, io::read_safetensors_ranges(optim_file, zero_resume_ranges(*s.zero, s.rank)).tensors);
  else
    s.optim->load_state_dict(ctx, io::read_safetensors(optim_file).tensors);
  return warnings;
}

}  // namespace octet::train
