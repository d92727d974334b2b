// `octet bench comm`: the collectives of a distributed step, on the shapes of a training config
// (configs/baseline-h100.toml by default), launched like training: `--nproc N` starts N ranks on
// this machine, or the ranks come from torchrun / srun / mpirun (src/dist/launch.h); world size 1
// runs too (each rank exchanges with itself). On the CPU backend the ranks are threads of this
// process on the in-process communicator (slow; for tests).
//
// What is timed, each the median of --runs with every rank entering together (a barrier before
// each run), the slowest rank's median reported:
//   - the MoE dispatch as the engine does it (model/moe_ep.h): the router on random logits (an
//     untrained router: about uniform loads), the counts all-gather and host read with the local
//     map (ep_plan), then one all_to_all_v of the FP8 payload and one of its 1x128 FP32 scales;
//   - the combine: one all_to_all_v of the expert outputs in BF16 back to their sources (the
//     backward's two moves, the combine's gradient out and dX back, are BF16 moves of this size);
//   - NCCL's own all-to-all (equal blocks to every rank: grouped ncclSend/ncclRecv, as nccl-tests'
//     alltoall_perf) of the dispatch's and of the combine's byte count, in the same run;
//   - all-reduce, reduce-scatter and all-gather of one gradient bucket (optim.bucket_mb MiB of
//     FP32).
//
// Bandwidths as nccl-tests defines them (its doc/PERFORMANCE.md), S bytes in time t:
//   algbw = S / t, S = the whole buffer (all-reduce), the whole gathered / scattered buffer
//   (all-gather, reduce-scatter), the bytes a rank sends (all-to-all);
//   busbw = algbw x 2 (n - 1) / n (all-reduce), algbw x (n - 1) / n (the others).
// The engine's all-to-all-v moves uneven blocks: S is the ranks' mean of the bytes each sends, and
// busbw the ranks' mean of the bytes that leave a rank, over t (for equal blocks: nccl-tests').
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench.h"
#include "cli.h"
#include "dist/inprocess_comm.h"
#include "dist/nccl_comm.h"
#include "launch.h"
#include "model/describe.h"
#include "model/moe_ep.h"
#include "ops/moe_router/moe_router.h"
#include "train/train_config.h"

namespace octet::bench {
namespace {

struct Row {
  std::string op;
  double bytes = 0;     // S, the ranks' mean
  double off_rank = 0;  // bytes leaving a rank (all-to-all only), the ranks' mean
  double busbw_factor = 0;
  double us = 0;        // the slowest rank's median
  int compare_to = -1;  // row of the equal-block all-to-all of the same bytes (algbw ratio)
};

double mean_over_ranks(Context& ctx, Comm& comm, double v) {
  const std::vector<double> all = all_gather_values(ctx, comm, v);
  return std::accumulate(all.begin(), all.end(), 0.0) / static_cast<double>(all.size());
}

double max_over_ranks(Context& ctx, Comm& comm, double v) {
  const std::vector<double> all = all_gather_values(ctx, comm, v);
  return *std::max_element(all.begin(), all.end());
}

// Random FP32 logits (a sum of three uniforms), different on every rank.
Tensor random_f32(Context& ctx, int64_t rows, int64_t cols, uint64_t seed, float scale) {
  Tensor h = Tensor::empty({rows, cols}, DType::kF32);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int32_t>(s >> 32)) * 0x1p-31f;
  };
  for (int64_t i = 0; i < rows * cols; ++i)
    h.data_as<float>()[i] = (next() + next() + next()) * scale;
  return h.to(ctx, ctx.device);
}

// The shapes one run measures, from the training config.
struct CommBenchShape {
  int64_t tokens = 0, hidden = 0, experts = 0, top_k = 0, n_group = 1, topk_group = 1;
  int64_t bucket_bytes = 0;
  int64_t moe_layers = 0;
  int64_t grad_accum = 1;
  int64_t params = 0, expert_params = 0;  // the model's, for the per-step estimates
};

