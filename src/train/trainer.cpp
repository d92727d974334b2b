// The training loop (trainer.h has the step and the checkpoint layout).
#include "train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <sstream>

#include "backend/backend.h"
#include "core/cast_counter.h"
#include "io/atomic_file.h"
#include "io/safetensors_dir.h"
#include "io/safetensors_parts.h"
#include "model/checkpoint.h"
#include "model/describe.h"
#include "model/init.h"
#include "model/model.h"
#include "train/checkpoint_plan.h"
#include "train/checkpoint_save.h"
#include "train/data.h"
#include "train/data_parallel.h"
#include "train/expert_parallel.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/run_state.h"
#include "train/step_graph.h"
#include "train/step_trace.h"
#include "train/train_step.h"
#include "train/trainer_state.h"
#include "train/zero_optimizer.h"

namespace octet::train {
namespace {

using namespace detail;  // NOLINT: the trainer's own internals (run_state.h, train_step.h)

Device pick_device(DeviceChoice d) {
  if (d == DeviceChoice::kCpu) return Device::kCpu;
  if (d == DeviceChoice::kCuda) {
    OCTET_CHECK(cuda_device_count() > 0, "device = \"cuda\" but ",
                cuda_built() ? "no CUDA GPU is visible" : "this build has no CUDA backend");
    return Device::kCuda;
  }
  return cuda_device_count() > 0 ? Device::kCuda : Device::kCpu;
}

}  // namespace

std::string resolve_resume_dir(const std::string& path) {
  std::error_code ec;
  OCTET_CHECK(fs::is_directory(path, ec), "--resume ", path, ": no such directory");
  if (fs::exists(fs::path(path) / kTrainerStateFile, ec)) return path;
  const fs::path latest = fs::path(path) / "checkpoints" / "latest";
  std::ifstream f(latest);
  OCTET_CHECK(f.good(), "--resume ", path, ": neither a training checkpoint (no ",
              kTrainerStateFile, ") nor a run directory with checkpoints/latest");
  std::string name;
  std::getline(f, name);
  const fs::path dir = fs::path(path) / "checkpoints" / name;
  OCTET_CHECK(fs::exists(dir / kTrainerStateFile, ec), "--resume ", path,
              ": checkpoints/latest names ", name, ", which is missing or incomplete");
  return dir.string();
}

ResumeTarget resolve_resume(const std::string& path) {
  ResumeTarget t;
  t.checkpoint = resolve_resume_dir(path);
  t.run_dir = run_dir_of_checkpoint(t.checkpoint);
  const fs::path saved = fs::path(t.run_dir) / "config.toml";
  std::error_code ec;
  OCTET_CHECK(!t.run_dir.empty() && fs::is_regular_file(saved, ec), "--resume ", path, ": ",
              t.checkpoint,
              " is not inside a run directory with a config.toml (RUN/checkpoints/step_N); a "
              "resume continues a run where it lives");
  std::ifstream f(saved);
  OCTET_CHECK(f.good(), saved.string(), ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  t.config = parse_train_config(text, saved.string());
  return t;
}

namespace {

int64_t checkpoint_step(const std::string& dir) {
  return read_trainer_state((fs::path(dir) / kTrainerStateFile).string()).step;
}

// The resume rules of RunOptions, checked before anything is written: the same run directory, no
// change to what a step computes unless asked for, steps left to run. Returns every change (to
// record in metrics.jsonl).
std::vector<ConfigChange> check_resume(const TrainConfig& cfg, const RunOptions& opt,
                                       const ResumeTarget& t) {
  std::error_code ec;
  OCTET_CHECK(fs::equivalent(cfg.run_dir, t.run_dir, ec), "--resume ", opt.resume_from,
              ": the run lives in ", t.run_dir, " and continues there, but run_dir is ",
              cfg.run_dir, "; leave run_dir as the run's config.toml has it");
  std::vector<ConfigChange> changes = config_changes(t.config, cfg);
  std::string refused;
  for (const ConfigChange& c : changes)
    if (!resume_may_change(c.key) && c.key != "run_dir")
      refused += (refused.empty() ? "" : ", ") + c.key + " (" + c.before + " -> " + c.after + ")";
  OCTET_CHECK(refused.empty() || opt.allow_config_change, "--resume ", opt.resume_from,
              ": this would change what the run computes: ", refused,
              "; a resume keeps the run's config.toml except steps, checkpointing, logging, "
              "evaluation, safety and device. "
              "Pass --allow-config-change to change it anyway (recorded in metrics.jsonl)");
  const int64_t done = checkpoint_step(t.checkpoint);
  OCTET_CHECK(done < cfg.steps, "--resume ", opt.resume_from, ": the run already finished (",
              t.checkpoint, " is at step ", done, " of steps = ", cfg.steps,
              "); to train longer, pass --set steps=N with N > ", done);
  return changes;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// Before the first large allocation: the run's estimated memory (describe.h's estimate) against
// what the device can still give.
void check_memory(const TrainConfig& cfg, Backend& be, Device device) {
  const MemoryEstimate m =
      estimate_memory(cfg.model, cfg.resolved_recipe(), cfg.batch_size * cfg.seq_len);
  const double need = m.weight_bytes + m.activation_bytes;
  const int64_t have = be.available_bytes();
  OCTET_CHECK(have < 0 || need <= static_cast<double>(have), "the run needs about ", gib(need),
              " of ", device == Device::kCpu ? "host" : "GPU",
              " memory (parameters, gradients and optimizer state ", gib(m.weight_bytes),
              ", activations of a micro-batch of ", cfg.batch_size, " x ", cfg.seq_len, " tokens ",
              gib(m.activation_bytes), ") but ", gib(static_cast<double>(have)),
              " is available; reduce batch_size or seq_len (and raise grad_accum), or the model");
}

void write_config(const TrainConfig& cfg, std::ostream& out) {
  const std::string resolved = to_toml(cfg);
  out << "# resolved configuration (saved as " << cfg.run_dir << "/config.toml)\n"
      << resolved << "\n";
  io::write_text_file_atomic(cfg.run_dir + "/config.toml", resolved);
}

// How the run ended, once the loop is left.
RunResult finish_result(const Run& run, const RunOptions& opt, RunResult result,
                        int64_t steps_run) {
  const TrainConfig& cfg = run.cfg;
  result.steps_done = run.step;
  result.last_checkpoint = run.last_checkpoint;
  if (result.end == RunEnd::kCompleted && run.step < cfg.steps && run.stop_seen) {
    result.end = RunEnd::kInterrupted;
    // A rank stopped by another rank's signal reports SIGTERM.
    result.stop_signal = opt.stop && opt.stop->load() ? opt.stop->load() : SIGTERM;
    result.end_reason = "stopped by signal " + std::to_string(result.stop_signal) + " at step " +
                        std::to_string(run.step) + " of " + std::to_string(cfg.steps);
  } else if (result.end == RunEnd::kCompleted && steps_run > 0 &&
             result.skipped_steps == steps_run) {
    result.end = RunEnd::kAllSkipped;
    result.end_reason = "every one of the " + std::to_string(steps_run) +
                        " steps was skipped; the weights never changed";
  } else if (result.end == RunEnd::kCompleted && steps_run > 0 &&
             !std::isfinite(result.final_loss)) {
    result.end = RunEnd::kDiverged;
    result.end_reason = "the last step's loss is not finite";
  }
  return result;
}

// The run's starting state: its weights (new, from init_from, or the checkpoint resumed from),
// its checkpoint directory, config.toml and the metrics file it appends to. Called under the run
// directory's lock.
std::unique_ptr<MetricsWriter> open_run(Run& run, const RunOptions& opt,
                                        const std::optional<ResumeTarget>& target,
                                        const std::vector<ConfigChange>& changes,
                                        DataStreams data) {
  const TrainConfig& cfg = run.cfg;
  std::ostream& out = run.out;
  std::unique_ptr<MetricsWriter> metrics;
  run.ckpt_root = cfg.run_dir + "/checkpoints";
  const bool writer = run.dp.writer();  // with several ranks, rank 0 alone writes the run
  if (!writer) {
  } else if (const int n = remove_stale_checkpoint_staging(run.ckpt_root))
    out << "removed " << n << " unfinished checkpoint write(s) of an earlier process in "
        << run.ckpt_root << "\n";
  run.build(std::move(data));
  if (!target && !cfg.init_from.empty()) {
    run.init_from_checkpoint(init_checkpoint_dir(cfg.init_from));
    std::string removed;
    if (writer) start_new_run(cfg.run_dir, opt.start, &removed);
    if (!removed.empty()) out << removed << "\n";
  } else if (!target) {
    // On the model's device; with expert parallelism each rank draws its own experts only.
    init_model(run.ctx, *run.model, static_cast<uint64_t>(cfg.seed));
    // Claimed only now, so that a run failing to start leaves no run behind to refuse the next.
    std::string removed;
    if (writer) start_new_run(cfg.run_dir, opt.start, &removed);
    if (!removed.empty()) out << removed << "\n";
  } else {
    // A failure here has written nothing.
    run.load_checkpoint(target->checkpoint, Run::Restore::kModelAndData);
    run.rollback_dir = target->checkpoint;
    if (writer) ensure_run_record(cfg.run_dir);
  }
  if (writer) {
    std::error_code ec;
    fs::create_directories(run.ckpt_root, ec);
    OCTET_CHECK(!ec, run.ckpt_root, ": cannot create the checkpoint directory: ", ec.message());
    write_config(cfg, out);
  }
  if (cfg.optim.warmup_steps > cfg.steps)
    out << "note: steps = " << cfg.steps
        << " is below optim.warmup_steps = " << cfg.optim.warmup_steps
        << ": the warm-up is shortened to all " << cfg.steps << " steps\n";
  if (!writer) {
    // metrics.jsonl is rank 0's
  } else if (!target) {
    metrics = std::make_unique<MetricsWriter>(MetricsWriter::fresh(cfg.run_dir));
  } else {
    metrics = std::make_unique<MetricsWriter>(MetricsWriter::resume(cfg.run_dir, run.step));
    out << "resumed from " << target->checkpoint << " at step " << run.step << "\n";
    for (const ConfigChange& c : changes)
      out << "config change on resume: " << c.key << " = " << c.before << " -> " << c.after << "\n";
  }
  if (cfg.cuda_graphs && run.ctx.device == Device::kCuda && !run.graphs)
    out << "note: cuda_graphs is on but the step runs eagerly: "
        << (run.dp.comm() ? "several ranks (the collectives are not captured)"
                          : "delayed scaling keeps host-side history slots")
        << "\n";
  if (run.dp.active())
    out << "data parallel: " << run.dp.size() << " ranks (" << run.dp.comm()->name()
        << "), ZeRO-1 optimizer state, global batch " << cfg.batch_size * run.dp.size() << " x "
        << cfg.grad_accum << " micro-batches\n";
  if (run.ep.experts)
    out << "expert parallel: " << cfg.parallel.ep << " ranks per expert group ("
        << cfg.model.n_routed_experts / cfg.parallel.ep << " experts each), data parallel "
        << run.dp.size() / cfg.parallel.ep << "\n";
  out << "device: " << device_name(run.ctx.device) << ", recipe: " << cfg.model.recipe.label()
      << ", parameters: " <<
      [&] {
        int64_t n = 0;
        for (Parameter* p : run.model->parameters()) n += p->value.numel();
        return n;
      }()
      << ", train tokens: " << run.sampler->stream().size() << "\n";
  return metrics;
}

}  // namespace

RunResult run_training(const TrainConfig& cfg, const RunOptions& opt, std::ostream& out) {
  // Everything that can be wrong is checked before anything is written.
  cfg.validate();
  std::optional<ResumeTarget> target;
  std::vector<ConfigChange> changes;
  if (!opt.resume_from.empty()) {
    target = resolve_resume(opt.resume_from);
    changes = check_resume(cfg, opt, *target);
  }
  DataSourceArgs da;
  da.path = cfg.data.shards.empty() ? cfg.data.text : cfg.data.shards;
  da.megatron = cfg.data.megatron;
  da.cache_dir = opt.cache_dir;
  da.val_fraction = cfg.data.val_fraction;
  // A new run into a directory holding one is refused before any work (and again under the lock).
  if (!target && opt.start == RunStart::kRefuseExisting && holds_run(cfg.run_dir))
    start_new_run(cfg.run_dir, opt.start);
  const Device device = pick_device(cfg.device);
  StepTrace::validate(opt.trace_path, opt.trace_first, opt.trace_last, device,
                      target ? checkpoint_step(target->checkpoint) : 0, cfg.steps);
  Run run(cfg, out, device, opt);
  // Several ranks: rank 0 prepares the data (a cache shared by all) before the others read it.
  if (!run.dp.writer()) run.dp.barrier(run.ctx);
  const ShardSet shards = resolve_data_source(da);
  DataStreams data = open_data_streams(shards, cfg.model.vocab_size);
  if (run.dp.writer()) run.dp.barrier(run.ctx);
  check_memory(cfg, run.ctx.be(), device);

  // The run directory: locked, then claimed (a new run) or found as it was (a resume). With
  // several ranks, rank 0 alone writes there.
  RunDirLock lock;
  if (run.dp.writer()) lock = lock_run_dir(cfg.run_dir);
  if (!run.dp.writer()) {
    // nothing to claim: rank 0 does it
  } else if (target) {
    OCTET_CHECK(holds_run(cfg.run_dir), "--resume ", opt.resume_from, ": ", cfg.run_dir,
                " no longer holds the run");
    // Re-checked under the lock: another process may have moved the run on since.
    check_resume(cfg, opt, *target);
  } else if (opt.start == RunStart::kRefuseExisting && holds_run(cfg.run_dir)) {
    start_new_run(cfg.run_dir, opt.start);  // throws naming the run
  }
  std::unique_ptr<MetricsWriter> metrics = open_run(run, opt, target, changes, std::move(data));

  ProgressOptions po;
  po.total_steps = cfg.steps;
  po.start_step = run.step;
  po.log_every = cfg.log_every;
  Records rec{.progress = Progress(out, opt.style, po), .metrics = std::move(metrics)};
  rec.result.final_val_loss = std::numeric_limits<double>::quiet_NaN();
  rec.pending_changes.reserve(changes.size());
  for (const ConfigChange& c : changes)
    rec.pending_changes.push_back(c.key + ": " + c.before + " -> " + c.after);
  const LrSchedule sched = cfg.lr_schedule();
  SafetyNets nets;
  const bool saves = cfg.checkpoint_every >= 0;  // -1: a benchmark that writes nothing
  // Step N is completed (read, recorded) after step N + 1 was launched (train_step.h), unless it
  // checkpoints, evaluates or ends the run.
  std::optional<LaunchedStep> pending;
  auto last_end = std::chrono::steady_clock::now();
  StepTrace trace(opt.trace_path, opt.trace_first, opt.trace_last, run.dp.writer());
  while (true) {
    const bool stop = run.agree_stop(opt);
    const int64_t number = run.step + (pending ? 2 : 1);
    std::optional<LaunchedStep> next;
    if (!stop && number <= cfg.steps) {
      trace.before_launch(run.ctx, number);
      next = launch_step(run, number, lr_at(sched, number - 1));
    }
    if (pending) {
      const StepEnd end = complete_step(run, nets, rec, *pending, last_end);
      trace.after_complete(pending->sm.step, rec.progress);
      pending.reset();
      if (end == StepEnd::kRolledBack) {
        if (next) undo_launch(run, *next);
        continue;
      }
      if (end == StepEnd::kDiverged) break;
      if (stop && saves) run.save_checkpoint();
    }
    if (!next) break;
    pending = std::move(next);
    if (!pending->complete_now) continue;
    const StepEnd end = complete_step(run, nets, rec, *pending, last_end);
    trace.after_complete(pending->sm.step, rec.progress);
    pending.reset();
    if (end == StepEnd::kRolledBack) continue;
    if (end == StepEnd::kDiverged) break;
    if (saves && ((cfg.checkpoint_every > 0 && run.step % cfg.checkpoint_every == 0) ||
                  run.step == cfg.steps || run.agree_stop(opt)))
      run.save_checkpoint();
  }
  // Stopped before this process ran a step (a signal during start-up): a new run writes the state
  // it starts from, so that --resume continues it like any stopped run (a resumed run has the
  // checkpoint it started from).
  if (run.stop_seen && rec.steps_run == 0 && !target && run.step < cfg.steps &&
      cfg.checkpoint_every >= 0)
    run.save_checkpoint();
  run.finish_checkpoint();  // the last checkpoint is on disk when the run returns
  if (run.graphs)
    out << "cuda graphs: "
        << run.micro->replays() + run.pre_graph.replays() + run.optim->graph_replays()
        << " replays (forward + backward " << run.micro->replays() << ", preparation "
        << run.pre_graph.replays() << ", optimizer " << run.optim->graph_replays() << ")\n";
  rec.progress.finish();
  return finish_result(run, opt, std::move(rec.result), rec.steps_run);
}

}  // namespace octet::train
