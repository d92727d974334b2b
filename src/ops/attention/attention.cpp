// Dispatcher for attention.h: validates once, resolves the softmax scale, allocates outputs, routes
// to cpu:: or cuda::.
#include "ops/attention/attention.h"

#include <cmath>
#include <cstdint>

#include "backend/dispatch.h"
#include "ops/attention/attention_backends.h"

// The cuda:: functions exist only in builds with cuDNN; elsewhere dispatch() never calls them.
#if OCTET_WITH_CUDA && OCTET_WITH_CUDNN
#define OCTET_CUDNN_ONLY(call) call
#else
#define OCTET_CUDNN_ONLY(call) (void)0
#endif

namespace octet {
namespace {

// cuDNN's fused attention on Hopper takes head dims that are multiples of 8 up to 256 (cuDNN
// developer guide, "Scaled Dot Product Attention"); the CPU keeps the same rule so that a model
// that trains on one backend trains on the other.
constexpr int kMaxHeadDim = 256;
constexpr int kHeadDimMultiple = 8;

void check_head_dim(int64_t d, const char* tensor, const char* what) {
  OCTET_CHECK(d >= kHeadDimMultiple && d <= kMaxHeadDim && d % kHeadDimMultiple == 0,
              "attention: ", tensor, " has head dim ", what, " = ", d,
              "; head dims must be multiples of ", kHeadDimMultiple, " in [", kHeadDimMultiple,
              ", ", kMaxHeadDim, "]");
}

#if OCTET_WITH_CUDA && !OCTET_WITH_CUDNN
[[noreturn]] void no_cudnn() {
  OCTET_THROW(
      "attention: this octet was built without cuDNN, which runs attention on the GPU "
      "(run scripts/setup.sh, which installs the cuDNN frontend headers, and rebuild)");
}
#endif

// Routes to cpu:: or cuda:: like OCTET_DISPATCH; CUDA attention is cuDNN's.
template <typename Cpu, typename Cuda>
void dispatch(Context& ctx, Cpu&& cpu_fn, [[maybe_unused]] Cuda&& cuda_fn) {
  if (ctx.device == Device::kCpu) return cpu_fn();
#if OCTET_WITH_CUDA && OCTET_WITH_CUDNN
  cuda_fn();
#elif OCTET_WITH_CUDA
  no_cudnn();
#else
  detail::no_cuda("attention");
#endif
}

void check_operand(Context& ctx, const Tensor& t, const char* name, DType dtype, int64_t B,
                   int64_t T, int64_t H, int64_t D) {
  check_device(t, name, ctx.device);
  OCTET_CHECK(t.dtype() == dtype, "attention: ", name, " has dtype ", dtype_name(t.dtype()),
              ", expected ", dtype_name(dtype), " (the dtype of q)");
  const Shape want{B, T, H, D};
  OCTET_CHECK(t.shape() == want, "attention: ", name, " must be (B, T, H, D) = ", shape_str(want),
              ", got ", shape_str(t.shape()));
  if (ctx.device == Device::kCuda && t.numel() > 0)
    OCTET_CHECK(reinterpret_cast<uintptr_t>(t.data()) % 16 == 0, "attention: ", name,
                " must be 16-byte aligned on CUDA (cuDNN reads its rows in 16-byte chunks)");
}

// A HeadView operand: its base is (B, T, H, W) with the window [col, col + D) inside W.
void check_view(Context& ctx, const HeadView& v, const char* name, DType dtype, int64_t B,
                int64_t T, int64_t H, int64_t D) {
  const Tensor& t = v.base;
  OCTET_CHECK(t.rank() == 4, "attention: ", name,
              " must be (B, T, H, D) or a column window of a (B, T, H, W) tensor, got ",
              shape_str(t.shape()));
  const int64_t W = v.row_stride();
  OCTET_CHECK(v.col >= 0 && v.head_dim() == D && v.col + D <= W, "attention: ", name,
              " is columns [", v.col, ", ", v.col + v.head_dim(), ") of a tensor with W = ", W,
              "; expected a window of D = ", D, " columns inside W");
  check_operand(ctx, t, name, dtype, B, T, H, W);
  if (ctx.device == Device::kCuda && !v.compact() && t.numel() > 0)
    OCTET_CHECK(v.col % kHeadDimMultiple == 0 && W % kHeadDimMultiple == 0, "attention: ", name,
                " is columns [", v.col, ", ", v.col + D, ") of rows of W = ", W,
                "; on CUDA a column window needs its first column and W to be multiples of ",
                kHeadDimMultiple, " (cuDNN reads rows in 16-byte chunks)");
}

// The softmax scale a call runs with: the given one, or 1/sqrt(Dqk) for 0.
float resolve_scale(float scale, int64_t dqk) {
  OCTET_CHECK(scale == 0.0f || (std::isfinite(scale) && scale > 0.0f),
              "attention: softmax_scale must be 0 (default 1/sqrt(Dqk)) or finite and > 0, got ",
              scale);
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(dqk)));
}

