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
#include "train/step_graph.h"
#include "train/trainer_state.h"
#include "train/zero_optimizer.h"

namespace octet::train {
namespace {

namespace fs = std::filesystem;

const char* const kRecipeStateFile = "recipe_state.safetensors";
const char* const kTrainerStateFile = "trainer_state.json";

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

Device pick_device(DeviceChoice d) {
  if (d == DeviceChoice::kCpu) return Device::kCpu;
  if (d == DeviceChoice::kCuda) {
    OCTET_CHECK(cuda_device_count() > 0, "device = \"cuda\" but ",
                cuda_built() ? "no CUDA GPU is visible" : "this build has no CUDA backend");
    return Device::kCuda;
  }
  return cuda_device_count() > 0 ? Device::kCuda : Device::kCpu;
}

double max_over_mean(const Tensor& counts_host) {
  const auto* c = counts_host.data_as<const int32_t>();
  double sum = 0, mx = 0;
  for (int64_t e = 0; e < counts_host.numel(); ++e) {
    sum += c[e];
    mx = std::max<double>(mx, c[e]);
  }
  return sum > 0 ? mx / (sum / static_cast<double>(counts_host.numel())) : 1.0;
}

// Everything one run holds.
struct Run {
  const TrainConfig& cfg;
  std::ostream& out;
  Context ctx;
  std::unique_ptr<Model> model;
  std::unique_ptr<Model> shadow;          // bf16 copy for --shadow-bf16, made on first use
  std::unique_ptr<AdamWOptimizer> optim;  // one process
  DataParallel dp;                        // several ranks: rank 0 writes; ZeRO-1 below
  std::unique_ptr<ZeroAdamW> zero;
  EpGroups ep;  // parallel.ep > 1: the expert and data groups (expert_parallel.h)
  std::unique_ptr<EpAdamW> ep_opt;  // then the optimizer instead of `zero`
  std::unique_ptr<BatchSampler> sampler;
  std::unique_ptr<ValBatches> val;
  std::deque<double> spike_window;
  int64_t step = 0;  // optimizer steps done
  int64_t tokens_seen = 0;
  std::string ckpt_root;
  std::string last_checkpoint;  // written by this process
  // optim.fused_prepare: whether the prepared weights the optimizer writes are current (false at
  // the start and after loading weights: the next step prepares everything and hands the
  // optimizer the new outputs).
  bool outputs_attached = false;
  // CUDA graphs (train/step_graph.h): whether this run uses them, the graphed pieces, and a count
  // that moves whenever the prepared weights get new buffers (an eager preparation), so that the
  // forward graphs that read the old ones are captured again.
  bool graphs = false;
  GraphedSection pre_graph{"the weight preparation and the gradients' zeroing"};
  std::unique_ptr<MicroBatchGraphs> micro;
  int64_t weights_generation = 0;
  bool graph_failure_noted = false;
  // What a spike rolls back to: the checkpoint this process resumed from, then each one it writes.
  // Never `latest` as found on disk: after a resume from an earlier checkpoint, `latest` names one
  // of the stretch the resume abandoned.
  std::string rollback_dir;
  // Checkpoints, written by every rank in the background (checkpoint_save.h); declared after
  // everything its jobs read, so that it is destroyed (waiting for the job) first.
  CheckpointSaver saver;
  int64_t saved_optimizer_steps = 0;  // the snapshot's step count (a host value it reads)

  Run(const TrainConfig& c, std::ostream& o, Device device, const RunOptions& opt)
      : cfg(c), out(o), ctx(make_context(device, opt.device_index)), dp(opt.comm) {
    ctx.comm = opt.comm;
    if (opt.checkpoint_fault)
      saver.before_write = [f = opt.checkpoint_fault, r = dp.rank()](const std::string& file) {
        f(r, file);
      };
  }

  const ModelConfig& model_config() const { return cfg.model; }
  // Every rank's tokens.
  int64_t tokens_per_step() const {
    return cfg.batch_size * cfg.seq_len * cfg.grad_accum * dp.size();
  }

