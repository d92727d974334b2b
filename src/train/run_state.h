// One training run's state (the Run the training loop drives, trainer.cpp and train_step.cpp):
// the model, the optimizer, the data, the checkpoints, the CUDA graphs, and the step's verdict on
// the device (the loss-spike window, ops/step_verdict) with its lagged read (train_step.h).
// Internal to the trainer.
#pragma once

#include <algorithm>
#include <deque>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/cuda_graph.h"
#include "io/atomic_file.h"
#include "io/safetensors_dir.h"
#include "io/safetensors_parts.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "ops/step_verdict/step_verdict.h"
#include "train/checkpoint_plan.h"
#include "train/checkpoint_save.h"
#include "train/data.h"
#include "train/data_parallel.h"
#include "train/expert_parallel.h"
#include "train/optimizer.h"
#include "train/step_graph.h"
#include "train/trainer.h"
#include "train/trainer_state.h"
#include "train/zero_optimizer.h"

namespace octet::train::detail {

namespace fs = std::filesystem;

inline const char* const kRecipeStateFile = "recipe_state.safetensors";
inline const char* const kTrainerStateFile = "trainer_state.json";

std::string step_dir_name(int64_t step);
// max / mean of an expert-count vector (host i32).
double max_over_mean(const Tensor& counts_host);

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
  std::deque<double> spike_window;  // the host's copy of `verdict.window` (checkpoints)
  int64_t step = 0;                 // optimizer steps done
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
    } else {
      optim = std::make_unique<AdamWOptimizer>(ctx, model->parameters(), cfg.adamw());
      // One micro-batch a step: the Linear layers' and the experts' Wgrads write their gradients
      // with = (all but the embedding, norms and router), so the optimizer's zero_grad leaves them
      // (Parameter::first_writer).
      if (cfg.grad_accum == 1)
        for (Parameter* p : model->first_writer_parameters()) p->first_writer = true;
    }
    graphs = graphs_apply();
    if (optim) optim->set_graphs(graphs);
    if (optim) optim->set_lagged_reads(true);  // the trainer reads each step's stats a step late
    make_verdict_buffers();
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
    rollback_dir = final_dir;            // a rollback waits for the write (load_checkpoint)
    if (optim) optim->finish_step(ctx);  // its host count: the trainer reads steps a step late
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
    prepare_weights_and_zero_grads();
    // The first writers' gradients hold nothing of this step: their first backward overwrites them.
    for (Parameter* p : model->parameters())
      if (p->first_writer) p->grad_fresh = true;
  }

  void prepare_weights_and_zero_grads() {
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
    upload_window();
  }

  // The validation loss of the weights after the step's update. The prepared copies are made
  // fresh first: without optim.fused_prepare_fp8 the FP8 weights the forward reads are prepared
  // at the start of the next step, so they would still be the step's own (one update old).
  // Graphed, the eager forwards run between two releases of the cached memory (cuda_graph.h), so
  // that they and the graphs do not each hold a working set.
  double validate_loss() {
    prepare_weights();
    if (graphs) release_cached_device_memory(ctx);
    double sum = 0;
    for (int64_t i = 0; i < val->size(); ++i) {
      const TokenBatch b = val->batch(i);
      sum += model->read_losses(ctx, model->step(ctx, {b.inputs, b.targets}, Pass::kForward)).main;
    }
    if (graphs) release_cached_device_memory(ctx);
    return sum / static_cast<double>(std::max<int64_t>(val->size(), 1));
  }

  // Eager; graphed, between two releases of the cached memory, as the validation.
  double shadow_loss(const TokenBatch& b) {
    if (graphs) release_cached_device_memory(ctx);
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
    const double loss =
        shadow->read_losses(ctx, shadow->step(ctx, {b.inputs, b.targets}, Pass::kForward)).main;
    if (graphs) release_cached_device_memory(ctx);
    return loss;
  }

  // The step's verdict on the device (ops/step_verdict.h) and the buffers it reads and writes;
  // made by build().
  struct Verdict {
    LossWindow window;
    Tensor main, mtp;          // this rank's micro-batches' losses: (K) f32, (D * K) f32
    Tensor all_main, all_mtp;  // every rank's (R * K), (D * R * K); several ranks only
    Tensor means, flags, skip;
    Tensor opt_skipped, grad_norm;  // ZeRO-1 / expert parallelism: the host's values, uploaded
    std::vector<Tensor> counts;     // per MoE layer (E) i32: the bias update's masked sums
  } verdict;
  // The pinned slots the step's results are read back through, one step late (train_step.h).
  std::unique_ptr<PinnedReadback> readback;
  void make_verdict_buffers();
  // The device window <- the host's spike_window (a resume) or the host's <- bytes read back.
  void upload_window();
  void window_from_bytes(const uint8_t* values, const uint8_t* state);
};

}  // namespace octet::train::detail
