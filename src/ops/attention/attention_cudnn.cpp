// The CUDA side of attention.h: cuDNN's fused flash attention (SDPA) through the cuDNN frontend's
// graph API, on octet's own (B, T, H, D) layout described by strides, so nothing is transposed.
//
// One forward and one backward graph per shape (B, T, H, Dqk, Dv, softmax scale, the operands' row
// strides), built on first use and cached in the context's AttentionState (as ops/gemm caches its
// cuBLASLt plans). A graph's workspace comes from the stream-ordered pool for the call; execution
// enqueues on the context's stream and never waits for the host, so it can be captured in a CUDA
// graph.
//
// The backward runs in chunks of the batch or of one sequence's heads when the whole call's
// workspace would pass the cap (attention.h's rule): the chunk's graph describes (B/n or 1, H or
// H/m, T, D) operands with the whole tensors' strides, and each chunk executes it on the operands'
// pointers advanced to its first (b, h), with one workspace taken for the call and reused.
//
// The forward asks cuDNN for its softmax statistics ("Stats": max + log(sum exp), natural log,
// FP32, (B, H, T, 1)), which is exactly attention.h's lse; the backward reads them back. The
// backward runs cuDNN's deterministic algorithm by default (no floating-point atomics across key
// blocks), so two runs give bitwise-identical gradients; `deterministic = false` selects the one
// that accumulates dQ with FP32 atomics (faster, bits vary run to run). Each is its own graph.
#include <cudnn.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

// octet has no use for the frontend's JSON serialisation, and it would bring a second copy of
// nlohmann::json next to the one the project uses.
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>

#include "backend/backend.h"
#include "ops/attention/attention_backends.h"
#include "ops/attention/attention_cudnn.h"
#include "ops/layout/layout.h"

namespace octet {

namespace fe = cudnn_frontend;

namespace {

// kBackwardAtomics: the non-deterministic backward (AttentionBackwardArgs::deterministic false).
enum class Pass : uint8_t { kForward, kBackward, kBackwardAtomics };

// Tensor uids of the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

void check_fe(fe::error_t e, const char* what, const AttentionShape& s) {
  if (e.is_good()) return;
  OCTET_THROW("attention (cuDNN ", cudnnGetVersion(), "): ", what, " failed for B=", s.batch,
              " T=", s.seq, " H=", s.heads, " Dqk=", s.dqk, " Dv=", s.dv, ": ", e.get_message());
}

void check_cudnn(cudnnStatus_t st, const char* what) {
  OCTET_CHECK(st == CUDNN_STATUS_SUCCESS, "attention: ", what, ": ", cudnnGetErrorString(st));
}

// (B, T, H, D) row-major with rows ld >= D elements apart (a HeadView's W), seen by cuDNN as
// (b, h, s, d).
std::vector<int64_t> bhsd_dims(const AttentionShape& s, int64_t d) {
  return {s.batch, s.heads, s.seq, d};
}
// H of the whole tensors: a head chunk's strides step over all of them.
int64_t row_heads(const AttentionShape& s) {
  return s.row_heads > 0 ? s.row_heads : s.heads;
}
std::vector<int64_t> bhsd_strides(const AttentionShape& s, int64_t ld) {
  return {s.seq * row_heads(s) * ld, ld, row_heads(s) * ld, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name,
                                                    int64_t uid, const AttentionShape& s, int64_t d,
                                                    int64_t ld) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(bhsd_dims(s, d))
                      .set_stride(bhsd_strides(s, ld)));
}

void set_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid,
                const AttentionShape& s, int64_t d, int64_t ld) {
  t->set_output(true).set_uid(uid).set_dim(bhsd_dims(s, d)).set_stride(bhsd_strides(s, ld));
}

// The softmax statistics: (B, H, T, 1) f32, i.e. attention.h's (B, H, T) lse. Packed (B, H, T, 1),
// as cuDNN < 9.26 reads it only: for a chunk that is the truth, as a batch chunk has all the heads
// and a head chunk one sequence (whose batch stride nothing multiplies).
std::shared_ptr<fe::graph::Tensor_attributes> stats_tensor(fe::graph::Graph& g,
                                                           const AttentionShape& s) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name("stats")
                      .set_uid(kStats)
                      .set_dim({s.batch, s.heads, s.seq, 1})
                      .set_stride({s.heads * s.seq, s.seq, 1, 1})
                      .set_data_type(fe::DataType_t::FLOAT));
}