  // Whether to stop after this step: a signal on any rank stops every rank at the same step (one
  // small all-reduce per call with several ranks; every rank calls it at the same points).
  bool stop_seen = false;
  bool agree_stop(const RunOptions& o) {
    int32_t s = o.stop && o.stop->load() != 0 ? 1 : 0;
    if (dp.active()) {
      Tensor h = Tensor::empty({1}, DType::kI32);
      h.data_as<int32_t>()[0] = s;
      Tensor d = h.to(ctx, ctx.device);
      all_reduce(ctx, *dp.comm(), d, ReduceOp::kMax);
      s = d.to_host(ctx).data_as<const int32_t>()[0];
    }
    stop_seen = s != 0;
    return stop_seen;
  }

  void build(DataStreams data) {
    const ModelConfig mc = model_config();
    ep = make_ep_groups(ctx, dp.comm(), cfg.parallel.ep, mc.n_routed_experts);
    model = std::make_unique<Model>(ctx, mc, Precision{cfg.resolved_recipe(), DType::kBF16},
                                    ep.experts);
    ZeroConfig z;
    z.bucket_elems = std::max<int64_t>(1, static_cast<int64_t>(cfg.optim.bucket_mb * 262144.0));
    z.shard_masters = true;  // each rank keeps its pieces' FP32 masters only (zero_optimizer.h)
    if (ep.experts) {
      model->set_expert_amax_group(ep.data);  // delayed scaling: the experts' amaxes over it
      ep_opt = std::make_unique<EpAdamW>(ctx, dp.comm(), ep, *model, cfg.adamw(), z);
    } else if (dp.comm()) {  // any communicator, one rank included: the same norm at every size
      zero = std::make_unique<ZeroAdamW>(ctx, dp.comm(), model->parameters(), cfg.adamw(), z);
      // The last micro-batch's backward sends each gradient bucket as soon as it is final.
      model->set_grad_ready(
          [this](const std::vector<Parameter*>& ps) { zero->grads_ready(ctx, ps); });
    } else
      optim = std::make_unique<AdamWOptimizer>(ctx, model->parameters(), cfg.adamw());
    graphs = graphs_apply();
    if (optim) optim->set_graphs(graphs);
    micro = std::make_unique<MicroBatchGraphs>(ctx);
    sampler = std::make_unique<BatchSampler>(std::move(data.train),
                                             SamplerArgs{.batch_size = cfg.batch_size,
                                                         .seq_len = cfg.seq_len,
                                                         .seed = static_cast<uint64_t>(cfg.seed),
                                                         .rank = dp.rank(),
                                                         .world_size = dp.size()});
    const int64_t val_need = cfg.batch_size * cfg.seq_len + 1;
    if (data.val && cfg.eval.every > 0 && data.val->size() < val_need) {
      out << "note: the validation data has " << data.val->size()
          << " tokens, fewer than one batch needs (batch_size * seq_len + 1 = " << val_need
          << "); training without validation (more text, a larger data.val_fraction or "
             "eval.every = 0 removes this note)\n";
    } else if (data.val && cfg.eval.every > 0) {
      val = std::make_unique<ValBatches>(std::move(*data.val),
                                         ValBatchesArgs{.batch_size = cfg.batch_size,
                                                        .seq_len = cfg.seq_len,
                                                        .max_batches = cfg.eval.batches});
    }
  }

  // What this rank holds of the optimizer's state (ZeRO-1's or expert parallelism's optimizer).
  int64_t opt_master_bytes() const { return zero ? zero->master_bytes() : ep_opt->master_bytes(); }
  int64_t opt_moment_bytes() const { return zero ? zero->moment_bytes() : ep_opt->moment_bytes(); }

  // Once, after the first full preparation with ZeRO-1 (when the masters are sharded): what each
  // rank holds of the optimizer's state against one rank holding all of it.
  bool zero_memory_noted = false;
  void note_zero_memory() {
    if (zero_memory_noted || !dp.writer()) return;
    zero_memory_noted = true;
    int64_t elems = ep_opt ? ep_opt->trainable_elems() : 0;
    if (zero)
      for (const int64_t n : zero->layout().shard_elems) elems += n;
    const bool sharded = zero ? zero->masters_sharded() : ep_opt->masters_sharded();
    const auto mib = [](int64_t b) { return std::to_string((b + (1 << 19)) >> 20) + " MiB"; };
    out << "ZeRO-1 per rank: FP32 masters " << mib(opt_master_bytes()) << " ("
        << (sharded ? "sharded" : "whole") << "), AdamW moments " << mib(opt_moment_bytes())
        << "; one rank would hold " << mib(elems * 4) << " and " << mib(elems * 4) << "\n";
  }

