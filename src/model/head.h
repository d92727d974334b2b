// Output head and loss: final RMSNorm, the output projection (BF16 GEMM, FP32 accumulation) and
// the cross-entropy (FP32 log-softmax), forward and backward in one call so that the logits, the
// largest activation of a small model, exist only inside it. The main head and every MTP depth's
// shared_head run through this.
//
//   loss = mean over targets != ignore of  -log softmax(head(norm(x)))[target]
//   dx   = d loss / dx * dloss      (with a dloss tensor; without one the call is forward only)
//
// Chunked over tokens: the rows of norm(x) go through the projection and the cross-entropy a chunk
// at a time, so the logits exist (in the activation dtype, never in FP32) for one chunk only:
//
//   count            = rows not ignored (all rows; the backward of every chunk divides by it)
//   per chunk c      logits_c = head(xn_c)                      (chunk, V)
//                    losses_c, lse_c = cross_entropy_rows(logits_c)
//                    dlogits_c = CE backward (in place over logits_c), with the global count
//                    dxn_c = dlogits_c W;  dW += dlogits_c^T xn_c     (+=, FP32)
//   loss             = cross_entropy_mean(losses of all rows)
//   dx               = norm backward(dxn)
//
// Every row's statistics, its dlogits and its dxn row are computed exactly as unchunked (bitwise
// on the CPU; on CUDA as long as the GEMM computes a row of the output the same way at both row
// counts), and the mean sums the same row losses in the same order (bitwise). Only dW's FP32 sum
// over tokens changes order: one += per chunk instead of one GEMM over all tokens
// (tests/model/head_chunk_test.cpp states the tolerance).
//
// chunk_tokens: the rows per chunk; 0 picks them so that one chunk's logits take at most
// kAutoChunkBytes (a multiple of 128 rows, so FP8 heads keep their 16-row rule on CUDA). A head in
// fp8-tensor delayed scaling runs unchunked (each chunk would record an amax of its own).
#pragma once

#include "model/parameter.h"

namespace octet {

struct OutputHead {
  NormLayer norm;
  LinearLayer* head = nullptr;  // shared: lm_head (or the embedding when tied)
  int64_t chunk_tokens = 0;     // rows per chunk; 0: automatic (see above)

  static constexpr int64_t kAutoChunkBytes = int64_t{256} << 20;

  struct Result {
    Tensor loss;   // (1) f32 on the device: the mean cross-entropy
    Tensor count;  // (1) i32: targets counted
    Tensor dx;     // (rows, D) gradient for the input; undefined without dloss
  };
  // x (rows, D), targets (rows) i32, dloss (1) f32 (or null: forward only), all on the device.
  Result run(Context& ctx, const Precision& p, const Tensor& x, const Tensor& targets,
             const Tensor* dloss) const;

  // The rows per chunk this head uses for `rows` rows of logits over `vocab` (at most rows).
  int64_t chunk_rows(const Precision& p, int64_t rows, int64_t vocab) const;
};

}  // namespace octet
