// The CUDA backward's chunks (attention.h, "Backward workspace bound"): a backward split into batch
// chunks, head chunks of one sequence, or both gives bitwise the gradients of one unchunked call
// (compact operands and MLA's column windows with dv written into a window), the chunk count and
// workspace follow the rule, the call takes one chunk's workspace and no more, the atomics
// backward chunks too, and a chunked backward captures into a CUDA graph and replays bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>

#if OCTET_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "attention_view_test_util.h"
#include "backend/backend.h"
#include "backend/cuda_graph.h"
#include "numerics/fp8.h"
#if OCTET_WITH_CUDNN
#include "ops/attention/attention_cudnn.h"
#endif

namespace octet {
namespace {

using test::bitwise_equal;
using test::random_tensor;

constexpr int64_t kWhole = std::numeric_limits<int64_t>::max();  // one call, unchunked

struct Case {
  int64_t B, T, H, dqk, dv;
  bool windows;  // q, k, v column windows of wider tensors and dv written into one (MLA)
  std::string name() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " H=" + std::to_string(H) +
           " Dqk=" + std::to_string(dqk) + " Dv=" + std::to_string(dv) +
           (windows ? " (windows)" : "");
  }
};

// Widths and first columns of the windows' base tensors (multiples of 8, as cuDNN needs).
struct Windows {
  int64_t wq, cq, wk, ck, wv, cv, wdv, cdv;
};
Windows windows_of(const Case& c) {
  if (!c.windows) return {c.dqk, 0, c.dqk, 0, c.dv, 0, c.dv, 0};
  return {c.dqk + 8, 8, c.dqk + 64, 64, c.dv + 128, 128, c.dv + 136, 136};
}

// Device operands of one case: the forward already run (it is never chunked).
struct Operands {
  Case c;
  HeadView q, k, v;
  Tensor o, lse, dO;
  Tensor dv_before;  // host (B, T, H, wdv): what grad_v_into's base holds before each call
};

Operands make_operands(Context& gpu, const Case& c, uint64_t seed) {
  const Windows w = windows_of(c);
  Operands x{.c = c};
  const Tensor q = random_tensor({c.B, c.T, c.H, c.dqk}, DType::kBF16, seed);
  const Tensor k = random_tensor({c.B, c.T, c.H, c.dqk}, DType::kBF16, seed + 1);
  const Tensor v = random_tensor({c.B, c.T, c.H, c.dv}, DType::kBF16, seed + 2);
  x.q = HeadView(test::widen(q, w.wq, w.cq, seed + 3).to(gpu, Device::kCuda), w.cq, c.dqk);
  x.k = HeadView(test::widen(k, w.wk, w.ck, seed + 4).to(gpu, Device::kCuda), w.ck, c.dqk);
  x.v = HeadView(test::widen(v, w.wv, w.cv, seed + 5).to(gpu, Device::kCuda), w.cv, c.dv);
  x.dO = random_tensor({c.B, c.T, c.H, c.dv}, DType::kBF16, seed + 6).to(gpu, Device::kCuda);
  if (c.windows) x.dv_before = random_tensor({c.B, c.T, c.H, w.wdv}, DType::kBF16, seed + 7);
  const auto f = attention_forward(gpu, {.q = x.q, .k = x.k, .v = x.v});
  x.o = f.o;
  x.lse = f.lse;
  return x;
}

// Host gradients of one backward call; dv is grad_v_into's whole base when the case has windows.
struct Grads {
  Tensor dq, dk, dv;
};

// The backward's arguments: dv into columns of dv_base when the case has windows.
AttentionBackwardArgs backward_args(const Operands& x, int64_t cap, const Tensor& dv_base,
                                    bool deterministic = true) {
  return {.q = x.q,
          .k = x.k,
          .v = x.v,
          .o = x.o,
          .lse = x.lse,
          .grad_o = x.dO,
          .deterministic = deterministic,
          .grad_v_into = x.c.windows ? HeadView(dv_base, windows_of(x.c).cdv, x.c.dv) : HeadView(),
          .max_workspace_bytes = cap};
}

Grads run_backward(Context& gpu, const Operands& x, int64_t cap, bool deterministic = true) {
  Tensor dv_base;
  if (x.c.windows) dv_base = x.dv_before.to(gpu, Device::kCuda);
  const auto g = attention_backward(gpu, backward_args(x, cap, dv_base, deterministic));
  return {g.grad_q.to_host(gpu), g.grad_k.to_host(gpu),
          x.c.windows ? dv_base.to_host(gpu) : g.grad_v.to_host(gpu)};
}

void expect_bitwise(const Grads& want, const Grads& got, const std::string& where) {
  EXPECT_TRUE(bitwise_equal(want.dq, got.dq)) << where << ": dq";
  EXPECT_TRUE(bitwise_equal(want.dk, got.dk)) << where << ": dk";
  EXPECT_TRUE(bitwise_equal(want.dv, got.dv)) << where << ": dv";
}

// The deterministic backward's chunking at a cap, as attention_workspace reports it.
AttentionWorkspace workspace_at(Context& gpu, const Case& c, int64_t cap) {
  return attention_workspace(gpu, c.B, c.T, c.H, c.dqk, c.dv, 0.0f, cap);
}

// Bitwise against the unchunked call at the finest split (cap 1 byte: one (b, h) per chunk) and at
// a cap between, chosen from the whole call's workspace so that the rule picks `mid_chunks`.
void expect_chunks_match_whole(Context& gpu, const Case& c, int64_t mid_num, int64_t mid_den,
                               int64_t mid_chunks, uint64_t seed) {
  const std::string where = c.name();
  const Operands x = make_operands(gpu, c, seed);
  const AttentionWorkspace whole = workspace_at(gpu, c, kWhole);
  ASSERT_EQ(whole.backward_chunks, 1) << where;
  ASSERT_GT(whole.backward_bytes, 0) << where << ": cuDNN's backward takes no workspace";
  const Grads want = run_backward(gpu, x, kWhole);
  if (c.windows)
    EXPECT_TRUE(test::same_outside(x.dv_before, want.dv, windows_of(c).cdv, c.dv))
        << where << ": dv's neighbours";

  const AttentionWorkspace finest = workspace_at(gpu, c, 1);
  EXPECT_EQ(finest.backward_chunks, c.B * c.H) << where << ": cap 1 byte";
  expect_bitwise(want, run_backward(gpu, x, 1), where + ", one (b, h) per chunk");

  const int64_t cap = whole.backward_bytes / mid_den * mid_num;
  const AttentionWorkspace mid = workspace_at(gpu, c, cap);
  std::printf(
      "[ measured ] %s: whole backward workspace %.3f MiB; cap %.3f MiB -> %lld chunks of "
      "%.3f MiB; finest %lld chunks of %.3f MiB\n",
      where.c_str(), whole.backward_bytes / 1048576.0, cap / 1048576.0,
      static_cast<long long>(mid.backward_chunks), mid.backward_bytes / 1048576.0,
      static_cast<long long>(finest.backward_chunks), finest.backward_bytes / 1048576.0);
  EXPECT_EQ(mid.backward_chunks, mid_chunks) << where << ": cap " << cap;
  EXPECT_LE(mid.backward_bytes, cap) << where;
  expect_bitwise(want, run_backward(gpu, x, cap),
                 where + ", " + std::to_string(mid_chunks) + " chunks");
}

TEST(AttentionChunkGpu, BatchChunksMatchWholeBitwise) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  // 5/8 of the whole: two chunks of 2 sequences (a quarter of the workspace each is not needed).
  expect_chunks_match_whole(gpu, {.B = 4, .T = 130, .H = 3, .dqk = 96, .dv = 64}, 5, 8, 2, 11);
}

