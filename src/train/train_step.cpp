// One training step, launched without a host synchronisation and completed a step late
// (train_step.h).
#include "train/train_step.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/cast_counter.h"

namespace octet::train::detail {
namespace {

using Clock = std::chrono::steady_clock;

CopyKind on_device(const Context& ctx) {
  return ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kDeviceToDevice;
}

// A (1) device scalar <- a host value (the ZeRO-1 / expert-parallel optimizers' statistics).
template <typename T>
void upload_scalar(Context& ctx, Tensor& dst, T value) {
  Tensor h = Tensor::empty({1}, dst.dtype());
  std::memcpy(h.data(), &value, sizeof(T));
  ctx.be().copy(dst.data(), h.data(), sizeof(T),
                ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kHostToDevice);
}

// The micro-batches' passes (gradients accumulate), with the weights prepared first; the
// step's casts and, on probe steps, the sites' numerics into sm. Reads no loss.
std::vector<ModelLosses> passes(Run& run, StepMetrics& sm, bool probe_step, TokenBatch& first) {
  const TrainConfig& cfg = run.cfg;
  // The gradient of the global batch's mean loss: every rank's micro-batches scaled alike.
  const float micro_scale = 1.0f / static_cast<float>(cfg.grad_accum * run.dp.size());
  run.prepare_weights();  // and the gradients zeroed
  SiteProbe probe;
  if (probe_step) run.model->set_probe(&probe);
  // The casts of the step's passes, counted in the ops (host-side counts, no synchronisation).
  if (!run.ctx.casts) run.ctx.casts = std::make_shared<CastCounter>();
  run.ctx.casts->reset();
  std::vector<ModelLosses> micro;
  for (int64_t m = 0; m < cfg.grad_accum; ++m) {
    const TokenBatch b = run.sampler->next();
    if (m == 0) first = b;
    // The batch goes up from pinned memory without a wait; graphed unless probing (the probe reads
    // values to the host). ZeRO-1: the last micro-batch's backward sends the gradient buckets.
    if (run.zero && m == cfg.grad_accum - 1) run.zero->begin_final_backward();
    micro.push_back(run.micro->run(run.ctx, run.graphs && !probe_step, *run.model,
                                   {b.inputs, b.targets}, micro_scale,
                                   std::to_string(run.weights_generation), m == 0));
  }
  // A graphed run's probe step ran its micro-batches eagerly (the section gave the graph's mapped
  // working set back first): their blocks cached in the pool go back before the next replay maps
  // the graph's again.
  if (probe_step && run.graphs) release_cached_device_memory(run.ctx);
  std::vector<const std::string*> failures = {&run.micro->failure(), &run.pre_graph.failure()};
  if (run.optim) failures.push_back(&run.optim->graph_failure());
  for (const std::string* f : failures)
    if (!f->empty() && !run.graph_failure_noted) {
      run.out << "note: cuda_graphs: " << *f << "; that part of the step runs eagerly\n";
      run.graph_failure_noted = true;
    }
  run.model->set_probe(nullptr);
  if (const auto n = static_cast<double>(micro[0].expert_load.size() * micro.size()); n > 0) {
    const CastCounts c = run.ctx.casts->at("moe.routed");
    for (int k = 0; k < kCastKindCount; ++k)
      sm.moe_casts[cast_kind_name(static_cast<CastKind>(k))] =
          static_cast<double>(c.n[static_cast<size_t>(k)]) / n;
  }
  for (const auto& [name, n] : probe.sites())
    sm.sites[name] = {n.amax, n.saturated_share(), n.flushed_share()};
  return micro;
}

// The step's verdict on the device: the micro-batches' losses gathered (over the ranks too, on
// the device) and judged against the spike window.
void enqueue_verdict(Run& run, const std::vector<ModelLosses>& micro) {
  Run::Verdict& v = run.verdict;
  const auto k = static_cast<int64_t>(micro.size());
  const int64_t depths = v.means.numel() - 1;
  OCTET_CHECK(static_cast<int64_t>(micro[0].mtp.size()) == depths, "trainer: the model has ",
              micro[0].mtp.size(), " MTP losses, the step's buffers ", depths);
  for (int64_t m = 0; m < k; ++m) {
    const ModelLosses& l = micro[static_cast<size_t>(m)];
    run.ctx.be().copy(v.main.data_as<float>() + m, l.main.data(), 4, on_device(run.ctx));
    for (int64_t d = 0; d < depths; ++d)
      run.ctx.be().copy(v.mtp.data_as<float>() + d * k + m, l.mtp[static_cast<size_t>(d)].data(), 4,
                        on_device(run.ctx));
  }
  Tensor main = v.main, mtp = v.mtp;
  if (run.dp.active()) {  // rank r's K losses at r * K (per depth for MTP)
    const int64_t r = run.dp.size();
    run.dp.comm()->all_gather(run.ctx, v.main.data(), v.all_main.data(), k, DType::kF32);
    for (int64_t d = 0; d < depths; ++d)
      run.dp.comm()->all_gather(run.ctx, v.mtp.data_as<float>() + d * k,
                                v.all_mtp.data_as<float>() + d * r * k, k, DType::kF32);
    main = v.all_main;
    mtp = v.all_mtp;
  }
  step_loss_verdict(run.ctx, {.main = main,
                              .mtp = mtp,
                              .ranks = run.dp.size(),
                              .depths = depths,
                              .window = v.window,
                              .spike_threshold = run.cfg.safety.spike_threshold,
                              .spike_skips = run.cfg.safety.spike_action != SpikeAction::kLog,
                              .means = v.means,
                              .flags = v.flags,
                              .skip = v.skip});
}

// The optimizer update, skipped on the device when the verdict or the gradients say so; then
// the router bias and the spike window, both only when the update was applied. Returns the
// device flag of a skipped update. ZeRO-1 / expert parallelism: decided on the host (they read
// their statistics at once).
Tensor enqueue_update(Run& run, const std::vector<ModelLosses>& micro, int slot, double lr,
                      Tensor& grad_norm) {
  Run::Verdict& v = run.verdict;
  Tensor skipped;
  if (run.optim) {
    const StepResult r = run.optim->step(run.ctx, static_cast<float>(lr), {v.skip});
    skipped = r.skipped;
    grad_norm = r.grad_norm;
  } else {
    run.readback->read(run.ctx, slot, {v.flags});
    int32_t flags = 0;
    std::memcpy(&flags, run.readback->wait(slot), 4);
    StepStats st{.grad_norm = 0.0f, .clip_coef = 1.0f, .skipped = true, .step = 0};
    if (!(flags & kVerdictSkip))
      st = run.ep_opt ? run.ep_opt->step(run.ctx, static_cast<float>(lr))
                      : run.zero->step(run.ctx, static_cast<float>(lr));
    upload_scalar<int32_t>(run.ctx, v.opt_skipped, st.skipped ? 1 : 0);
    upload_scalar<float>(run.ctx, v.grad_norm, st.grad_norm);
    skipped = v.opt_skipped;
    grad_norm = v.grad_norm;
  }
  const std::vector<Tensor>& loads = micro[0].expert_load;
  if (!loads.empty()) {
    ModelLosses summed;  // the step's loads, zero when skipped (the bias stays)
    for (size_t m = 0; m < loads.size(); ++m) {
      if (v.counts.size() <= m)
        v.counts.push_back(Tensor::empty(run.ctx, loads[m].shape(), DType::kI32));
      std::vector<Tensor> per_micro;
      per_micro.reserve(micro.size());
      for (const ModelLosses& l : micro) per_micro.push_back(l.expert_load[m]);
      sum_counts_unless_skipped(run.ctx,
                                {.counts = per_micro, .skipped = skipped, .out = v.counts[m]});
      summed.expert_load.push_back(v.counts[m]);
    }
    run.model->update_router_bias(run.ctx, {summed},
                                  static_cast<float>(run.model_config().bias_update_rate));
  }
  step_remember_loss(run.ctx, {.window = v.window, .means = v.means, .skipped = skipped});
  return skipped;
}

// The read that happens only on its steps: the BF16 shadow; and the memory figures.
void measure_at_launch(Run& run, const std::vector<ModelLosses>& micro, const TokenBatch& first,
                       StepMetrics& sm) {
  const TrainConfig& cfg = run.cfg;
  if (cfg.safety.shadow_bf16 > 0 && sm.step % cfg.safety.shadow_bf16 == 0 &&
      cfg.resolved_recipe().any_fp8()) {
    // Several ranks: the mean over every rank's first micro-batch.
    const double fp8_first =
        run.dp.mean_over_ranks(run.ctx, run.model->read_losses(run.ctx, micro[0]).main);
    const double bf = run.dp.mean_over_ranks(run.ctx, run.shadow_loss(first));
    sm.shadow_bf16_loss = bf;
    sm.shadow_gap = (fp8_first - bf) / bf;
  }
  sm.peak_mem_bytes = run.ctx.be().peak_bytes();
  if (run.zero || run.ep_opt) {  // the same on every rank (every shard is padded to the largest)
    sm.master_bytes = run.opt_master_bytes();
    sm.moment_bytes = run.opt_moment_bytes();
  }
}

// Counts the step as done, runs the validation when due, and writes the step's record.
void record_step(Run& run, Records& rec, StepMetrics& sm) {
  const TrainConfig& cfg = run.cfg;
  run.step += 1;
  run.tokens_seen += run.tokens_per_step();
  if (run.val && (run.step % cfg.eval.every == 0 || run.step == cfg.steps)) {
    sm.val_loss = run.validate_loss();
    rec.result.final_val_loss = *sm.val_loss;
  }
  sm.config_changes = std::move(rec.pending_changes);
  rec.pending_changes.clear();
  if (rec.metrics) rec.metrics->write(sm);  // rank 0's
  rec.progress.update(sm);
  ++rec.steps_run;
  if (sm.skipped) ++rec.result.skipped_steps;
  rec.result.final_loss = sm.loss;
}

// After the step is recorded: too many skipped updates in a row end the run as diverged.
bool diverged(const TrainConfig& cfg, SafetyNets& nets, Records& rec, const StepMetrics& sm) {
  nets.skipped_in_a_row = sm.skipped ? nets.skipped_in_a_row + 1 : 0;
  if (cfg.safety.max_skipped_in_a_row <= 0 ||
      nets.skipped_in_a_row < cfg.safety.max_skipped_in_a_row)
    return false;
  rec.result.end = RunEnd::kDiverged;
  rec.result.end_reason =
      std::to_string(nets.skipped_in_a_row) + " updates in a row were skipped (the " +
      "last for: " + sm.skip_reason +
      "; safety.max_skipped_in_a_row = " + std::to_string(cfg.safety.max_skipped_in_a_row) + ")";
  return true;
}

}  // namespace

LaunchedStep launch_step(Run& run, int64_t number, double lr) {
  const TrainConfig& cfg = run.cfg;
  LaunchedStep L;
  L.start = Clock::now();
  L.slot = static_cast<int>(number % 2);
  L.sampler_before = run.sampler->state();
  const int64_t waits_before = run.ctx.be().host_waits();
  const int64_t releases_before = device_memory_releases(run.ctx);
  run.ctx.be().reset_peak();
  StepMetrics& sm = L.sm;
  sm.step = number;
  sm.lr = lr;
  // Every sites_every steps (and the first) also record every site's quantization numerics.
  const bool probe_step = cfg.sites_every > 0 && (number % cfg.sites_every == 0 || number == 1);
  TokenBatch first;
  std::vector<ModelLosses> micro = passes(run, sm, probe_step, first);
  enqueue_verdict(run, micro);
  run.dp.sum_expert_loads(run.ctx, micro);
  Tensor grad_norm;
  const Tensor skipped = enqueue_update(run, micro, L.slot, lr, grad_norm);
  Run::Verdict& v = run.verdict;
  std::vector<Tensor> results = {v.means,   v.flags,         skipped,
                                 grad_norm, v.window.values, v.window.state};
  // Logging steps: the first micro-batch's expert loads too (summed over the ranks), for the
  // router imbalance.
  if (!micro[0].expert_load.empty() && (number % cfg.log_every == 0 || number == 1))
    for (const Tensor& c : micro[0].expert_load) {
      results.push_back(c);
      L.expert_loads.push_back(c.numel());
    }
  run.readback->read(run.ctx, L.slot, results);
  measure_at_launch(run, micro, first, sm);
  const bool saves = cfg.checkpoint_every >= 0;
  L.complete_now = !run.optim || number == cfg.steps ||
                   (saves && cfg.checkpoint_every > 0 && number % cfg.checkpoint_every == 0) ||
                   (run.val && number % cfg.eval.every == 0);
  const bool reads = probe_step || sm.shadow_bf16_loss;
  // Not steady either: a step that captured a graph (the capture gives the eager round's memory
  // back, a host wait) or ran eager work beside the graphs (both release memory).
  L.steady = run.graphs && number >= 4 && !reads && !L.complete_now &&
             device_memory_releases(run.ctx) == releases_before;
  L.host_waits = run.ctx.be().host_waits() - waits_before;
  L.launched = Clock::now();
  return L;
}

StepEnd complete_step(Run& run, SafetyNets& nets, Records& rec, LaunchedStep& L,
                      Clock::time_point& last_end) {
  const TrainConfig& cfg = run.cfg;
  const uint8_t* b = run.readback->wait(L.slot);
  const int64_t depths = run.verdict.means.numel() - 1;
  const int64_t cap = cfg.safety.spike_window;
  std::vector<double> means(static_cast<size_t>(1 + depths));
  std::memcpy(means.data(), b, means.size() * 8);
  b += means.size() * 8;
  int32_t flags = 0, opt_skipped = 0;
  float grad_norm = 0;
  std::memcpy(&flags, b, 4);
  std::memcpy(&opt_skipped, b + 4, 4);
  std::memcpy(&grad_norm, b + 8, 4);
  const uint8_t* window_values = b + 12;
  const uint8_t* window_state = window_values + cap * 8;
  run.window_from_bytes(window_values, window_state);  // the host's copy, for checkpoints
  if (!L.expert_loads.empty()) {
    const uint8_t* at = window_state + 16;
    double worst = 1.0;
    for (const int64_t n : L.expert_loads) {
      Tensor counts = Tensor::empty({n}, DType::kI32);
      std::memcpy(counts.data(), at, static_cast<size_t>(n) * 4);
      at += n * 4;
      worst = std::max(worst, max_over_mean(counts));
    }
    L.sm.router_imbalance = worst;
  }

  StepMetrics& sm = L.sm;
  sm.loss = means[0];
  sm.mtp_loss.assign(means.begin() + 1, means.end());
  // The verdict made on the device, reported as the synchronous loop did: a non-finite loss skips
  // the update; a loss spike (safety.spike_*) keeps it, skips it or rolls the weights back to the
  // last checkpoint (at most 3 times in a row; then it skips), replacing the records of the steps
  // it undoes.
  bool apply = true;
  if (flags & kVerdictNonFinite) {
    sm.skip_reason = "non-finite loss";
    apply = false;
  } else if (flags & kVerdictSpike) {
    std::ostringstream msg;
    msg << "step " << sm.step << ": loss spike " << sm.loss << " (window of " << cap << ")";
    if (cfg.safety.spike_action == SpikeAction::kSkip) {
      apply = false;
      sm.skip_reason = "loss spike";
    } else if (cfg.safety.spike_action == SpikeAction::kRollback) {
      if (!run.rollback_dir.empty() && nets.rollbacks_in_a_row < 3) {
        const std::string dir = run.rollback_dir;
        // The window as it was after this step (the next one may have added to it), then the
        // weights; the sampler moves on past the offending batches (undo_launch).
        run.upload_window();
        run.load_checkpoint(dir, Run::Restore::kModelOnly);
        // The steps after the checkpoint are run again: their records are replaced.
        if (rec.metrics)
          rec.metrics =
              std::make_unique<MetricsWriter>(MetricsWriter::resume(cfg.run_dir, run.step));
        ++nets.rollbacks_in_a_row;
        rec.progress.message(msg.str() + ": rolled back to " + dir);
        return StepEnd::kRolledBack;
      }
      apply = false;
      sm.skip_reason = "loss spike (no checkpoint to roll back to)";
    }
    rec.progress.message(msg.str() + (apply ? ", kept" : ", update skipped"));
  }
  if (apply) {  // the optimizer ran: its norm, and whether the gradients skipped it
    sm.grad_norm = grad_norm;
    if (opt_skipped != 0) {
      sm.skip_reason = "non-finite gradient";
      apply = false;
    } else {
      nets.rollbacks_in_a_row = 0;
    }
  }
  sm.skipped = !apply;
  if (sm.skipped)
    rec.progress.message("step " + std::to_string(sm.step) + ": " + sm.skip_reason +
                         ", update skipped");
  const Clock::time_point now = Clock::now();
  // The step's time: since the previous step completed (or since it was launched, after a gap),
  // and at least its own launch. A backend that runs the step inside the launch (the CPU) ran it
  // before the previous step completed, so the interval alone would be ~0 for a step completed
  // right after the previous one (the last one, evaluation and checkpoint steps).
  const double ms =
      std::max(std::chrono::duration<double, std::milli>(now - std::max(last_end, L.start)).count(),
               std::chrono::duration<double, std::milli>(L.launched - L.start).count());
  last_end = now;
  sm.step_ms = ms;
  sm.tokens_per_s = static_cast<double>(run.tokens_per_step()) / (ms / 1000.0);
  if (L.steady) {
    ++rec.result.steady_steps;
    rec.result.steady_host_waits += L.host_waits;
  }
  record_step(run, rec, sm);
  return diverged(cfg, nets, rec, sm) ? StepEnd::kDiverged : StepEnd::kRecorded;
}

void undo_launch(Run& run, const LaunchedStep& launched) {
  run.sampler->set_state(launched.sampler_before);
}

}  // namespace octet::train::detail
