// `octet bench train-step`: where a training step's time goes, per recipe, on a model config (the
// baseline configuration by default). Times, each a median over runs with the device idle between
// them: the whole forward + backward of a micro-batch, the per-step weight preparation, AdamW over
// every parameter, AdamW writing the prepared weights itself (optim.fused_prepare) with what is
// left of the preparation, and one dense layer, one MoE layer and the output head (forward +
// backward) on their own, so the blocks' sum can be set against the step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <utility>

#include "backend/backend.h"
#include "backend/cuda_graph.h"
#include "backend/kernel_trace.h"
#include "bench.h"
#include "model/init.h"
#include "model/model.h"
#include "model/saved_bytes.h"
#include "ops/cast/cast.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/step_graph.h"
#include "train/train_config.h"

namespace octet::bench {
namespace {

// Uniform random tokens: every expert gets about the same rows, and no id repeats much.
ModelBatch synthetic_batch(const ModelConfig& c, int64_t B, int64_t T) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
  ModelBatch b{Tensor::empty({B, T}, DType::kI32), Tensor::empty({B, T}, DType::kI32)};
  for (int64_t i = 0; i < B * T; ++i) {
    b.inputs.data_as<int32_t>()[i] = tok(rng);
    b.targets.data_as<int32_t>()[i] = tok(rng);
  }
  return b;
}

// The first batch the trainer would draw from `data` (a text file, shards, a directory or a glob,
// as `octet train`'s data.text / data.shards take them) with the config's seed: real text's
// repeated ids and skewed routing, which uniform tokens never show.
ModelBatch data_batch(const train::TrainConfig& cfg, const std::string& data,
                      const std::string& cache_dir) {
  train::DataSourceArgs da;
  da.path = data;
  da.cache_dir = cache_dir;
  da.val_fraction = cfg.data.val_fraction;
  const train::DataStreams streams =
      train::open_data_streams(train::resolve_data_source(da), cfg.model.vocab_size);
  train::BatchSampler sampler(streams.train, {.batch_size = cfg.batch_size,
                                              .seq_len = cfg.seq_len,
                                              .seed = static_cast<uint64_t>(cfg.seed)});
  train::TokenBatch b = sampler.next();
  return {std::move(b.inputs), std::move(b.targets)};
}

Tensor random_act(Context& ctx, int64_t rows, int64_t cols) {
  Tensor h = Tensor::empty({rows, cols}, DType::kF32);
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (int64_t i = 0; i < h.numel(); ++i) h.data_as<float>()[i] = n(rng);
  return cast(ctx, h.to(ctx, ctx.device), DType::kBF16);
}

// A whole optimizer step as the trainer runs it (optim.fused_prepare): the rest of the weight
// preparation with the gradients' zeroing, the forward + backward of one micro-batch (its batch
// uploaded from pinned memory) and AdamW writing the BF16 and FP8 block weights (the trainer's
// default), with CUDA graphs on or off
// (train/step_graph.h). Host time: the host's own time enqueueing the step, against its GPU time.
struct StepTimes {
  Timing gpu;
  double host_ms = 0;
  int64_t replays = 0;
  std::string failure;
};

StepTimes time_whole_step(Context& ctx, Model& m, train::AdamWOptimizer& opt,
                          const ModelBatch& batch, bool graphs, int runs,
                          const std::string& trace_csv = "") {
  train::GraphedSection pre("the weight preparation and the gradients' zeroing");
  train::MicroBatchGraphs micro(ctx);
  opt.set_graphs(graphs);
  m.prepare(ctx);
  opt.set_weight_outputs(ctx, m.weight_outputs(OutputCopies::kBf16AndFp8));
  // One micro-batch a step: the Linear layers' and the experts' gradients are overwritten by their
  // first writer, as the trainer has them (Parameter::first_writer, train/run_state.h).
  const std::vector<Parameter*> first_writers = m.first_writer_parameters();
  for (Parameter* p : first_writers) p->first_writer = true;
  int64_t generation = 0;
  std::vector<double> host_ms;
  auto step = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    if (pre.run(ctx, graphs, "not fused", [&] {
          m.prepare(ctx, PrepareScope::kNotFused);
          opt.zero_grad(ctx);
        }) != train::GraphedSection::Ran::kReplayed)
      ++generation;  // new prepared-weight buffers: the forward graph is captured again
    for (Parameter* p : first_writers) p->grad_fresh = true;
    const ModelLosses l = micro.run(ctx, graphs, m, batch, 1.0f, std::to_string(generation));
    opt.step(ctx, 1e-4f);
    host_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    opt.finish_step(ctx);  // reads the skip flag: waits, outside the host time
  };
  StepTimes t;
  // Warm-up: eager, then the captures (the forward's key settles once the preparation replays).
  t.gpu = time_op(ctx, step, 4, runs);
  std::vector<double> timed(host_ms.end() - runs, host_ms.end());
  std::sort(timed.begin(), timed.end());
  t.host_ms = timed[timed.size() / 2];
  if (!trace_csv.empty()) {  // one more step, its kernels timed one by one (--trace)
    const std::vector<KernelSpan> spans = trace_kernels(ctx, step);
    write_trace_csv(trace_csv, spans);
    const TraceSummary ts = summarize(spans);
    std::printf(
        "trace of one step (%s): %lld kernels, %.2f ms from first start to last end, %.2f ms "
        "with a kernel running, %.2f ms of kernel time: %s\n",
        graphs ? "graphed" : "eager", static_cast<long long>(ts.kernels), ts.span_ms, ts.busy_ms,
        ts.sum_ms, trace_csv.c_str());
  }
  t.replays = micro.replays() + pre.replays() + opt.graph_replays();
  t.failure = !micro.failure().empty() ? micro.failure()
              : !pre.failure().empty() ? pre.failure()
                                       : opt.graph_failure();
  for (Parameter* p : first_writers) p->first_writer = false;
  opt.set_graphs(false);
  opt.set_weight_outputs(ctx, {});  // the columns after this one time AdamW alone
  m.prepare(ctx);
  return t;
}