  // The model and optimizer, for the checkpoint writer and reader (checkpoint_plan.h).
  TrainingSources sources() {
    return {.model = model.get(),
            .zero = zero.get(),
            .ep = ep_opt.get(),
            .optim = optim.get(),
            .optimizer_steps = &saved_optimizer_steps,
            .rank = dp.rank(),
            .world = dp.size()};
  }

  // The checkpoint of the current step (collective with several ranks): each rank snapshots what
  // it writes (checkpoint_plan.h: its share of the weights, its ZeRO-1 moment shards, with
  // expert parallelism its own experts) into pinned host memory behind the step's work, and
  // writes it in the background into step_N.partial, which rank 0 renames into place once every
  // rank has written its part (checkpoint_save.h).
  void save_checkpoint() {
    const int64_t at = step;
    const std::string final_dir = ckpt_root + "/" + step_dir_name(at);
    last_checkpoint = final_dir;
    rollback_dir = final_dir;  // a rollback waits for the write (load_checkpoint)
    saved_optimizer_steps = zero     ? zero->steps_taken()
                            : ep_opt ? ep_opt->steps_taken()
                                     : optim->steps_taken();
    // Sharded masters are written from their owners' shards; unsharded ones must be whole.
    if (zero && !zero->masters_sharded()) zero->gather_masters(ctx);  // (collective)
    if (ep_opt) ep_opt->gather_unsharded_masters(ctx);
    TrainingCheckpoint tc = training_checkpoint(sources());
    SaveRequest req{.root = ckpt_root,
                    .name = step_dir_name(at),
                    .plan = make_checkpoint_plan(std::move(tc.files), tc.holdings, dp.size()),
                    .rank0_files = {},
                    .after_commit = {}};
    io::NamedTensors recipe = model->recipe_state(ctx);  // (collective with sharded experts)
    if (dp.writer()) {
      nlohmann::json st;
      st["step"] = at;
      st["tokens_seen"] = tokens_seen;
      const auto s = sampler->state().to_array();
      st["sampler"] = std::vector<int64_t>(s.begin(), s.end());
      st["spike_window"] = std::vector<double>(spike_window.begin(), spike_window.end());
      req.rank0_files.emplace_back("config.json", [c = tc.config_json](const std::string& path) {
        write_model_config(path, c);
      });
      if (!tc.index_json.empty())
        req.rank0_files.emplace_back(
            io::kShardIndexName,
            [t = tc.index_json](const std::string& p) { io::write_text_file_atomic(p, t); });
      req.rank0_files.emplace_back(
          kRecipeStateFile,
          [r = std::move(recipe)](const std::string& path) { io::write_safetensors(path, r); });
      req.rank0_files.emplace_back(kTrainerStateFile,
                                   [t = st.dump(1) + "\n"](const std::string& path) {
                                     io::write_text_file_atomic(path, t);
                                   });
      req.after_commit = [this, at] {
        io::write_text_file_atomic(ckpt_root + "/latest", step_dir_name(at) + "\n");
        prune_checkpoints(at);
      };
    }
    saver.save(ctx, dp.comm().get(), std::move(req));
  }

  // Waits for the checkpoint being written on every rank; every rank throws when one failed.
  void finish_checkpoint() { saver.finish(ctx, dp.comm().get()); }

  // The run directory is this run's alone (run_dir.h), so every step_N here is. Checkpoints
  // after the current step are left alone: they are of a stretch this run abandoned by resuming
  // from an earlier checkpoint, and are the user's to delete.
  void prune_checkpoints(int64_t newest_step) const {
    if (cfg.keep_checkpoints <= 0) return;
    std::vector<std::string> steps;
    const std::string newest = step_dir_name(newest_step);
    for (const auto& e : fs::directory_iterator(ckpt_root)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() && n.rfind("step_", 0) == 0 && n.find('.') == std::string::npos &&
          n <= newest)
        steps.push_back(n);
    }
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + static_cast<size_t>(cfg.keep_checkpoints) < steps.size(); ++i)
      fs::remove_all(ckpt_root + "/" + steps[i]);
  }

  // cuda_graphs applies on CUDA with one process and no delayed scaling (step_graph.h says why).
  bool graphs_apply() const {
    const Recipe r = cfg.resolved_recipe();
    const bool delayed = std::any_of(r.gemm.begin(), r.gemm.end(),
                                     [](const GemmRecipe& g) { return g.is_delayed(); });
    return cfg.cuda_graphs && ctx.device == Device::kCuda && !dp.comm() && !delayed;
  }