std::unique_ptr<AttentionGraph> build_graph(cudnnHandle_t handle, Pass pass,
                                            const AttentionShape& s) {
  auto plan = std::make_unique<AttentionGraph>();
  plan->graph = std::make_shared<fe::graph::Graph>();
  fe::graph::Graph& g = *plan->graph;
  g.set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = input(g, "q", kQ, s, s.dqk, s.ld_q);
  auto k = input(g, "k", kK, s, s.dqk, s.ld_k);
  auto v = input(g, "v", kV, s, s.dv, s.ld_v);
  if (pass == Pass::kForward) {
    auto options = fe::graph::SDPA_attributes()
                       .set_name("attention_forward")
                       .set_generate_stats(true)
                       .set_causal_mask(true)
                       .set_attn_scale(s.scale);
    auto [o, stats] = g.sdpa(q, k, v, options);
    set_output(o, kO, s, s.dv, s.dv);
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({s.batch, s.heads, s.seq, 1})
        .set_stride({s.heads * s.seq, s.seq, 1, 1});
  } else {
    auto o = input(g, "o", kO, s, s.dv, s.dv);
    auto dO = input(g, "dO", kDO, s, s.dv, s.dv);
    auto stats = stats_tensor(g, s);
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("attention_backward")
                       .set_causal_mask(true)
                       .set_attn_scale(s.scale)
                       .set_deterministic_algorithm(pass == Pass::kBackward);
    auto [dq, dk, dv] = g.sdpa_backward(q, k, v, o, dO, stats, options);
    set_output(dq, kDQ, s, s.dqk, s.dqk);
    set_output(dk, kDK, s, s.dqk, s.dqk);
    set_output(dv, kDV, s, s.dv, s.ld_dv);
  }
  const char* what =
      pass == Pass::kForward ? "building the forward graph" : "building the backward graph";
  check_fe(g.validate(), what, s);
  check_fe(g.build_operation_graph(handle), what, s);
  check_fe(g.create_execution_plans({fe::HeurMode_t::A}), what, s);
  check_fe(g.check_support(handle), what, s);
  check_fe(g.build_plans(handle), what, s);
  int64_t ws = 0;
  check_fe(g.get_workspace_size(ws), what, s);
  plan->workspace_bytes = ws;
  return plan;
}

AttentionGraph& graph_for(Context& ctx, Pass pass, const AttentionShape& s) {
  AttentionState& st = attention_state(ctx);
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &s.scale, sizeof scale_bits);
  const AttentionState::Key key{
      static_cast<int>(pass),
      s.batch,
      s.seq,
      s.heads,
      s.dqk,
      s.dv,
      scale_bits,
      {s.ld_q, s.ld_k, s.ld_v, pass == Pass::kForward ? 0 : s.ld_dv, s.row_heads}};
  auto it = st.graphs.find(key);
  if (it == st.graphs.end()) it = st.graphs.emplace(key, build_graph(st.handle, pass, s)).first;
  return *it->second;
}

// A graph's workspace from the stream-ordered pool: freed after the work that uses it, without a
// synchronisation.
Tensor workspace_for(Context& ctx, const AttentionGraph& plan) {
  return plan.workspace_bytes > 0 ? Tensor::empty(ctx, {plan.workspace_bytes}, DType::kU8)
                                  : Tensor();
}

void execute(Context& ctx, AttentionGraph& plan, std::unordered_map<int64_t, void*>& pack,
             Tensor& workspace, const AttentionShape& s, const char* what) {
  AttentionState& st = attention_state(ctx);
  check_cudnn(cudnnSetStream(st.handle, static_cast<cudaStream_t>(ctx.stream)), "cudnnSetStream");
  check_fe(plan.graph->execute(st.handle, pack, workspace.numel() ? workspace.data() : nullptr),
           what, s);
}

