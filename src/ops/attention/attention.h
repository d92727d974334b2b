// Causal multi-head attention core of MLA (DeepSeek-V3): BF16 operands, FP32 softmax and
// accumulation.
//
// Per batch b and head h, with queries i and keys j in 0..T-1, scale = softmax_scale:
//   s_ij = scale * q_i . k_j               for j <= i (causal; j > i is masked out)
//   lse_i = log sum_{j<=i} exp(s_ij)       (natural log, FP32, saved for backward)
//   p_ij = exp(s_ij - lse_i),  o_i = sum_j p_ij v_j
// q and k have head dim Dqk (= qk_nope + qk_rope), v and o have Dv (v_head_dim); they may differ.
// Dqk and Dv must be multiples of 8 in [8, 256] (what cuDNN's fused attention takes on Hopper).
//
// Backward (from grad_o = dO, reading the saved o and lse; P is recomputed, never stored):
//   D_i = dO_i . o_i,  dP_ij = dO_i . v_j,  dS_ij = p_ij (dP_ij - D_i)
//   dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i,  dv_j = sum_i p_ij dO_i
//
// Outputs are freshly allocated (`=`), except grad_v when the call names a destination view for it.
// q, k and v may be column windows of wider tensors (HeadView below: rows lie W elements apart, so
// MLA's v is read straight out of kv); o, grad_o and lse are contiguous. All of q, k, v, o, grad_o
// share one dtype: BF16 (CUDA and CPU) or F32 (CPU only: the FP32 mode of the finite-difference
// checks). Outputs take that dtype; lse is always F32. A view changes where elements live, never
// the arithmetic: results are bitwise those of the same values in compact tensors.
//
// CPU: plain loops in FP64, one score row at a time (the oracle). CUDA: cuDNN's fused flash
// attention (SDPA) through the cuDNN frontend, on this (B, T, H, D) layout by strides; memory
// linear in T; one graph per shape cached in the context; the backward is cuDNN's deterministic
// algorithm unless the call asks otherwise, so results are bitwise reproducible run to run. CUDA
// builds without cuDNN refuse attention on the GPU with one clear error.
//
// Backward workspace bound (CUDA). cuDNN's deterministic backward before 9.25 takes a dP scratch
// of B*H*T^2 BF16 plus B*H*T FP32 row sums (1025 MiB at 8 x 2048 x 16, 4098 MiB at DeepSeek-V3's
// 1 x 4096 x 128), on top of the step's peak. Since every (b, h) is independent, the backward runs
// as n equal chunks, one after the other on the stream, each the same cached cuDNN graph on
// pointer offsets into every operand: the fewest n whose workspace (cuDNN's own figure for the
// chunk's graph) is at most the cap, trying batch chunks first (n dividing B, all heads; the
// layout's strides are unchanged) and then, one sequence per chunk, head chunks (n = B * m with m
// dividing H; cuDNN < 9.26 reads lse only as packed (B, H, T), which a head chunk of one sequence
// is). The cap is kAttentionBackwardWorkspaceCap unless the call gives another; when even one
// (b, h) per chunk exceeds it, that finest split runs. The results are bitwise those of one call
// (each (b, h)'s arithmetic is the same). One workspace of the chunk's size is taken per call and
// reused by every chunk (stream order keeps them apart); a chunk's lse that would start off
// cuDNN's 16-byte alignment (T not a multiple of 4) is first copied to an aligned scratch of one
// chunk's lse. The atomics backward follows the same rule; its workspace (by the frontend's sizing
// an FP32 dQ accumulator, B*H*T*Dqk*4) reaches the cap only at large shapes (DeepSeek-V3's:
// 384 MiB, 2 chunks).
#pragma once

#include <cstdint>
#include <utility>

#include "core/context.h"

namespace octet {

// The default bound on one cuDNN backward call's workspace: 512 MiB of dP scratch plus 8 MiB for
// cuDNN's FP32 row sums (2/T of the dP part) and alignment, so that half of the baseline's
// 8 x 2048 x 16 (512.25 MiB) is one chunk rather than a quarter (DeepSeek-V3's 1 x 4096 x 128: 8
// chunks of 16 heads). Fewer chunks leave fewer tails of unequal causal key blocks: the baseline's
// deepseek trainer runs 1.7% faster with 2 chunks than with 4, and its peak does not move, being
// elsewhere in the step since the MoE layer keeps x's token rows (docs/benchmarks.md, tenth
// session); one call (1 GiB) would raise it.
constexpr int64_t kAttentionBackwardWorkspaceCap = int64_t{520} << 20;

// A (B, T, H, D) attention operand that may be a column window of a wider tensor: element
// (b, t, h, d) is base[b, t, h, col + d] for d < D, where base is contiguous (B, T, H, W) and
// col + D <= W, so consecutive (b, t, h) rows lie W elements apart. A Tensor converts to the whole
// of itself (col 0, D = W). On CUDA, col and W must be multiples of 8 (cuDNN reads rows in 16-byte
// chunks). Example: MLA's v is HeadView(kv viewed (B, T, H, Dn + Dv), Dn, Dv).
struct HeadView {
  Tensor base;
  int64_t col = 0;
  int64_t width = -1;  // D; -1: all of base's last dimension from col on