TEST(AttentionChunkGpu, HeadChunksOfOneSequenceMatchWholeBitwise) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  // DeepSeek-V3's B = 1 and head dims: 5/16 of the whole gives 4 chunks of 2 heads.
  expect_chunks_match_whole(gpu, {.B = 1, .T = 257, .H = 8, .dqk = 192, .dv = 128}, 5, 16, 4, 21);
}

TEST(AttentionChunkGpu, WindowsAndDvIntoAWindowMatchWholeBitwise) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  // MLA: q, k, v windows, dv written into a window. 5/16: 2 chunks of one sequence (1/2 each) do
  // not fit, so each sequence splits into 2 chunks of 2 heads (4 in all).
  expect_chunks_match_whole(gpu, {.B = 2, .T = 97, .H = 4, .dqk = 192, .dv = 128, .windows = true},
                            5, 16, 4, 31);
}

// The atomics backward runs the same chunks; its dQ sums in another order, so the comparison with
// the deterministic whole call is close rather than bitwise.
TEST(AttentionChunkGpu, AtomicsBackwardChunks) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  const Case c{.B = 2, .T = 130, .H = 4, .dqk = 192, .dv = 128, .windows = true};
  const Operands x = make_operands(gpu, c, 41);
  const Grads want = run_backward(gpu, x, kWhole);
  const Grads got = run_backward(gpu, x, 1, /*deterministic=*/false);
  auto rel = [](const Tensor& a, const Tensor& b) {
    double e2 = 0, r2 = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double w = bf16_to_float(a.data_as<const uint16_t>()[i]);
      const double g = bf16_to_float(b.data_as<const uint16_t>()[i]);
      if (!std::isfinite(g)) return std::numeric_limits<double>::infinity();
      e2 += (g - w) * (g - w), r2 += w * w;
    }
    return std::sqrt(e2 / std::max(r2, 1e-30));
  };
  const double eq = rel(want.dq, got.dq), ek = rel(want.dk, got.dk), ev = rel(want.dv, got.dv);
  std::printf(
      "[ measured ] atomics at cap 1 byte vs deterministic whole: rel Frobenius dq %.2e, "
      "dk %.2e, dv %.2e\n",
      eq, ek, ev);