  // The GEMMs' copies of the weights for the next forward, and the gradients zeroed. With
  // optim.fused_prepare the optimizer wrote most of them in its update (Model::weight_outputs);
  // only the rest is prepared here. Graphed after the first time (train/step_graph.h).
  void prepare_weights() {
    auto zero_grads = [&] {
      if (ep_opt)
        ep_opt->zero_grad(ctx);
      else if (zero)
        zero->zero_grad(ctx);
      else
        optim->zero_grad(ctx);
    };
    // ZeRO-1 (and expert parallelism's, expert_parallel.h) gathers the GEMM weights in their
    // prepared form (FP8 blocks, BF16): after the first full preparation it writes them
    // (zero_optimizer.h), and only the rest is prepared here. With a tied head the embedding's
    // master is read too: then it gathers the masters and every rank prepares them all. (No graphs
    // with a communicator.)
    const bool zero_outputs =
        (zero || ep_opt) && cfg.optim.fused_prepare && !cfg.model.tie_word_embeddings;
    if (zero_outputs) {
      if (outputs_attached) {
        model->prepare(ctx, PrepareScope::kNotFused);
      } else {
        model->prepare(ctx);
        // Shards the masters of these weights (ZeroConfig::shard_masters).
        const std::vector<WeightOutput> w = model->weight_outputs(OutputCopies::kBf16AndFp8);
        if (zero)
          zero->set_weight_outputs(ctx, w);
        else
          ep_opt->set_weight_outputs(ctx, w);
        outputs_attached = true;
        note_zero_memory();
      }
      zero_grads();
      ++weights_generation;
      return;
    }
    const bool fused = cfg.optim.fused_prepare && !zero && !ep_opt;
    if (fused && !outputs_attached) {
      model->prepare(ctx);
      optim->set_weight_outputs(
          ctx, model->weight_outputs(cfg.optim.fused_prepare_fp8 ? OutputCopies::kBf16AndFp8
                                                                 : OutputCopies::kBf16Only));
      outputs_attached = true;
      zero_grads();
      pre_graph.invalidate();
      ++weights_generation;
      return;
    }
    const PrepareScope scope = fused ? PrepareScope::kNotFused : PrepareScope::kAll;
    const GraphedSection::Ran ran = pre_graph.run(ctx, graphs, fused ? "not fused" : "all", [&] {
      model->prepare(ctx, scope);
      zero_grads();
    });
    // A replay rewrites the prepared weights in the buffers of its capture; anything else made new
    // ones.
    if (ran != GraphedSection::Ran::kReplayed) ++weights_generation;
  }

  // A new run's weights from a checkpoint of any form read_checkpoint takes (FP8 weights
  // dequantized into the FP32 masters); missing MTP layers are initialised from the seed.
  void init_from_checkpoint(const std::string& dir) {
    const io::ElementRanges mine = model_resume_ranges(*model);  // EP: not the others' experts
    CheckpointReadOptions ro;
    ro.cast = ReadCast::kToF32;
    ro.ranges = &mine;
    const LoadedCheckpoint ck = read_checkpoint(dir, ro);
    for (const std::string& w :
         load_checkpoint_into(ctx, *model, ck, static_cast<uint64_t>(cfg.seed)))
      out << "warning: " << w << "\n";
    out << "initialised from " << dir << (ck.stored_fp8 ? " (FP8 weights dequantized)" : "")
        << ": step 0, fresh optimizer\n";
  }

  // Weights, optimizer, recipe state; with kModelAndData, also the sampler position and the
  // spike window.
  enum class Restore : uint8_t { kModelOnly, kModelAndData };
  void load_checkpoint(const std::string& dir, Restore what) {
    finish_checkpoint();                  // a rollback may read the checkpoint being written
    outputs_attached = false;             // the masters change: the next step prepares everything
    if (zero) zero->gather_masters(ctx);  // sharded masters: whole storage to load into
    if (ep_opt) ep_opt->gather_masters(ctx);
    // Each rank reads what it holds: its experts, its ZeRO-1 pieces' moments (checkpoint_plan.h).
    for (const std::string& w : load_training_checkpoint(ctx, dir, sources()))
      out << "warning: " << w << "\n";
    model->load_recipe_state(ctx, io::read_safetensors(dir + "/" + kRecipeStateFile).tensors);
    const std::string state_file = dir + "/" + kTrainerStateFile;
    std::error_code ec;
    OCTET_CHECK(fs::exists(state_file, ec), dir, ": no ", kTrainerStateFile,
                " (not a training checkpoint)");
    const TrainerState st = read_trainer_state(state_file);
    step = st.step;
    if (what == Restore::kModelOnly) return;
    tokens_seen = st.tokens_seen;
    sampler->set_state(st.sampler);
    spike_window.assign(st.spike_window.begin(), st.spike_window.end());
  }

