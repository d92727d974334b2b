// `octet bench adamw`: the optimizer step and the weight preparation of a model config (the
// baseline configuration by default) on its real parameter set, per recipe. The model, its
// parameters and their weight outputs are built as the trainer builds them (Model::weight_outputs).
// Times, each a median over runs: AdamW alone; AdamW followed by the separate weight preparation;
// AdamW writing the BF16 copies (optim.fused_prepare) with the rest prepared after it; AdamW
// writing the FP8 128x128 blocks too (optim.fused_prepare_fp8, one pass: adamw_block_kernels.cuh)
// with the rest prepared after it. Then the kernels alone on the FP8 block weights: AdamW, and the
// one-pass AdamW + block quantization. Each with the bytes it must move and their share of the
// device-to-device copy bandwidth measured in the same run, and the memory the prepared weights
// take (resident) and the peak each path adds above it.
#include <cstdio>
#include <fstream>
#include <iterator>

#include "backend/backend.h"
#include "bench.h"
#include "model/init.h"
#include "model/model.h"
#include "ops/adamw/adamw.h"
#include "train/optimizer.h"
#include "train/train_config.h"

namespace octet::bench {
namespace {

// Bytes per parameter (adamw.h): the update reads the f32 gradient and master and the bf16 moments
// and writes the master and moments (20); the optimizer's global norm reads the gradient once more
// (4). A separate preparation reads the master and writes the copy (4 + 2: BF16, or FP8 row-wise +
// column-wise); fused, only the copy is written (2).
constexpr double kAdamWBytes = 20, kNormBytes = 4, kMasterBytes = 4, kCopyBytes = 2;

struct Sizes {
  double all = 0;            // trainable parameters
  double bf16 = 0, fp8 = 0;  // elements with a BF16 / FP8 128x128 weight output
  double resident = 0;       // bytes of the prepared copies the optimizer can write
  double scales = 0;         // bytes of the FP8 scales (row-wise + column-wise)
};

Sizes sizes_of(Model& m) {
  Sizes s;
  for (const Parameter* p : m.parameters())
    if (p->trainable) s.all += static_cast<double>(p->value.numel());
  for (const WeightOutput& w : m.weight_outputs(OutputCopies::kBf16AndFp8)) {
    const auto n = static_cast<double>(w.param->value.numel());
    if (w.fp8.data.data()) {
      s.fp8 += n;
      s.scales +=
          static_cast<double>(w.fp8.scale_inv.nbytes() + w.fp8.columnwise_scale_inv.nbytes());
      s.resident += static_cast<double>(w.fp8.data.nbytes() + w.fp8.columnwise_data.nbytes());
    } else {
      s.bf16 += n;
      s.resident += static_cast<double>(w.bf16.nbytes());
    }
  }
  s.resident += s.scales;
  return s;
}

// Peak device memory `fn` adds above what is in use before it (CUDA; 0 on the CPU, whose peak is
// the process's and cannot be reset).
double peak_added_mib(Context& ctx, const std::function<void()>& fn) {
  if (ctx.device != Device::kCuda) return 0.0;
  ctx.synchronize();
  ctx.be().reset_peak();
  const int64_t base = ctx.be().peak_bytes();
  fn();
  ctx.synchronize();
  return static_cast<double>(ctx.be().peak_bytes() - base) / (1 << 20);
}

int run(const std::vector<std::string>& argv) {
  std::string path = "configs/baseline-h100.toml";
  std::vector<std::string> recipes = {"deepseek", "fp8-flow", "bf16"};
  int runs = 20;
  std::vector<std::string> sets;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--recipe" && i + 1 < argv.size())
      recipes = {argv[++i]};
    else if (argv[i] == "--runs" && i + 1 < argv.size())
      runs = std::stoi(argv[++i]);
    else if (argv[i] == "--set" && i + 1 < argv.size())
      sets.push_back(argv[++i]);
    else
      path = argv[i];
  }
  OCTET_CHECK(runs >= 1, "bench adamw: --runs must be >= 1, got ", runs);
  std::ifstream f(path);
  OCTET_CHECK(f.good(), path, ": cannot open the training config");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  train::TrainConfig cfg = train::parse_train_config(text, path);
  for (const std::string& kv : sets) train::apply_set(cfg, kv);
  Context ctx = make_context(cuda_device_count() > 0 ? Device::kCuda : Device::kCpu);
  const double copy_gbs = copy_bandwidth_gbs(ctx, int64_t{1} << 30, 10);
  std::printf("adamw on %s: %s, %d runs (median ms); device-to-device copy %.0f GB/s\n",
              device_name(ctx.device), path.c_str(), runs, copy_gbs);
  std::vector<std::vector<std::string>> rows, mem_rows;
  for (const std::string& r : recipes) {
    train::TrainConfig c = cfg;
    train::apply_set(c, "recipe=" + r);
    Model m(ctx, c.model, {c.resolved_recipe(), DType::kBF16});
    m.load(ctx, init_parameters(c.model, 1));
    m.prepare(ctx);
    train::AdamWOptimizer opt(ctx, m.parameters(), c.adamw());
    for (Parameter* p : m.parameters())  // a small gradient, as after a backward
      if (p->grad.data()) ctx.be().memset(p->grad.data(), 0x30, p->grad.nbytes());
    const Sizes s = sizes_of(m);
    auto add = [&](const std::string& what, const Timing& t, double bytes, double peak) {
      const double gbs = bytes / (t.median_ms * 1e-3) / 1e9;
      rows.push_back({r, what, fmt(t.median_ms, 3), fmt(bytes / 1e9, 3), fmt(gbs, 0),
                      fmt(100.0 * gbs / copy_gbs, 1), fmt(peak, 0)});
    };
    auto step = [&] {
      opt.step(ctx, 1e-4f);
      opt.finish_step(ctx);
    };
    const double base = (kAdamWBytes + kNormBytes) * s.all;
    // Each path: the outputs it hands the optimizer (none: a full preparation after the update).
    auto path_row = [&](const std::string& what, bool prepare, const OutputCopies* copies,
                        double bytes) {
      m.prepare(ctx);
      opt.set_weight_outputs(ctx, copies ? m.weight_outputs(*copies) : std::vector<WeightOutput>{});
      auto fn = [&] {
        step();
        if (prepare) m.prepare(ctx, copies ? PrepareScope::kNotFused : PrepareScope::kAll);
      };
      const Timing t = time_op(ctx, fn, 2, runs);
      add(what, t, bytes, peak_added_mib(ctx, fn));
    };
    const OutputCopies bf16_only = OutputCopies::kBf16Only, with_fp8 = OutputCopies::kBf16AndFp8;
    const double prep = (kMasterBytes + kCopyBytes) * (s.bf16 + s.fp8) + s.scales;
    path_row("adamw alone", false, nullptr, base);
    path_row("adamw + separate preparation", true, nullptr, base + prep);
    path_row("fused bf16 (fused_prepare_fp8 = false)", true, &bf16_only,
             base + kCopyBytes * s.bf16 + (kMasterBytes + kCopyBytes) * s.fp8 + s.scales);
    path_row("fused fp8, one pass (the default)", true, &with_fp8,
             base + kCopyBytes * (s.bf16 + s.fp8) + s.scales);
    opt.set_weight_outputs(ctx, {});
    // The kernels alone on the FP8 block weights (no norm, host constants, no clipping).
    m.prepare(ctx);
    const std::vector<WeightOutput> outs = m.weight_outputs(with_fp8);
    std::vector<std::pair<AdamWArgs, const BlockQuantOutput*>> fp8_args;
    for (const WeightOutput& w : outs) {
      if (!w.fp8.data.data()) continue;
      const Tensor& v = w.param->value;
      fp8_args.push_back({AdamWArgs{.param = v,
                                    .grad = w.param->grad,
                                    .exp_avg = Tensor::empty(ctx, v.shape(), DType::kBF16),
                                    .exp_avg_sq = Tensor::empty(ctx, v.shape(), DType::kBF16),
                                    .lr = 1e-4f},
                          &w.fp8});
      ctx.be().memset(fp8_args.back().first.exp_avg.data(), 0, v.numel() * 2);
      ctx.be().memset(fp8_args.back().first.exp_avg_sq.data(), 0, v.numel() * 2);
    }
    if (!fp8_args.empty()) {
      auto adamw_only = [&] {
        for (const auto& [a, o] : fp8_args) adamw_step(ctx, a);
      };
      auto per_param = [&] {
        for (const auto& [a, o] : fp8_args) adamw_step_block_quantize(ctx, a, *o);
      };
      std::vector<BlockQuantStep> steps;
      steps.reserve(fp8_args.size());
      for (const auto& [a, o] : fp8_args) steps.push_back({a, *o});
      auto one_pass = [&] { adamw_step_block_quantize_many(ctx, steps); };
      add("kernel: adamw on the fp8 weights", time_op(ctx, adamw_only, 2, runs),
          kAdamWBytes * s.fp8, peak_added_mib(ctx, adamw_only));
      add("kernel: one-pass adamw + fp8 blocks, a launch per parameter",
          time_op(ctx, per_param, 2, runs), (kAdamWBytes + kCopyBytes) * s.fp8 + s.scales,
          peak_added_mib(ctx, per_param));
      add("kernel: one-pass adamw + fp8 blocks, batched (the optimizer's)",
          time_op(ctx, one_pass, 2, runs), (kAdamWBytes + kCopyBytes) * s.fp8 + s.scales,
          peak_added_mib(ctx, one_pass));
    }
    mem_rows.push_back({r, fmt(s.all / 1e6, 1), fmt(s.fp8 / 1e6, 1), fmt(s.bf16 / 1e6, 1),
                        fmt(s.resident / (1 << 20), 0)});
  }
  print_table({"recipe", "path", "ms", "GB moved", "GB/s", "% of copy", "peak added MiB"}, rows);
  std::printf(
      "GB moved: what the path must move at least (adamw.h): AdamW 20 B per trainable parameter + "
      "4 for the global norm's read of the gradient; a separate preparation 4 + 2 per prepared "
      "weight (+ FP8 scales); a fused copy 2. %% of copy: GB/s against the device-to-device copy "
      "above. peak added: device memory above what was in use before the path (CUDA only)\n");
  print_table({"recipe", "trainable M", "fp8 block M", "bf16 copy M", "prepared copies MiB"},
              mem_rows);
  std::printf(
      "prepared copies: the resident weight copies the optimizer writes (FP8 row-wise + "
      "column-wise codes and scales, BF16 copies); the FP8 sites keep no BF16 copy, fused or "
      "not\n");
  return 0;
}

}  // namespace

Suite adamw_suite() {
  return {
      "adamw", "the optimizer step and the weight preparation, fused and not",
      "usage: octet bench adamw [CONFIG.toml] [--recipe R] [--runs N] [--set KEY=VALUE]...\n"
      "\n"
      "On the config's model (configs/baseline-h100.toml by default) and its parameters, per\n"
      "recipe (deepseek, fp8-flow and bf16 by default): AdamW alone, AdamW + the separate\n"
      "weight preparation, AdamW writing the BF16 copies, AdamW writing the FP8 blocks too (one\n"
      "pass), and the kernels alone on the FP8 block weights; bytes moved, share of the\n"
      "device-to-device copy bandwidth, peak memory added.\n",
      run};
}

}  // namespace octet::bench