void run_comm_bench(Context& ctx, Comm& comm, const CommBenchShape& sh, int warmup, int runs) {
  const int W = comm.size(), me = comm.rank();
  const int64_t T = sh.tokens, D = sh.hidden, E = sh.experts, k = sh.top_k;
  const double n = W, ring = (n - 1) / n;
  OCTET_CHECK(E % W == 0, "octet bench comm: ", E, " routed experts do not divide over ", W,
              " ranks (the dispatch shards the experts over every rank, as parallel.ep = ", W,
              " does)");
  auto timed = [&](const std::function<void()>& fn) {
    const Timing t = time_op(ctx, fn, warmup, runs, [&] { comm.barrier(ctx); });
    return max_over_ranks(ctx, comm, t.median_ms * 1e3);
  };
  std::vector<Row> rows;

  // The MoE layer's dispatch and combine on this rank's tokens.
  const RouterConfig rc{
      .num_experts = E, .top_k = k, .n_group = sh.n_group, .topk_group = sh.topk_group};
  const uint64_t seed = 1000 + static_cast<uint64_t>(me);
  const Tensor logits = random_f32(ctx, T, E, seed, 1.0f);
  const Tensor bias = random_f32(ctx, 1, E, seed + 500, 1e-3f).reshape({E});
  const RouterOutput route =
      moe_router_forward(ctx, {.logits = logits, .bias = bias, .config = rc});
  const PermuteMap map = moe_permute_map(
      ctx, {.topk_idx = route.topk_idx, .num_experts = E, .padding = PermutePadding::kNone});
  const QuantTensor q = moe_permute_quantize(ctx, map,
                                             {.input = random_bf16(ctx, {T, D}, seed),
                                              .format = Fp8Format::kE4M3,
                                              .granularity = Granularity::k1x128,
                                              .rounding = ScaleRounding::kPow2});
  const EpRoute plan = ep_plan(ctx, comm, map, /*pad=*/true);
  const Tensor expert_out = random_bf16(ctx, {plan.received, D}, seed + 77);
  const double row_fp8 = static_cast<double>(q.data.cols() * 1 + q.scale_inv.cols() * 4);
  const double sent_rows = static_cast<double>(T * k);
  const double off_rows = sent_rows - static_cast<double>(plan.send_rows[static_cast<size_t>(me)]);
  const double disp_bytes = mean_over_ranks(ctx, comm, sent_rows * row_fp8);
  const double disp_off = mean_over_ranks(ctx, comm, off_rows * row_fp8);
  // The combine sends back what the rank received; over the ranks the mean equals what they sent.
  const double comb_rows = static_cast<double>(plan.received);
  const double comb_off_rows =
      comb_rows - static_cast<double>(plan.recv_rows[static_cast<size_t>(me)]);
  const double comb_bytes = mean_over_ranks(ctx, comm, comb_rows * 2.0 * static_cast<double>(D));
  const double comb_off = mean_over_ranks(ctx, comm, comb_off_rows * 2.0 * static_cast<double>(D));
  const double payload_share = static_cast<double>(D) / row_fp8;

  // NCCL's all-to-all of the same bytes: equal blocks of S / n to every rank.
  auto uniform_a2a = [&](double bytes) {
    const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(bytes) / W);
    Tensor send = Tensor::empty(ctx, {per * W}, DType::kU8);
    Tensor recv = Tensor::empty(ctx, {per * W}, DType::kU8);
    ctx.be().memset(send.data(), 0x3C, send.nbytes());
    std::vector<int64_t> counts(static_cast<size_t>(W), per), at(static_cast<size_t>(W));
    for (int p = 0; p < W; ++p) at[static_cast<size_t>(p)] = per * p;
    const double us = timed([&] {
      comm.all_to_all_v(ctx, send.data(), counts.data(), at.data(), recv.data(), counts.data(),
                        at.data(), DType::kU8);
    });
    return std::pair{static_cast<double>(per * W), us};
  };

  const auto [a2a_disp_bytes, a2a_disp_us] = uniform_a2a(disp_bytes);
  const int nccl_disp = static_cast<int>(rows.size());
  const std::string own = comm.name() + " all-to-all, equal blocks, ";
  rows.push_back({.op = own + "the dispatch's bytes",
                  .bytes = a2a_disp_bytes,
                  .off_rank = a2a_disp_bytes * ring,
                  .us = a2a_disp_us});
  const auto [a2a_comb_bytes, a2a_comb_us] = uniform_a2a(comb_bytes);
  const int nccl_comb = static_cast<int>(rows.size());
  rows.push_back({.op = own + "the combine's bytes",
                  .bytes = a2a_comb_bytes,
                  .off_rank = a2a_comb_bytes * ring,
                  .us = a2a_comb_us});
  const double plan_us = timed([&] { ep_plan(ctx, comm, map, true); });
  rows.push_back({.op = "counts all-gather + host read + local map", .us = plan_us});
  rows.push_back({.op = "dispatch: FP8 payload (all-to-all-v)",
                  .bytes = disp_bytes * payload_share,
                  .off_rank = disp_off * payload_share,
                  .us = timed([&] { ep_exchange(ctx, comm, plan, q.data, true); })});
  rows.push_back({.op = "dispatch: 1x128 scales (all-to-all-v)",
                  .bytes = disp_bytes * (1 - payload_share),
                  .off_rank = disp_off * (1 - payload_share),
                  .us = timed([&] { ep_exchange(ctx, comm, plan, q.scale_inv, true); })});
  const double disp_us = timed([&] { ep_exchange(ctx, comm, plan, q, true); });
  rows.push_back({.op = "dispatch: payload + scales",
                  .bytes = disp_bytes,
                  .off_rank = disp_off,
                  .us = disp_us,
                  .compare_to = nccl_disp});
  rows.push_back({.op = "dispatch with its counts exchange (the engine's)",
                  .bytes = disp_bytes,
                  .off_rank = disp_off,
                  .us = timed([&] {
                    const EpRoute r = ep_plan(ctx, comm, map, true);
                    ep_exchange(ctx, comm, r, q, true);
                  }),
                  .compare_to = nccl_disp});
  const double comb_us = timed([&] { ep_exchange(ctx, comm, plan, expert_out, false); });
  rows.push_back({.op = "combine: BF16 (all-to-all-v)",
                  .bytes = comb_bytes,
                  .off_rank = comb_off,
                  .us = comb_us,
                  .compare_to = nccl_comb});

  // One gradient bucket of FP32: the ZeRO-1 reduce-scatter, the weights' all-gather, and the
  // all-reduce a plain data-parallel step would use.
  const int64_t count = std::max<int64_t>(1, sh.bucket_bytes / 4 / W) * W;
  Tensor full = Tensor::empty(ctx, {count}, DType::kF32),
         out = Tensor::empty(ctx, {count}, DType::kF32);
  Tensor part = Tensor::empty(ctx, {count / W}, DType::kF32);
  ctx.be().memset(full.data(), 0, full.nbytes());
  ctx.be().memset(part.data(), 0, part.nbytes());
  const double bucket = static_cast<double>(count) * 4;
  rows.push_back({.op = "all-reduce, one bucket (FP32)",
                  .bytes = bucket,
                  .busbw_factor = 2 * ring,
                  .us = timed([&] {
                    comm.all_reduce(ctx, full.data(), out.data(), count, DType::kF32,
                                    ReduceOp::kSum);
                  })});
  const double rs_us = timed([&] {
    comm.reduce_scatter(ctx, full.data(), part.data(), count / W, DType::kF32, ReduceOp::kSum);
  });
  rows.push_back({.op = "reduce-scatter, one bucket (FP32)",
                  .bytes = bucket,
                  .busbw_factor = ring,
                  .us = rs_us});
  rows.push_back({.op = "all-gather, one bucket (FP32)",
                  .bytes = bucket,
                  .busbw_factor = ring,
                  .us = timed([&] {
                    comm.all_gather(ctx, part.data(), full.data(), count / W, DType::kF32);
                  })});
  ctx.synchronize();
  if (me != 0) return;

  std::printf(
      "comm on %s (%s), %d rank%s: %lld tokens a rank, hidden %lld, %lld experts, top-%lld; "
      "bucket %.2f MiB FP32; %d run%s an op (the slowest rank's median)\n",
      device_name(ctx.device), comm.name().c_str(), W, W == 1 ? "" : "s", static_cast<long long>(T),
      static_cast<long long>(D), static_cast<long long>(E), static_cast<long long>(k),
      bucket / (1 << 20), runs, runs == 1 ? "" : "s");
  std::printf(
      "routing (router on random logits): %.1f%% of the dispatched rows leave their rank "
      "(uniform: %.1f%%)\n",
      100.0 * disp_off / disp_bytes, 100.0 * ring);
  std::vector<std::vector<std::string>> table;
  for (const Row& r : rows) {
    std::vector<std::string> cells = {r.op, r.bytes > 0 ? fmt(r.bytes / (1 << 20), 2) : "-",
                                      fmt(r.us, 1)};
    if (r.bytes > 0) {
      const double alg = r.bytes / (r.us * 1e-6) / 1e9;
      const double bus =
          r.busbw_factor > 0 ? alg * r.busbw_factor : r.off_rank / (r.us * 1e-6) / 1e9;
      cells.push_back(fmt(alg, 1));
      cells.push_back(fmt(bus, 1));
    } else {
      cells.insert(cells.end(), {"-", "-"});
    }
    if (r.compare_to >= 0) {
      const Row& c = rows[static_cast<size_t>(r.compare_to)];
      cells.push_back(fmt((r.bytes / r.us) / (c.bytes / c.us), 2) + "x");
    } else {
      cells.push_back("");
    }
    table.push_back(cells);
  }
  print_table({"op", "MiB a rank", "us", "algbw GB/s", "busbw GB/s", "vs equal a2a"}, table);
  // One MoE layer, forward and backward: the counts exchange, the dispatch, the combine, and the
  // backward's two BF16 moves of the combine's size.
  const double layer_us = plan_us + disp_us + 3 * comb_us;
  std::printf(
      "one MoE layer, forward + backward (counts, dispatch, combine, 2 BF16 moves back): %.1f us;"
      " x %lld MoE layers = %.2f ms a micro-batch\n",
      layer_us, static_cast<long long>(sh.moe_layers), layer_us * sh.moe_layers / 1e3);
  // A step's gradient reduce-scatter, in buckets of this size: every parameter's FP32 gradient
  // under data parallelism, the replicated ones' under expert parallelism over all W ranks.
  auto rs_step_ms = [&](int64_t params) {
    const double buckets = 4.0 * static_cast<double>(params) / bucket;
    return std::pair{buckets, buckets * rs_us / 1e3};
  };
  const auto [dp_buckets, dp_ms] = rs_step_ms(sh.params);
  const auto [ep_buckets, ep_ms] = rs_step_ms(sh.params - sh.expert_params);
  std::printf(
      "a step's gradient reduce-scatter: DP = %d, all %.1f M parameters: %.1f buckets = %.2f ms;"
      " EP = %d, the %.1f M replicated: %.1f buckets = %.2f ms\n"
      "a step's all-to-all at EP = %d: %lld micro-batch%s x %.2f ms = %.2f ms\n",
      W, static_cast<double>(sh.params) / 1e6, dp_buckets, dp_ms, W,
      static_cast<double>(sh.params - sh.expert_params) / 1e6, ep_buckets, ep_ms, W,
      static_cast<long long>(sh.grad_accum), sh.grad_accum == 1 ? "" : "es",
      layer_us * sh.moe_layers / 1e3,
      layer_us * sh.moe_layers * static_cast<double>(sh.grad_accum) / 1e3);
}