  // The validation loss of the weights after the step's update. The prepared copies are made
  // fresh first: without optim.fused_prepare_fp8 the FP8 weights the forward reads are prepared
  // at the start of the next step, so they would still be the step's own (one update old).
  double validate_loss() {
    prepare_weights();
    double sum = 0;
    for (int64_t i = 0; i < val->size(); ++i) {
      const TokenBatch b = val->batch(i);
      sum += model->read_losses(ctx, model->step(ctx, {b.inputs, b.targets}, Pass::kForward)).main;
    }
    return sum / static_cast<double>(std::max<int64_t>(val->size(), 1));
  }

  double shadow_loss(const TokenBatch& b) {
    if (!shadow)
      shadow = std::make_unique<Model>(ctx, model_config(),
                                       Precision{recipe_preset("bf16"), DType::kBF16}, ep.experts);
    const CopyKind kind =
        ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kDeviceToDevice;
    if (zero) zero->gather_masters(ctx);  // every rank runs the shadow (collective)
    if (ep_opt) ep_opt->gather_masters(ctx);
    for (Parameter* p : model->parameters()) {
      Parameter& s = shadow->parameter(p->name);
      ctx.be().copy(s.value.data(), p->value.data(), p->value.nbytes(), kind);
    }
    if (zero) zero->shard_masters(ctx);  // the whole copies were temporary
    if (ep_opt) ep_opt->shard_masters(ctx);
    shadow->prepare(ctx);
    return shadow->read_losses(ctx, shadow->step(ctx, {b.inputs, b.targets}, Pass::kForward)).main;
  }

  bool is_spike(double loss) const {
    const auto n = static_cast<int64_t>(spike_window.size());
    if (cfg.safety.spike_window == 0 || n < cfg.safety.spike_window) return false;
    double mean = 0, var = 0;
    for (double v : spike_window) mean += v;
    mean /= static_cast<double>(n);
    for (double v : spike_window) var += (v - mean) * (v - mean);
    const double sd = std::sqrt(var / static_cast<double>(n));
    return loss > mean + cfg.safety.spike_threshold * sd;
  }

  void remember_loss(double loss) {
    if (cfg.safety.spike_window == 0) return;
    spike_window.push_back(loss);
    while (static_cast<int64_t>(spike_window.size()) > cfg.safety.spike_window)
      spike_window.pop_front();
  }
};

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

// What the run reports: the progress lines, metrics.jsonl and the result.
struct Records {
  Progress progress;
  std::unique_ptr<MetricsWriter> metrics;
  RunResult result = {};
  std::vector<std::string> pending_changes = {};  // recorded with the first step after the resume
  int64_t steps_run = 0;                          // by this process
};

// ---- the step ----

// One step's forward and backward passes over its grad_accum micro-batches, before any update.
struct StepPass {
  std::vector<ModelLosses> micro;  // per micro-batch, unread until the losses are summed
  TokenBatch first;                // the first micro-batch (the BF16 shadow's input)
  double loss = 0;                 // main loss, mean over the micro-batches
};

