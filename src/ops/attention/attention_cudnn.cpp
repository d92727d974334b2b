// The CUDA side of attention.h: cuDNN's fused flash attention (SDPA) through the cuDNN frontend's
// graph API, on octet's own (B, T, H, D) layout described by strides, so nothing is transposed.
//
// One forward and one backward graph per shape (B, T, H, Dqk, Dv, softmax scale, the operands' row
// strides), built on first
// use and cached in the context's AttentionState (as ops/gemm caches its cuBLASLt plans). A graph's
// workspace comes from the stream-ordered pool for the call; execution enqueues on the context's
// stream and never waits for the host, so it can be captured in a CUDA graph.
//
// The forward asks cuDNN for its softmax statistics ("Stats": max + log(sum exp), natural log,
// FP32, (B, H, T, 1)), which is exactly attention.h's lse; the backward reads them back. The
// backward runs cuDNN's deterministic algorithm by default (no floating-point atomics across key
// blocks), so two runs give bitwise-identical gradients; `deterministic = false` selects the one
// that accumulates dQ with FP32 atomics (faster, bits vary run to run). Each is its own graph.
#include <cudnn.h>

#include <cstring>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>

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
std::vector<int64_t> bhsd_strides(const AttentionShape& s, int64_t ld) {
  return {s.seq * s.heads * ld, ld, s.heads * ld, 1};
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

// The softmax statistics: (B, H, T, 1) f32, i.e. attention.h's (B, H, T) lse.
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
  const AttentionState::Key key{static_cast<int>(pass),
                                s.batch,
                                s.seq,
                                s.heads,
                                s.dqk,
                                s.dv,
                                scale_bits,
                                {s.ld_q, s.ld_k, s.ld_v, pass == Pass::kForward ? 0 : s.ld_dv}};
  auto it = st.graphs.find(key);
  if (it == st.graphs.end()) it = st.graphs.emplace(key, build_graph(st.handle, pass, s)).first;
  return *it->second;
}

void execute(Context& ctx, AttentionGraph& plan, std::unordered_map<int64_t, void*>& pack,
             const AttentionShape& s, const char* what) {
  AttentionState& st = attention_state(ctx);
  check_cudnn(cudnnSetStream(st.handle, static_cast<cudaStream_t>(ctx.stream)), "cudnnSetStream");
  // From the stream-ordered pool: freed after the work that uses it, without a synchronisation.
  Tensor workspace;
  if (plan.workspace_bytes > 0) workspace = Tensor::empty(ctx, {plan.workspace_bytes}, DType::kU8);
  check_fe(plan.graph->execute(st.handle, pack, workspace.numel() ? workspace.data() : nullptr),
           what, s);
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

AttentionWorkspace attention_workspace(Context& ctx, const AttentionShape& s) {
  AttentionWorkspace ws;
  ws.forward_bytes = graph_for(ctx, Pass::kForward, s).workspace_bytes;
  if (s.seq > 1) ws.backward_bytes = graph_for(ctx, Pass::kBackward, s).workspace_bytes;
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
  execute(ctx, plan, pack, s, "the forward");
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
  AttentionGraph& plan =
      graph_for(ctx, args.deterministic ? Pass::kBackward : Pass::kBackwardAtomics, s);
  void* grad_v = args.grad_v_into.given() ? args.grad_v_into.data() : out.grad_v.data();
  std::unordered_map<int64_t, void*> pack{{kQ, args.q.data()},
                                          {kK, args.k.data()},
                                          {kV, args.v.data()},
                                          {kO, const_cast<void*>(args.o.data())},
                                          {kDO, const_cast<void*>(args.grad_o.data())},
                                          {kStats, const_cast<void*>(args.lse.data())},
                                          {kDQ, out.grad_q.data()},
                                          {kDK, out.grad_k.data()},
                                          {kDV, grad_v}};
  execute(ctx, plan, pack, s, "the backward");
}

}  // namespace cuda
}  // namespace octet