struct CommBenchOptions {
  CommBenchShape shape;
  int nproc = 1, runs = 20, warmup = 5;
  std::string device = "auto";
};

int64_t int_flag(const cli::Args& args, const std::string& flag, int64_t fallback, int64_t lo,
                 int64_t hi) {
  const int64_t v = args.get_int(flag, fallback);
  OCTET_CHECK(v >= lo && v <= hi, "--", flag, " ", v, ": expected ", lo, " to ", hi);
  return v;
}

CommBenchOptions parse_options(const cli::Args& args, const std::vector<std::string>& sets) {
  const std::string path =
      args.positional().empty() ? "configs/baseline-h100.toml" : args.positional()[0];
  std::ifstream f(path);
  OCTET_CHECK(f.good(), path, ": cannot open the training config");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  train::TrainConfig cfg = train::parse_train_config(text, path);
  for (const std::string& kv : sets) train::apply_set(cfg, kv);
  cfg.validate();
  const ModelConfig& mc = cfg.model;
  OCTET_CHECK(mc.n_routed_experts > 0 && mc.num_hidden_layers > mc.first_k_dense_replace, path,
              ": the model has no MoE layer (model.n_routed_experts, model.first_k_dense_replace)");
  CommBenchOptions o;
  o.device = args.choice("device", {"auto", "cuda", "cpu"}, "auto");
  o.nproc = static_cast<int>(int_flag(args, "nproc", 1, 1, 1024));
  o.runs = static_cast<int>(int_flag(args, "runs", 20, 1, 100000));
  o.warmup = static_cast<int>(int_flag(args, "warmup", 5, 0, 100000));
  o.shape = {.tokens = int_flag(args, "tokens", cfg.batch_size * cfg.seq_len, 1, int64_t{1} << 26),
             .hidden = mc.hidden_size,
             .experts = mc.n_routed_experts,
             .top_k = mc.num_experts_per_tok,
             .n_group = mc.n_group,
             .topk_group = mc.topk_group,
             .bucket_bytes = 0,
             .moe_layers = mc.num_hidden_layers - mc.first_k_dense_replace,
             .grad_accum = cfg.grad_accum};
  const ParameterCount pc = count_parameters(mc);
  o.shape.params = pc.total;
  o.shape.expert_params = pc.routed_experts;
  double mb = cfg.optim.bucket_mb;
  if (const auto v = args.get("bucket-mb")) {
    char* end = nullptr;
    mb = std::strtod(v->c_str(), &end);
    OCTET_CHECK(!v->empty() && end && *end == '\0' && mb > 0 && mb <= 65536, "bad value '", *v,
                "' for --bucket-mb: expected a number of MiB in (0, 65536]");
  }
  o.shape.bucket_bytes = std::max<int64_t>(4, static_cast<int64_t>(mb * (1 << 20)));
  return o;
}