// Prepares the weights, runs the passes (gradients accumulate over the micro-batches) and reads
// the losses: the step's planned synchronisation. Fills sm's loss, MTP losses, site numerics and the
// MoE layers' casts.
StepPass forward_backward(Run& run, StepMetrics& sm) {
  const TrainConfig& cfg = run.cfg;
  // The gradient of the global batch's mean loss: every rank's micro-batches scaled alike.
  const float micro_scale = 1.0f / static_cast<float>(cfg.grad_accum * run.dp.size());
  run.prepare_weights();  // and the gradients zeroed
  // Every sites_every steps (and the first) also record every site's quantization numerics.
  const bool probe_step =
      cfg.sites_every > 0 && ((run.step + 1) % cfg.sites_every == 0 || run.step == 0);
  SiteProbe probe;
  if (probe_step) run.model->set_probe(&probe);
  // The casts of the step's passes, counted in the ops (host-side counts, no synchronisation).
  if (!run.ctx.casts) run.ctx.casts = std::make_shared<CastCounter>();
  run.ctx.casts->reset();
  StepPass pass;
  for (int64_t m = 0; m < cfg.grad_accum; ++m) {
    const TokenBatch b = run.sampler->next();
    if (m == 0) pass.first = b;
    // The batch goes up from pinned memory without a wait; graphed unless probing (the probe reads
    // values to the host). ZeRO-1: the last micro-batch's backward sends the gradient buckets.
    if (run.zero && m == cfg.grad_accum - 1) run.zero->begin_final_backward();
    pass.micro.push_back(run.micro->run(run.ctx, run.graphs && !probe_step, *run.model,
                                        {b.inputs, b.targets}, micro_scale,
                                        std::to_string(run.weights_generation)));
  }
  std::vector<const std::string*> failures = {&run.micro->failure(), &run.pre_graph.failure()};
  if (run.optim) failures.push_back(&run.optim->graph_failure());
  for (const std::string* f : failures)
    if (!f->empty() && !run.graph_failure_noted) {
      run.out << "note: cuda_graphs: " << *f << "; that part of the step runs eagerly\n";
      run.graph_failure_noted = true;
    }
  run.model->set_probe(nullptr);
  if (const auto passes = static_cast<double>(pass.micro[0].expert_load.size() * pass.micro.size());
      passes > 0) {
    const CastCounts c = run.ctx.casts->at("moe.routed");
    for (int k = 0; k < kCastKindCount; ++k)
      sm.moe_casts[cast_kind_name(static_cast<CastKind>(k))] =
          static_cast<double>(c.n[static_cast<size_t>(k)]) / passes;
  }
  for (const auto& [name, n] : probe.sites())
    sm.sites[name] = {n.amax, n.saturated_share(), n.flushed_share()};
  // The planned synchronisation of the step; with several ranks, means over all of them in global
  // micro-batch order (DataParallel::global_mean), and the expert loads summed over them.
  std::vector<double> mains;
  mains.reserve(pass.micro.size());
  std::vector<std::vector<double>> mtps;
  for (const ModelLosses& l : pass.micro) {
    const LossValues v = run.model->read_losses(run.ctx, l);
    mains.push_back(v.main);
    mtps.resize(v.mtp.size());
    for (size_t k = 0; k < v.mtp.size(); ++k) mtps[k].push_back(v.mtp[k]);
  }
  const double loss = run.dp.global_mean(run.ctx, mains);
  std::vector<double> mtp;
  mtp.reserve(mtps.size());
  for (const std::vector<double>& d : mtps) mtp.push_back(run.dp.global_mean(run.ctx, d));
  run.dp.sum_expert_loads(run.ctx, pass.micro);
  sm.loss = loss;
  sm.mtp_loss = mtp;
  pass.loss = loss;
  return pass;
}

// ---- the safety nets ----

struct SafetyNets {
  int64_t rollbacks_in_a_row = 0;
  int64_t skipped_in_a_row = 0;
};

enum class LossVerdict : uint8_t { kApply, kSkip, kRolledBack };

// Before the update: a non-finite loss skips it; a loss spike (safety.spike_*) keeps it, skips it
// or rolls the weights back to the last checkpoint (at most 3 times in a row; then it skips).
// A rollback replaces the records of the steps it undoes. Sets sm's skip reason when skipping.
LossVerdict check_loss(Run& run, SafetyNets& nets, Records& rec, StepMetrics& sm) {
  const TrainConfig& cfg = run.cfg;
  const double loss = sm.loss;
  if (!std::isfinite(loss)) {
    sm.skip_reason = "non-finite loss";
    return LossVerdict::kSkip;
  }
  if (!run.is_spike(loss)) return LossVerdict::kApply;
  std::ostringstream msg;
  msg << "step " << sm.step << ": loss spike " << loss << " (window of " << run.spike_window.size()
      << ")";
  bool apply = true;
  if (cfg.safety.spike_action == SpikeAction::kSkip) {
    apply = false;
    sm.skip_reason = "loss spike";
  } else if (cfg.safety.spike_action == SpikeAction::kRollback) {
    if (!run.rollback_dir.empty() && nets.rollbacks_in_a_row < 3) {
      const std::string dir = run.rollback_dir;
      // The sampler moves on past the offending batches.
      run.load_checkpoint(dir, Run::Restore::kModelOnly);
      // The steps after the checkpoint are run again: their records are replaced.
      if (rec.metrics)
        rec.metrics = std::make_unique<MetricsWriter>(MetricsWriter::resume(cfg.run_dir, run.step));
      ++nets.rollbacks_in_a_row;
      rec.progress.message(msg.str() + ": rolled back to " + dir);
      return LossVerdict::kRolledBack;
    }
    apply = false;
    sm.skip_reason = "loss spike (no checkpoint to roll back to)";
  }
  rec.progress.message(msg.str() + (apply ? ", kept" : ", update skipped"));
  return apply ? LossVerdict::kApply : LossVerdict::kSkip;
}