int run(const std::vector<std::string>& argv) {
  std::string path = "configs/baseline-h100.toml";
  std::vector<std::string> recipes = {"bf16", "fp8-tensor-delayed", "deepseek", "fp8-flow"};
  int runs = 10;
  bool chosen = false;
  std::vector<std::string> sets;
  std::string trace_dir, data, cache_dir = ".cache/octet";
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--recipe" && i + 1 < argv.size()) {
      if (!chosen) recipes.clear();  // the first --recipe replaces the default list
      chosen = true;
      recipes.push_back(argv[++i]);
    } else if (argv[i] == "--runs" && i + 1 < argv.size())
      runs = std::stoi(argv[++i]);
    else if (argv[i] == "--set" && i + 1 < argv.size())
      sets.push_back(argv[++i]);
    else if (argv[i] == "--trace" && i + 1 < argv.size())
      trace_dir = argv[++i];
    else if (argv[i] == "--data" && i + 1 < argv.size())
      data = argv[++i];
    else if (argv[i] == "--cache-dir" && i + 1 < argv.size())
      cache_dir = argv[++i];
    else
      path = argv[i];
  }
  std::ifstream f(path);
  OCTET_CHECK(f.good(), path, ": cannot open the training config");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  train::TrainConfig cfg = train::parse_train_config(text, path);
  for (const std::string& kv : sets) train::apply_set(cfg, kv);
  const ModelConfig& mc = cfg.model;
  Context ctx = make_context(cuda_device_count() > 0 ? Device::kCuda : Device::kCpu);
  OCTET_CHECK(trace_dir.empty() || ctx.device == Device::kCuda,
              "--trace: the kernel timeline needs a CUDA device (this machine has none)");
  const int64_t B = cfg.batch_size, T = cfg.seq_len, N = B * T;
  const ModelBatch batch =
      data.empty() ? synthetic_batch(mc, B, T) : data_batch(cfg, data, cache_dir);
  std::printf("train-step on %s: %s, B %lld x T %lld, %d runs (median ms), tokens: %s\n",
              device_name(ctx.device), path.c_str(), static_cast<long long>(B),
              static_cast<long long>(T), runs,
              data.empty() ? "uniform random" : ("the first batch of " + data).c_str());
  std::vector<std::vector<std::string>> rows, step_rows;
  for (const std::string& r : recipes) {
    train::TrainConfig c = cfg;
    train::apply_set(c, "recipe=" + r);
    Model m(ctx, mc, {c.resolved_recipe(), DType::kBF16});
    m.load(ctx, init_parameters(mc, 1));
    m.prepare(ctx);
    train::AdamWOptimizer opt(ctx, m.parameters(), c.adamw());
    // Host time: how long the host spends in the step call itself (enqueueing kernels, and waiting
    // wherever the step synchronises), against the step's GPU time.
    std::vector<double> host_ms;
    const Timing step = time_op(
        ctx,
        [&] {
          const auto t0 = std::chrono::steady_clock::now();
          m.step(ctx, batch, Pass::kForwardBackward);
          host_ms.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
        },
        2, runs);
    std::sort(host_ms.begin(), host_ms.end());
    const double host = host_ms[host_ms.size() / 2];
    for (const bool graphs : {false, true}) {
      if (graphs && !cuda_graphs_supported(ctx)) continue;
      std::string trace;
      if (!trace_dir.empty()) {
        trace = trace_dir;
        trace.append("/trace-").append(r).append(graphs ? "-graphed" : "-eager").append(".csv");
      }
      const StepTimes st = time_whole_step(ctx, m, opt, batch, graphs, runs, trace);
      step_rows.push_back({r, graphs ? "on" : "off", fmt(st.gpu.median_ms), fmt(st.host_ms),
                           fmt(100.0 * st.host_ms / st.gpu.median_ms, 1),
                           std::to_string(st.replays), st.failure.empty() ? "-" : st.failure});
    }
    const Timing prep = time_op(
        ctx, [&] { m.prepare(ctx); }, 1, runs);
    const Timing adam = time_op(
        ctx,
        [&] {
          opt.step(ctx, 1e-4f);
          opt.finish_step(ctx);
        },
        1, runs);
    // optim.fused_prepare: AdamW writes the prepared weights; what is left is prepared after it.
    // optim.fused_prepare (BF16 copies) and fused_prepare_fp8 (also the FP8 blocks).
    auto fused_timing = [&](OutputCopies copies) {
      m.prepare(ctx);
      opt.set_weight_outputs(ctx, m.weight_outputs(copies));
      return time_op(
          ctx,
          [&] {
            opt.step(ctx, 1e-4f);
            opt.finish_step(ctx);
            m.prepare(ctx, PrepareScope::kNotFused);
          },
          1, runs);
    };
    const Timing fused = fused_timing(OutputCopies::kBf16Only),
                 fused8 = fused_timing(OutputCopies::kBf16AndFp8);
    const Tensor x = random_act(ctx, N, mc.hidden_size);
    DecoderLayer::Saved s;
    // One decoder layer's forward + backward on x (what the dense, moe and graphed columns time).
    auto layer_pass = [&](int64_t i) {
      const Tensor y = m.layer(i).forward(ctx, m.precision(), m.rope(), x, B, T, s);
      m.layer(i).backward(ctx, m.precision(), m.rope(), y, s);
    };
    const Timing dense = time_op(
        ctx, [&] { layer_pass(0); }, 1, runs);
    const double dense_saved = static_cast<double>(saved_bytes(s).total()) / (1 << 20);
    const int64_t moe_i = mc.first_k_dense_replace;
    const Timing moe = time_op(
        ctx, [&] { layer_pass(moe_i); }, 1, runs);
    const SavedBytes moe_kept = saved_bytes(s);
    const double moe_saved = static_cast<double>(moe_kept.total()) / (1 << 20);
    // The MoE feed-forward alone (router, dispatch, experts, combine, shared expert: where the
    // recipes' MoE dataflows differ), and the memory it adds over what was allocated before it. Its
    // input and gradient are the ones the layer's MoE gets (the post-attention norm's output, the
    // layer's output gradient), so that it runs on the layer's data: the same routing, the same
    // value ranges.
    MoeLayer& ffn = *m.layer(moe_i).moe;
    Tensor ffn_x, ffn_dy;
    {
      ffn_dy = m.layer(moe_i).forward(ctx, m.precision(), m.rope(), x, B, T, s);
      NormLayer::Saved again;
      ffn_x = m.layer(moe_i).post_norm.forward(ctx, s.post_norm.x, again);
      s = DecoderLayer::Saved{};
    }
    MoeLayer::Saved ms;
    auto ffn_pass = [&] {
      ffn.forward(ctx, m.precision(), ffn_x, B, ms);
      ffn.backward(ctx, m.precision(), ffn_dy, ms);
    };
    const Timing moe_ffn = time_op(ctx, ffn_pass, 2, runs);
    ms = MoeLayer::Saved{};
    // The MoE layer and its feed-forward as the trainer runs them (cuda_graphs): captured once and
    // replayed, so that no launch gap of the host is in the time. The eager columns above include
    // the host's enqueueing wherever it is slower than the kernels it queues (the many small ones
    // of the router and the dispatch); these are the layers' device time. Without graphs (the CPU)
    // they run eagerly.
    const bool graphs = cuda_graphs_supported(ctx);
    train::GraphedSection layer_graph("the MoE layer"), ffn_graph("the MoE feed-forward");
    const Timing moe_graphed = time_op(
        ctx, [&] { layer_graph.run(ctx, graphs, "layer", [&] { layer_pass(moe_i); }); }, 2, runs);
    s = DecoderLayer::Saved{};
    const Timing ffn_graphed = time_op(
        ctx, [&] { ffn_graph.run(ctx, graphs, "ffn", ffn_pass); }, 2, runs);
    ms = MoeLayer::Saved{};
    for (const train::GraphedSection* g : {&layer_graph, &ffn_graph})
      if (graphs && g->replays() == 0)
        std::printf("%s: not replayed (%s), so its graphed column ran eagerly\n", r.c_str(),
                    g->failure().empty() ? "no capture" : g->failure().c_str());
    layer_graph.invalidate();
    ffn_graph.invalidate();
    ctx.synchronize();
    ctx.be().reset_peak();  // the high-water mark restarts from the memory in use now
    const int64_t base = ctx.be().peak_bytes();
    ffn_pass();
    ctx.synchronize();
    const double moe_mib = ctx.device == Device::kCuda
                               ? static_cast<double>(ctx.be().peak_bytes() - base) / (1 << 20)
                               : 0.0;  // the CPU's peak is the process's and cannot be reset
    ms = MoeLayer::Saved{};
    Tensor targets = batch.targets.to(ctx, ctx.device);
    Tensor one = Tensor::empty({1}, DType::kF32);
    one.data_as<float>()[0] = 1.0f;
    const Tensor d_one = one.to(ctx, ctx.device);
    const Timing head = time_op(
        ctx, [&] { m.head().run(ctx, m.precision(), x, targets, &d_one); }, 1, runs);
    const int64_t L = mc.num_hidden_layers, dense_n = mc.first_k_dense_replace;
    const double blocks = dense.median_ms * static_cast<double>(dense_n) +
                          moe.median_ms * static_cast<double>(L - dense_n) + head.median_ms;
    const double total = step.median_ms + std::min(fused.median_ms, fused8.median_ms);
    rows.push_back({r, fmt(step.median_ms), fmt(host), fmt(prep.median_ms), fmt(adam.median_ms),
                    fmt(fused.median_ms), fmt(fused8.median_ms), fmt(dense.median_ms),
                    fmt(moe.median_ms), fmt(moe_graphed.median_ms), fmt(moe_ffn.median_ms),
                    fmt(ffn_graphed.median_ms), fmt(moe_mib, 0), fmt(dense_saved, 0),
                    fmt(moe_saved, 0), fmt(static_cast<double>(moe_kept.mlp) / (1 << 20), 1),
                    fmt(head.median_ms), fmt(blocks), fmt(static_cast<double>(N) / total, 0)});
  }
  print_table({"recipe", "fwd+bwd", "host in fwd+bwd", "prepare", "adamw", "adamw+prepare fused",
               "fused with fp8", "dense layer", "moe layer", "moe layer graphed", "moe ffn",
               "moe ffn graphed", "moe ffn peak MiB", "dense saved MiB", "moe saved MiB",
               "moe ffn saved MiB", "head", "blocks sum", "tokens/ms"},
              rows);
  std::printf(
      "tokens/ms = B T / (fwd+bwd + the faster fused column); fused: optim.fused_prepare (BF16 "
      "copies), with fp8: also fused_prepare_fp8 (the FP8 blocks); blocks sum = dense x %lld + moe "
      "x "
      "%lld + head (fwd+bwd each); moe ffn: the MoE feed-forward alone (fwd+bwd), its peak memory "
      "above what was in use before it (CUDA; 0 on the CPU), on the layer's MoE input and output "
      "gradient; graphed: the same work captured in a CUDA graph and replayed, as the trainer runs "
      "it (the device time, without the host's launch gaps); saved MiB: what one layer keeps from "
      "its forward for its backward, all of it and its MoE feed-forward's (model/saved_bytes.h)\n",
      static_cast<long long>(mc.first_k_dense_replace),
      static_cast<long long>(mc.num_hidden_layers - mc.first_k_dense_replace));
  print_table({"recipe", "cuda graphs", "whole step", "host per step", "host %", "replays",
               "capture failure"},
              step_rows);
  std::printf(
      "whole step: the rest of the preparation + zeroing, forward + backward of one micro-batch "
      "(batch uploaded from pinned memory), AdamW writing the BF16 and FP8 weights (ms, median); "
      "host per step: the host's time enqueueing it (ms, median); graphs only on CUDA\n");
  return 0;
}

}  // namespace