int run(const std::vector<std::string>& argv) {
  std::vector<std::string> sets, rest;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--set") {
      OCTET_CHECK(i + 1 < argv.size(), "--set needs a key=value argument");
      sets.push_back(argv[++i]);
    } else {
      rest.push_back(argv[i]);
    }
  }
  const cli::Args args(rest, {"nproc", "device", "runs", "warmup", "tokens", "bucket-mb"}, {});
  args.expect_positional(0, 1, "octet bench comm [CONFIG.toml] [flags]");
  const CommBenchOptions o = parse_options(args, sets);
  const LaunchEnv launch = launch_env();
  const bool cuda = o.device == "cuda" || (o.device == "auto" && cuda_device_count() > 0);
  if (!cuda) {
    OCTET_CHECK(launch.world_size == 1, "octet bench comm: rank ", launch.rank, " of ",
                launch.world_size, " (", launch.launcher,
                "): launched ranks need CUDA and NCCL; on the CPU, in-process ranks: "
                "octet bench comm --device cpu --nproc N");
    run_inprocess_ranks_or_throw(
        o.nproc, [&](Context& ctx) { run_comm_bench(ctx, *ctx.comm, o.shape, o.warmup, o.runs); },
        default_comm_timeout());
    return 0;
  }
  OCTET_CHECK(nccl_built(), "octet bench comm on the GPU needs NCCL, and this build has none (",
              cuda_built() ? "CUDA without libnccl" : "a CPU-only build",
              "); on the CPU: --device cpu");
  if (args.has("nproc")) {
    // The ranks run this command line without --nproc (and with the device resolved).
    std::vector<std::string> child;
    for (size_t i = 0; i < argv.size(); ++i) {
      if (argv[i] == "--nproc")
        ++i;
      else if (argv[i].rfind("--nproc=", 0) != 0)
        child.push_back(argv[i]);
    }
    child.push_back("--device=cuda");
    return cli::spawn_local_ranks(o.nproc, child, {"bench", "comm"});
  }
  std::shared_ptr<Comm> comm = cli::join_launch(launch);
  Context ctx = make_context(Device::kCuda, launch.local_rank);
  if (!comm) comm = make_nccl_comm(ctx, nccl_unique_id(), 0, 1, default_comm_timeout());
  run_comm_bench(ctx, *comm, o.shape, o.warmup, o.runs);
  return 0;
}

}  // namespace