// How a backward call runs: `count` chunks of `chunk.batch` sequences and `chunk.heads` heads.
struct BackwardChunks {
  AttentionShape chunk;  // the shape one cuDNN call sees (row_heads set when it is a head chunk)
  AttentionGraph* graph = nullptr;
  int64_t count = 1;
};

// attention.h's rule: the fewest equal chunks whose cuDNN workspace is at most the cap; batch
// chunks (n | B) before head chunks of one sequence (n = B * m, m | H). A candidate whose workspace,
// scaled from the whole call's per (b, h), passes the cap is not built; the chosen one's own graph
// confirms it (else the next is tried), and the finest split is taken when none fits.
BackwardChunks backward_chunks(Context& ctx, Pass pass, const AttentionShape& s,
                               int64_t max_workspace) {
  const int64_t cap = max_workspace > 0 ? max_workspace : kAttentionBackwardWorkspaceCap;
  AttentionGraph& whole = graph_for(ctx, pass, s);
  if (whole.workspace_bytes <= cap || s.batch * s.heads == 1) return {s, &whole, 1};
  std::vector<std::pair<int64_t, int64_t>> splits;  // (sequences, heads) per chunk, n increasing
  for (int64_t n = 2; n <= s.batch; ++n)
    if (s.batch % n == 0) splits.emplace_back(s.batch / n, s.heads);
  for (int64_t m = 2; m <= s.heads; ++m)
    if (s.heads % m == 0) splits.emplace_back(1, s.heads / m);
  const double per_pair =
      static_cast<double>(whole.workspace_bytes) / static_cast<double>(s.batch * s.heads);
  for (size_t i = 0; i < splits.size(); ++i) {
    const auto [b, h] = splits[i];
    const bool finest = i + 1 == splits.size();
    if (!finest && per_pair * static_cast<double>(b * h) > static_cast<double>(cap)) continue;
    AttentionShape c = s;
    c.batch = b;
    c.heads = h;
    if (h < s.heads) c.row_heads = s.heads;
    AttentionGraph& g = graph_for(ctx, pass, c);
    if (g.workspace_bytes <= cap || finest) return {c, &g, (s.batch / b) * (s.heads / h)};
  }
  return {s, &whole, 1};  // not reached: the finest split returns
}

}  // namespace

AttentionState::~AttentionState() {
  graphs.clear();
  if (handle) cudnnDestroy(handle);
}

AttentionState& attention_state(Context& ctx) {
  if (!ctx.attention) {
    auto st = std::make_shared<AttentionState>();
    check_cudnn(cudnnCreate(&st->handle), "cudnnCreate");
    ctx.attention = st;
  }
  return *ctx.attention;
}