// Shapes and dtypes of q, k, v (shared by forward and backward).
AttentionShape validate_qkv(Context& ctx, const HeadView& q, const HeadView& k, const HeadView& v,
                            float scale) {
  check_dtype(q.base, "attention q", {DType::kBF16, DType::kF32});
  OCTET_CHECK(q.base.rank() == 4, "attention: q must be (B, T, H, Dqk), got ",
              shape_str(q.base.shape()));
  OCTET_CHECK(v.base.rank() == 4, "attention: v must be (B, T, H, Dv), got ",
              shape_str(v.base.shape()));
  const DType dtype = q.base.dtype();
  if (ctx.device == Device::kCuda)
    OCTET_CHECK(dtype == DType::kBF16,
                "attention: cuDNN's fused attention takes BF16 q, k, v; got ", dtype_name(dtype),
                " (F32 attention runs on the CPU only)");
  AttentionShape s;
  s.batch = q.base.size(0);
  s.seq = q.base.size(1);
  s.heads = q.base.size(2);
  check_head_dim(q.head_dim(), "q", "Dqk");
  check_head_dim(v.head_dim(), "v", "Dv");
  s.dqk = static_cast<int>(q.head_dim());
  s.dv = static_cast<int>(v.head_dim());
  check_view(ctx, q, "q", dtype, s.batch, s.seq, s.heads, s.dqk);
  check_view(ctx, k, "k", dtype, s.batch, s.seq, s.heads, s.dqk);
  check_view(ctx, v, "v", dtype, s.batch, s.seq, s.heads, s.dv);
  OCTET_CHECK(s.seq <= (int64_t{1} << 21) && s.batch * s.heads <= INT32_MAX,
              "attention: T = ", s.seq, " (at most 2^21) or B * H = ", s.batch * s.heads,
              " out of range");
  s.scale = resolve_scale(scale, s.dqk);
  s.ld_q = q.row_stride();
  s.ld_k = k.row_stride();
  s.ld_v = v.row_stride();
  s.ld_dv = s.dv;
  return s;
}

}  // namespace

AttentionForwardResult attention_forward(Context& ctx, const AttentionForwardArgs& args) {
  const AttentionShape s = validate_qkv(ctx, args.q, args.k, args.v, args.softmax_scale);
  AttentionForwardResult out;
  out.o = Tensor::empty(ctx, {s.batch, s.seq, s.heads, s.dv}, args.q.base.dtype());
  out.lse = Tensor::empty(ctx, {s.batch, s.heads, s.seq}, DType::kF32);
  if (out.o.numel() == 0) return out;
  dispatch(
      ctx, [&] { cpu::attention_forward(ctx, args, s, out); },
      [&] { OCTET_CUDNN_ONLY(cuda::attention_forward(ctx, args, s, out)); });
  return out;
}

AttentionGrads attention_backward(Context& ctx, const AttentionBackwardArgs& args) {
  AttentionShape s = validate_qkv(ctx, args.q, args.k, args.v, args.softmax_scale);
  const DType dtype = args.q.base.dtype();
  check_operand(ctx, args.o, "o", dtype, s.batch, s.seq, s.heads, s.dv);
  check_operand(ctx, args.grad_o, "grad_o", dtype, s.batch, s.seq, s.heads, s.dv);
  if (args.grad_v_into.given()) {
    check_view(ctx, args.grad_v_into, "grad_v_into", dtype, s.batch, s.seq, s.heads, s.dv);
    s.ld_dv = args.grad_v_into.row_stride();
  }
  OCTET_CHECK(args.max_workspace_bytes >= 0,
              "attention: max_workspace_bytes must be >= 0 (0: the default cap), got ",
              args.max_workspace_bytes);
  check_dtype(args.lse, "attention lse", {DType::kF32});
  check_device(args.lse, "attention lse", ctx.device);
  const Shape lse_shape{s.batch, s.heads, s.seq};
  OCTET_CHECK(args.lse.shape() == lse_shape,
              "attention: lse must be (B, H, T) = ", shape_str(lse_shape), ", got ",
              shape_str(args.lse.shape()));
  AttentionGrads g;
  g.grad_q = Tensor::empty(ctx, {s.batch, s.seq, s.heads, s.dqk}, dtype);
  g.grad_k = Tensor::empty(ctx, {s.batch, s.seq, s.heads, s.dqk}, dtype);
  if (!args.grad_v_into.given())
    g.grad_v = Tensor::empty(ctx, {s.batch, s.seq, s.heads, s.dv}, dtype);
  if (g.grad_q.numel() == 0) return g;
  dispatch(
      ctx, [&] { cpu::attention_backward(ctx, args, s, g); },
      [&] { OCTET_CUDNN_ONLY(cuda::attention_backward(ctx, args, s, g)); });
  return g;
}

AttentionWorkspace attention_workspace(Context& ctx, int64_t batch, int64_t seq, int64_t heads,
                                       int64_t dqk, int64_t dv, float softmax_scale,
                                       int64_t max_backward_workspace) {
  check_head_dim(dqk, "q", "Dqk");
  check_head_dim(dv, "v", "Dv");
  OCTET_CHECK(batch >= 0 && seq >= 0 && heads >= 0, "attention: negative shape");
  OCTET_CHECK(max_backward_workspace >= 0,
              "attention: max_backward_workspace must be >= 0 (0: the default cap), got ",
              max_backward_workspace);
  [[maybe_unused]] const AttentionShape s{batch,
                                          seq,
                                          heads,
                                          static_cast<int>(dqk),
                                          static_cast<int>(dv),
                                          resolve_scale(softmax_scale, dqk),
                                          dqk,
                                          dqk,
                                          dv,
                                          dv,
                                          0};
  AttentionWorkspace ws;
  if (batch * seq * heads == 0) return ws;
  dispatch(
      ctx, [] {},
      [&] { OCTET_CUDNN_ONLY(ws = cuda::attention_workspace(ctx, s, max_backward_workspace)); });
  return ws;
}

void attention_check_supported(Context& ctx, int64_t dqk, int64_t dv) {
  check_head_dim(dqk, "q", "Dqk");
  check_head_dim(dv, "v", "Dv");
  dispatch(
      ctx, [] {},
      [&] {
        OCTET_CUDNN_ONLY(
            cuda::attention_check_support(static_cast<int>(dqk), static_cast<int>(dv)));
      });
}

}  // namespace octet