Suite comm_suite() {
  return {"comm", "MoE dispatch / combine all-to-all and gradient collectives vs NCCL's",
          "usage: octet bench comm [CONFIG.toml] [--nproc N] [--device auto|cuda|cpu] [--runs N]\n"
          "                        [--warmup N] [--tokens N] [--bucket-mb X] [--set KEY=VALUE]...\n"
          "\n"
          "On the shapes of CONFIG.toml (default configs/baseline-h100.toml: batch_size x seq_len\n"
          "tokens a rank, hidden, experts, top-k, optim.bucket_mb), times the MoE dispatch as the\n"
          "engine does it (counts all-gather, then all-to-all-v of the FP8 payload and its 1x128\n"
          "scales), the BF16 combine, NCCL's all-to-all of the same bytes, and all-reduce,\n"
          "reduce-scatter and all-gather of one gradient bucket; algbw and busbw as nccl-tests.\n"
          "  --nproc N      start N ranks on this machine (one per GPU); without it, a rank of\n"
          "                 torchrun / srun / mpirun (RANK, WORLD_SIZE, ...), or world size 1\n"
          "  --device       cuda (NCCL), cpu (in-process ranks, threads of this process), or auto\n"
          "                 (cuda when a GPU is visible; the default)\n"
          "  --runs N       timed runs per op (default 20); --warmup N untimed first (default 5)\n"
          "  --tokens N     tokens a rank instead of batch_size x seq_len\n"
          "  --bucket-mb X  bucket size in MiB instead of optim.bucket_mb\n"
          "  --set K=V      override a config key as `octet train` does\n",
          run};
}

}  // namespace octet::bench