namespace cuda {

AttentionWorkspace attention_workspace(Context& ctx, const AttentionShape& s,
                                       int64_t max_backward_workspace) {
  AttentionWorkspace ws;
  ws.forward_bytes = graph_for(ctx, Pass::kForward, s).workspace_bytes;
  if (s.seq > 1) {
    const BackwardChunks chunks = backward_chunks(ctx, Pass::kBackward, s, max_backward_workspace);
    ws.backward_bytes = chunks.graph->workspace_bytes;
    ws.backward_chunks = chunks.count;
  }
  return ws;
}

void attention_check_support(int dqk, int dv) {
  const size_t version = cudnnGetVersion();
  // cuDNN's SDPA backward takes Dqk != Dv (MLA) from 9.13 on (cuDNN release notes).
  OCTET_CHECK(dqk == dv || version >= 91300, "attention: Dqk = ", dqk, " != Dv = ", dv,
              " needs cuDNN >= 9.13 for the backward; the loaded libcudnn is ", version);
}

void attention_forward(Context& ctx, const AttentionForwardArgs& args, const AttentionShape& s,
                       AttentionForwardResult& out) {
  AttentionGraph& plan = graph_for(ctx, Pass::kForward, s);
  std::unordered_map<int64_t, void*> pack{{kQ, args.q.data()},
                                          {kK, args.k.data()},
                                          {kV, args.v.data()},
                                          {kO, out.o.data()},
                                          {kStats, out.lse.data()}};
  Tensor workspace = workspace_for(ctx, plan);
  execute(ctx, plan, pack, workspace, s, "the forward");
}

void attention_backward(Context& ctx, const AttentionBackwardArgs& args, const AttentionShape& s,
                        AttentionGrads& out) {
  if (s.seq == 1) {
    // cuDNN refuses s_q = s_kv = 1. With one key the softmax is exactly 1, so o = v, D = dO . o =
    // dO . v = dP and dS = 0: dq = dk = 0 and dv = dO, exactly (the CPU reference's values).
    ctx.be().memset(out.grad_q.data(), 0, out.grad_q.nbytes());
    ctx.be().memset(out.grad_k.data(), 0, out.grad_k.nbytes());
    if (args.grad_v_into.given()) {
      const int64_t rows = s.batch * s.seq * s.heads;
      copy_columns(ctx, {.src = args.grad_o.reshape({rows, s.dv}),
                         .dst = args.grad_v_into.base.reshape({rows, s.ld_dv}),
                         .dst_col = args.grad_v_into.col,
                         .width = s.dv});
    } else {
      ctx.be().copy(out.grad_v.data(), args.grad_o.data(), out.grad_v.nbytes(),
                    CopyKind::kDeviceToDevice);
    }
    return;
  }
  const BackwardChunks chunks =
      backward_chunks(ctx, args.deterministic ? Pass::kBackward : Pass::kBackwardAtomics, s,
                      args.max_workspace_bytes);
  const AttentionShape& c = chunks.chunk;
  void* grad_v = args.grad_v_into.given() ? args.grad_v_into.data() : out.grad_v.data();
  // One workspace for every chunk: they run one after the other on the stream.
  Tensor workspace = workspace_for(ctx, *chunks.graph);
  const int64_t elem = dtype_size(args.q.base.dtype()), lse_elem = dtype_size(DType::kF32);
  // cuDNN assumes 16-byte aligned operands (Tensor_attributes' default alignment). The BF16
  // operands' chunk offsets are multiples of rows of 8 elements; a chunk's lse starts p * T floats
  // in (p = its (b, h) pairs), which when not a multiple of 4 is first copied to a scratch that
  // is aligned (p * T * 4 bytes; stream order keeps the chunks' copies apart).
  const int64_t chunk_lse = c.batch * c.heads * s.seq;
  Tensor lse_scratch;
  if (chunks.count > 1 && chunk_lse % 4 != 0)
    lse_scratch = Tensor::empty(ctx, {chunk_lse}, DType::kF32);
  for (int64_t b0 = 0; b0 < s.batch; b0 += c.batch) {
    for (int64_t h0 = 0; h0 < s.heads; h0 += c.heads) {
      // Element (b0, 0, h0, 0) of a (B, T, H, W) BF16 operand with row stride ld; (b0, h0, 0) of
      // the (B, H, T) FP32 lse.
      auto at = [&](const void* p, int64_t ld) -> void* {
        return const_cast<char*>(static_cast<const char*>(p)) +
               (b0 * s.seq * s.heads + h0) * ld * elem;
      };
      void* lse = const_cast<char*>(static_cast<const char*>(args.lse.data())) +
                  (b0 * s.heads + h0) * s.seq * lse_elem;
      if (reinterpret_cast<uintptr_t>(lse) % 16 != 0) {
        ctx.be().copy(lse_scratch.data(), lse, chunk_lse * lse_elem, CopyKind::kDeviceToDevice);
        lse = lse_scratch.data();
      }
      std::unordered_map<int64_t, void*> pack{
          {kQ, at(args.q.data(), s.ld_q)},     {kK, at(args.k.data(), s.ld_k)},
          {kV, at(args.v.data(), s.ld_v)},     {kO, at(args.o.data(), s.dv)},
          {kDO, at(args.grad_o.data(), s.dv)}, {kStats, lse},
          {kDQ, at(out.grad_q.data(), s.dqk)}, {kDK, at(out.grad_k.data(), s.dqk)},
          {kDV, at(grad_v, s.ld_dv)}};
      execute(ctx, *chunks.graph, pack, workspace, c, "the backward");
    }
  }
}

}  // namespace cuda
}  // namespace octet