#if OCTET_WITH_CUDNN
  // The split really happened: the cache holds the atomics pass's graph of one (b, h), unless the
  // whole call's workspace already fits in 1 byte. Key: (pass, B, T, H, ...), the atomics pass 2.
  int64_t whole_ws = -1;
  bool finest = false;
  for (const auto& [key, graph] : attention_state(gpu).graphs) {
    if (std::get<0>(key) != 2 || std::get<2>(key) != c.T) continue;
    if (std::get<1>(key) == c.B && std::get<3>(key) == c.H) whole_ws = graph->workspace_bytes;
    if (std::get<1>(key) == 1 && std::get<3>(key) == 1) finest = true;
  }
  ASSERT_GE(whole_ws, 0) << "the atomics backward's graph is not in the cache";
  std::printf("[ measured ] atomics backward workspace, whole call: %lld bytes\n",
              static_cast<long long>(whole_ws));
  EXPECT_TRUE(whole_ws <= 1 || finest) << "the atomics backward did not run one (b, h) per chunk";
#endif
  EXPECT_LE(eq, 1e-2);
  EXPECT_LE(ek, 1e-2);
  EXPECT_LE(ev, 1e-2);
}

#if OCTET_WITH_CUDA
// The call allocates its outputs and one chunk's workspace, not the whole call's (and not one per
// chunk that stays alive): the stream-ordered pool's high-water mark over the call says so.
TEST(AttentionChunkGpu, TakesOneChunksWorkspace) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  const Case c{.B = 2, .T = 2048, .H = 8, .dqk = 96, .dv = 64};
  const Operands x = make_operands(gpu, c, 51);
  const AttentionWorkspace whole = workspace_at(gpu, c, kWhole);
  const int64_t cap = whole.backward_bytes / 4 + whole.backward_bytes / 16;
  const AttentionWorkspace ws = workspace_at(gpu, c, cap);
  run_backward(gpu, x, cap);  // builds what the call needs, outside the measurement
  gpu.synchronize();
  cudaMemPool_t pool;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, gpu.device_index), cudaSuccess);
  uint64_t used0 = 0, zero = 0, high = 0;
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used0), cudaSuccess);
  ASSERT_EQ(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero), cudaSuccess);
  run_backward(gpu, x, cap);  // the gradients are freed once copied to the host
  ASSERT_EQ(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high), cudaSuccess);
  const int64_t outputs = 2 * x.q.base.nbytes() + x.o.nbytes();  // dq, dk, dv
  const int64_t allocated = static_cast<int64_t>(high) - static_cast<int64_t>(used0);
  std::printf(
      "[ measured ] %s: whole workspace %.1f MiB; cap %.1f MiB -> %lld chunks of %.1f MiB; "
      "the call allocated %.1f MiB (outputs %.1f MiB)\n",
      c.name().c_str(), whole.backward_bytes / 1048576.0, cap / 1048576.0,
      static_cast<long long>(ws.backward_chunks), ws.backward_bytes / 1048576.0,
      allocated / 1048576.0, outputs / 1048576.0);
  EXPECT_EQ(ws.backward_chunks, 4);
  EXPECT_LE(allocated, outputs + ws.backward_bytes + (2 << 20));
}
#endif

// A chunked backward enqueues without waiting for the host or allocating outside the stream-ordered
// pool: it captures into a CUDA graph (after one eager call builds its cuDNN graphs) and the replay
// gives the eager call's bits.
TEST(AttentionChunkGpu, ChunkedBackwardCapturesAndReplaysBitwise) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  const Case c{.B = 2, .T = 97, .H = 4, .dqk = 192, .dv = 128, .windows = true};
  const Operands x = make_operands(gpu, c, 61);
  const Grads eager = run_backward(gpu, x, 1);
  Tensor dq = Tensor::empty(gpu, {c.B, c.T, c.H, c.dqk}, DType::kBF16);
  Tensor dk = Tensor::empty(gpu, {c.B, c.T, c.H, c.dqk}, DType::kBF16);
  Tensor dv_base = x.dv_before.to(gpu, Device::kCuda);
  gpu.synchronize();
  CudaGraph graph;
  graph.capture(gpu, "a chunked attention backward", [&] {
    const auto g = attention_backward(gpu, backward_args(x, 1, dv_base));
    gpu.be().copy(dq.data(), g.grad_q.data(), dq.nbytes(), CopyKind::kDeviceToDevice);
    gpu.be().copy(dk.data(), g.grad_k.data(), dk.nbytes(), CopyKind::kDeviceToDevice);
  });
  ASSERT_TRUE(graph.captured());
  gpu.be().memset(dq.data(), 0xFF, dq.nbytes());
  gpu.be().memset(dk.data(), 0xFF, dk.nbytes());
  graph.replay(gpu);
  gpu.synchronize();
  expect_bitwise(eager, {dq.to_host(gpu), dk.to_host(gpu), dv_base.to_host(gpu)},
                 "replayed chunked backward");
}

}  // namespace
}  // namespace octet