Suite train_step_suite() {
  return {
      "train-step", "where a training step's time goes, per recipe",
      "usage: octet bench train-step [CONFIG.toml] [--recipe R]... [--runs N] [--set KEY=VALUE]...\n"
      "                              [--trace DIR] [--data PATH [--cache-dir DIR]]\n"
      "\n"
      "Times (median of --runs, default 10) the forward + backward of one micro-batch, the host's\n"
      "own time inside that call (enqueueing, and waiting where the step synchronises), the\n"
      "weight preparation, AdamW, AdamW fused with the preparation, and one dense layer, one MoE "
      "layer, the MoE feed-forward alone and the head on their own (the MoE layer and its "
      "feed-forward also as replayed CUDA graphs, as the trainer runs them). Several --recipe run "
      "one after the other.\n"
      "--set overrides config keys as `octet train` does (e.g. "
      "model.num_nextn_predict_layers=0).\n"
      "--trace DIR also runs one more whole step, eager and graphed, with every kernel's device "
      "start and end recorded (CUPTI, libcupti loaded at run time) into DIR/trace-RECIPE-MODE.csv, "
      "and prints how much of that step had a kernel running and how much kernel time overlapped.\n"
      "--data PATH feeds the step the first batch the trainer would draw from PATH (a text file, "
      "token shards, a directory or a glob, as data.text / data.shards take them; text is prepared "
      "into --cache-dir, default .cache/octet) instead of uniform random tokens: real text repeats "
      "some ids thousands of times a batch and routes unevenly, which costs time the uniform "
      "tokens never show. The MoE layer rows run on random activations either way.\n",
      run};
}

}  // namespace octet::bench