// The optimizer update, skipped when the gradients are not finite; then the router bias and the
// spike window. Returns whether the update was applied.
bool apply_update(Run& run, SafetyNets& nets, const StepPass& pass, double lr, StepMetrics& sm) {
  StepStats st;
  if (run.ep_opt) {
    st = run.ep_opt->step(run.ctx, static_cast<float>(lr));
  } else if (run.zero) {
    st = run.zero->step(run.ctx, static_cast<float>(lr));
  } else {
    run.optim->step(run.ctx, static_cast<float>(lr));
    st = run.optim->finish_step(run.ctx);
  }
  sm.grad_norm = st.grad_norm;
  if (st.skipped) {
    sm.skip_reason = "non-finite gradient";
    return false;
  }
  run.model->update_router_bias(run.ctx, pass.micro,
                                static_cast<float>(run.model_config().bias_update_rate));
  run.remember_loss(pass.loss);
  nets.rollbacks_in_a_row = 0;
  return true;
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

// ---- the records ----

// The step's measurements: the BF16 shadow, the router imbalance, time, throughput and memory.
// Synchronises with the device (the step's end).
void measure_step(Run& run, const StepPass& pass, std::chrono::steady_clock::time_point t0,
                  StepMetrics& sm) {
  const TrainConfig& cfg = run.cfg;
  if (cfg.safety.shadow_bf16 > 0 && sm.step % cfg.safety.shadow_bf16 == 0 &&
      cfg.resolved_recipe().any_fp8()) {
    // Several ranks: the mean over every rank's first micro-batch.
    const double fp8_first =
        run.dp.mean_over_ranks(run.ctx, run.model->read_losses(run.ctx, pass.micro[0]).main);
    const double bf = run.dp.mean_over_ranks(run.ctx, run.shadow_loss(pass.first));
    sm.shadow_bf16_loss = bf;
    sm.shadow_gap = (fp8_first - bf) / bf;
  }
  if (!pass.micro[0].expert_load.empty() && (sm.step % cfg.log_every == 0 || sm.step == 1)) {
    double worst = 1.0;
    for (const Tensor& c : pass.micro[0].expert_load)
      worst = std::max(worst, max_over_mean(c.to_host(run.ctx)));
    sm.router_imbalance = worst;
  }
  run.ctx.synchronize();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  sm.step_ms = ms;
  sm.tokens_per_s = static_cast<double>(run.tokens_per_step()) / (ms / 1000.0);
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

  while (run.step < cfg.steps && !run.agree_stop(opt)) {
    const auto t0 = std::chrono::steady_clock::now();
    run.ctx.be().reset_peak();
    const double lr = lr_at(sched, run.step);
    StepMetrics sm;
    sm.step = run.step + 1;
    sm.lr = lr;
    const StepPass pass = forward_backward(run, sm);
    const LossVerdict verdict = check_loss(run, nets, rec, sm);
    if (verdict == LossVerdict::kRolledBack) continue;
    bool apply = verdict == LossVerdict::kApply;
    if (apply) apply = apply_update(run, nets, pass, lr, sm);
    sm.skipped = !apply;
    if (sm.skipped)
      rec.progress.message("step " + std::to_string(sm.step) + ": " + sm.skip_reason +
                           ", update skipped");
    measure_step(run, pass, t0, sm);
    record_step(run, rec, sm);
    if (diverged(cfg, nets, rec, sm)) break;
    const bool saves = cfg.checkpoint_every >= 0;  // -1: a benchmark that writes nothing
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