  HeadView() = default;
  HeadView(Tensor t) : base(std::move(t)) {}  // implicit on purpose: the whole tensor
  HeadView(Tensor t, int64_t first_col, int64_t cols)
      : base(std::move(t)), col(first_col), width(cols) {}

  bool given() const { return base.rank() > 0; }  // false for a default-constructed view
  int64_t row_stride() const { return base.rank() > 0 ? base.size(base.rank() - 1) : 0; }  // W
  int64_t head_dim() const { return width >= 0 ? width : row_stride() - col; }             // D
  bool compact() const { return col == 0 && head_dim() == row_stride(); }
  // The first element, (0, 0, 0, 0); null for an empty base.
  void* data() const {
    if (base.data() == nullptr) return nullptr;
    return static_cast<char*>(base.data()) + col * static_cast<int64_t>(dtype_size(base.dtype()));
  }
};

struct AttentionForwardArgs {
  HeadView q;                  // (B, T, H, Dqk) bf16 | f32 (CPU)
  HeadView k;                  // (B, T, H, Dqk) same dtype
  HeadView v;                  // (B, T, H, Dv) same dtype
  float softmax_scale = 0.0f;  // multiplies q.k; 0 selects 1/sqrt(Dqk); else finite and > 0
};

struct AttentionForwardResult {
  Tensor o;    // (B, T, H, Dv) dtype of q
  Tensor lse;  // (B, H, T) f32, natural log: saved for backward
};

// o = softmax(scale q k^T, causal) v; lse as above.
AttentionForwardResult attention_forward(Context& ctx, const AttentionForwardArgs& args);

struct AttentionBackwardArgs {
  HeadView q;                  // (B, T, H, Dqk) as in forward
  HeadView k;                  // (B, T, H, Dqk)
  HeadView v;                  // (B, T, H, Dv)
  Tensor o;                    // (B, T, H, Dv) the forward's output
  Tensor lse;                  // (B, H, T) f32, the forward's lse
  Tensor grad_o;               // (B, T, H, Dv) dL/do
  float softmax_scale = 0.0f;  // the forward's
  // CUDA: true runs cuDNN's deterministic backward (bitwise reproducible); false the one that
  // sums dQ over key blocks with FP32 atomics (faster; the last bits vary run to run). The CPU
  // oracle is deterministic either way.
  bool deterministic = true;
  // Optional destination of dv, (B, T, H, Dv) in the dtype of q: when given, dv is written (=)
  // into these columns (MLA: the v columns of dkv) and AttentionGrads::grad_v stays empty. It must
  // not overlap any input.
  HeadView grad_v_into;
  // CUDA: the largest workspace one cuDNN backward call may take (the chunking rule above); 0:
  // kAttentionBackwardWorkspaceCap; INT64_MAX: one call, unchunked. Ignored on the CPU.
  int64_t max_workspace_bytes = 0;
};

struct AttentionGrads {
  Tensor grad_q;  // (B, T, H, Dqk) dtype of q
  Tensor grad_k;  // (B, T, H, Dqk)
  Tensor grad_v;  // (B, T, H, Dv); empty when the call gave grad_v_into
};

// dq, dk, dv as above (`=`, not accumulated).
AttentionGrads attention_backward(Context& ctx, const AttentionBackwardArgs& args);

// Throws one clear error when attention with these head dims cannot run on the context's device
// (the head-dim rule above; on CUDA, a build without cuDNN or a cuDNN too old for Dqk != Dv).
// Models call it at construction so that a bad shape fails before the first step.
void attention_check_supported(Context& ctx, int64_t dqk, int64_t dv);

struct AttentionWorkspace {
  int64_t forward_bytes = 0;    // device scratch of one attention_forward call
  int64_t backward_bytes = 0;   // of one (deterministic) attention_backward call: one chunk's
  int64_t backward_chunks = 1;  // the cuDNN calls that backward makes (the chunking rule above)
};

// The device memory an attention call takes besides its outputs, for (B, T, H, Dqk, Dv), the
// softmax scale (0: the default) and the backward's workspace cap (0: the default, as
// AttentionBackwardArgs::max_workspace_bytes): cuDNN's workspace on CUDA, as the calls really take
// it (builds and caches the shape's graphs), 0 on the CPU. For memory estimates and benchmarks.
AttentionWorkspace attention_workspace(Context& ctx, int64_t batch, int64_t seq, int64_t heads,
                                       int64_t dqk, int64_t dv, float softmax_scale = 0.0f,
                                       int64_t max_backward_workspace = 0);

}  // namespace octet
