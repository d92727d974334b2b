// GraphedSection and MicroBatchGraphs (step_graph.h).
#include "train/step_graph.h"

#include <algorithm>
#include <sstream>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace octet::train {
namespace {

CopyKind same_device(const Context& ctx) {
  return ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kDeviceToDevice;
}

// A copy of a device tensor the next replay will not overwrite.
Tensor keep(Context& ctx, const Tensor& t) {
  if (!t.defined() || t.data() == nullptr) return t;
  Tensor out = Tensor::empty(ctx, t.shape(), t.dtype());
  ctx.be().copy(out.data(), t.data(), t.nbytes(), same_device(ctx));
  return out;
}

std::vector<Tensor> keep(Context& ctx, const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  out.reserve(ts.size());
  for (const Tensor& t : ts) out.push_back(keep(ctx, t));
  return out;
}

}  // namespace

CaptureSchedule::Choice CaptureSchedule::next(const std::string& key, bool round_start,
                                              bool captured) {
  Choice c;
  if (key != key_) {
    c.drop = captured;
    captured = false;
    key_ = key;
    rounds_ = 0;
  }
  if (round_start) ++rounds_;
  if (captured)
    c.action = Action::kReplay;
  else if (round_start && rounds_ >= 2)  // the key ran a whole round eagerly before this one
    c.action = Action::kCapture;
  return c;
}

void CaptureSchedule::reset() {
  key_.clear();
  rounds_ = 0;
}

void GraphedSection::release_if_mapped(Context& ctx) {
  if (mapped_ && device_memory_releases(ctx) == released_at_) release_cached_device_memory(ctx);
  mapped_ = false;
}

GraphedSection::Ran GraphedSection::run(Context& ctx, bool graphs, const std::string& key,
                                        const std::function<void()>& body, bool round_start) {
  if (!graphs || !failure_.empty() || !cuda_graphs_supported(ctx)) {
    release_if_mapped(ctx);  // e.g. a probe step's eager micro-batches
    body();
    return Ran::kEager;
  }
  const CaptureSchedule::Choice choice = schedule_.next(key, round_start, graph_.captured());
  if (choice.drop) graph_.reset();
  if (choice.action == CaptureSchedule::Action::kReplay) {
    graph_.replay(ctx);
    mapped_ = true;
    released_at_ = device_memory_releases(ctx);
    if (ctx.casts)
      for (const auto& [scope, c] : casts_)
        for (int k = 0; k < kCastKindCount; ++k)
          ctx.casts->by_scope[scope].n[static_cast<size_t>(k)] += c.n[static_cast<size_t>(k)];
    return Ran::kReplayed;
  }
  if (choice.action == CaptureSchedule::Action::kEager) {
    release_if_mapped(ctx);  // a dropped graph's working set, before the eager one is made
    body();
    return Ran::kEager;
  }
  std::map<std::string, CastCounts> before;
  if (ctx.casts) before = ctx.casts->by_scope;
  try {
    const bool fail = std::exchange(fail_next_capture_, false);
    graph_.capture(ctx, what_.c_str(), [&] {
      body();
      if (fail) OCTET_THROW("made to fail (GraphedSection::fail_next_capture)");
    });
  } catch (const Error& e) {
    failure_ = e.what();
    graph_.reset();
    if (ctx.casts) ctx.casts->by_scope = before;
    body();                   // this step runs eagerly, and so does every later one
    clear_cuda_last_error();  // the failed capture's addresses, freed by body's assignments
    return Ran::kEager;
  }
  casts_.clear();
  if (ctx.casts) {
    for (auto& [scope, c] : ctx.casts->by_scope) {
      CastCounts d = c;
      const auto it = before.find(scope);
      for (int k = 0; k < kCastKindCount && it != before.end(); ++k)
        d.n[static_cast<size_t>(k)] -= it->second.n[static_cast<size_t>(k)];
      casts_[scope] = d;
    }
  }
  // The eager round's blocks cached in the stream-ordered pool (and what the capture's end freed of
  // the memory made before it), and what other graphs keep mapped, go back before this graph maps
  // its own working set on its first replay.
  release_cached_device_memory(ctx);
  graph_.replay(ctx);  // the capture ran nothing: this is the step's work
  mapped_ = true;
  released_at_ = device_memory_releases(ctx);
  return Ran::kCaptured;
}

void GraphedSection::invalidate() {
  graph_.reset();
  schedule_.reset();
}

ModelLosses MicroBatchGraphs::run(Context& ctx, bool graphs, Model& model,
                                  const ModelBatch& host_batch, float grad_scale,
                                  const std::string& weights_key, bool first_of_step) {
  const Tensor& in = host_batch.inputs;
  if (!ids_.defined() || ids_.shape() != in.shape()) {
    section_.invalidate();
    captured_ = ModelLosses{};
    ids_ = Tensor::empty(ctx, in.shape(), DType::kI32);
    targets_ = Tensor::empty(ctx, in.shape(), DType::kI32);
  }
  const int64_t vocab = model.config().vocab_size;
  const auto* tok = in.data_as<const int32_t>();
  for (int64_t i = 0; i < in.numel(); ++i)
    OCTET_CHECK(tok[i] >= 0 && tok[i] < vocab, "model batch: token ", tok[i], " at ", i,
                " is outside the vocabulary [0, ", vocab, ")");
  uploader_.upload(ctx, ids_, in);
  uploader_.upload(ctx, targets_, host_batch.targets);
  // The gradients a first writer overwrites (Parameter::grad_fresh): a capture bakes = or +=.
  // The backward clears grad_fresh as it writes each first writer's gradient; a failed capture
  // has run it once already, so the body sets the flags as they were before it runs.
  const std::vector<Parameter*> params = model.parameters();
  std::vector<char> was_fresh(params.size());
  for (size_t i = 0; i < params.size(); ++i) was_fresh[i] = params[i]->grad_fresh;
  std::ostringstream key;
  key << shape_str(in.shape()) << " scale " << grad_scale << " weights " << weights_key << " model "
      << static_cast<const void*>(&model) << " fresh "
      << std::count(was_fresh.begin(), was_fresh.end(), 1);
  ModelLosses out;
  const GraphedSection::Ran ran = section_.run(
      ctx, graphs, key.str(),
      [&] {
        for (size_t i = 0; i < params.size(); ++i) params[i]->grad_fresh = was_fresh[i] != 0;
        out = model.step(ctx, {ids_, targets_}, Pass::kForwardBackward, grad_scale);
      },
      first_of_step);
  // A replay wrote the gradients as its capture did; after any pass none is fresh any more.
  for (Parameter* p : params) p->grad_fresh = false;
  if (ran == GraphedSection::Ran::kEager) return out;
  if (ran == GraphedSection::Ran::kCaptured) captured_ = std::move(out);
  ModelLosses l;
  l.main = keep(ctx, captured_.main);
  l.mtp = keep(ctx, captured_.mtp);
  l.aux = keep(ctx, captured_.aux);
  l.expert_load = keep(ctx, captured_.expert_load);
  return l;
}

void MicroBatchGraphs::invalidate() {
  section_.invalidate();
  captured_ = ModelLosses{};
}

}  // namespace octet::train
