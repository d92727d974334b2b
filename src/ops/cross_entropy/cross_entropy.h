// Fused softmax cross-entropy over a vocabulary, the loss of the output head (and of each MTP
// depth): FP32 math on BF16 or F32 logits, nothing but per-row statistics kept between forward and
// backward.
//
// Forward, per row r with target t = targets[r] (kIgnoreIndex: the row does not count):
//   m[r]      = max_v logits[r, v]                                 (subtracted: stable for any
//   scale) lse[r]    = m[r] + log(sum_v exp(logits[r, v] - m[r]))        saved for backward (=)
//   losses[r] = lse[r] - logits[r, t],  0 for an ignored row      (=)
//   count     = number of rows not ignored                        saved for backward (=)
//   loss      = sum_r losses[r] / count,  0 when count == 0       (=)  (PyTorch's mean reduction)
// Backward, given dloss = d(objective)/d(loss) (1 for the main loss, the MTP weight for an MTP
// depth):
//   dlogits[r, v] = (exp(logits[r, v] - lse[r]) - [v == t]) * dloss / count     (=), in logits'
//   dtype and 0 for ignored rows (and everywhere when count == 0).
// dlogits may be the logits tensor itself (computed in place: each element is read before it is
// written), so the head needs one buffer of logits in all.
//
// Scalars (loss, count, dloss) are device tensors so that a training step never waits for the host.
// Targets must be kIgnoreIndex or in [0, V): the CPU backend throws, naming the row; the CUDA
// backend gives such a row a NaN loss (counted), so the mean loss is NaN.
//
// CPU (FP64 sums) and CUDA (FP32 sums in a fixed tree, deterministic run to run) differ only by
// summation order: see tests/ops/cross_entropy_gpu_test.cpp for the stated tolerances.
#pragma once

#include <cstdint>

#include "core/context.h"

namespace octet {

inline constexpr int32_t kIgnoreIndex = -100;  // PyTorch's CrossEntropyLoss default

struct CrossEntropyForwardArgs {
  Tensor logits;   // (rows, V) bf16 or f32, leading dimensions flattened into rows
  Tensor targets;  // (rows) i32: in [0, V) or kIgnoreIndex
  Tensor losses;   // (rows) f32: written (=)
  Tensor lse;      // (rows) f32: written (=), saved for backward
  Tensor count;    // (1) i32: written (=), saved for backward
  Tensor loss;     // (1) f32: written (=)
};

void cross_entropy_forward(Context& ctx, const CrossEntropyForwardArgs& args);

// The two halves of cross_entropy_forward, for a head that computes its logits a chunk of rows at
// a time (model/head.h): the per-row statistics of some rows, then the mean over all of them.
// cross_entropy_forward is exactly rows + mean, so a chunked head gives the same bits.
struct CrossEntropyRowsArgs {
  Tensor logits;   // (rows, V) bf16 or f32
  Tensor targets;  // (rows) i32
  Tensor losses;   // (rows) f32: written (=)
  Tensor lse;      // (rows) f32: written (=)
};

void cross_entropy_rows(Context& ctx, const CrossEntropyRowsArgs& args);

struct CrossEntropyMeanArgs {
  Tensor losses;   // (rows) f32 from cross_entropy_rows; undefined (Tensor()): count only
  Tensor targets;  // (rows) i32
  Tensor count;    // (1) i32: written (=)
  Tensor loss;     // (1) f32: written (=); undefined when losses is
};

// count = rows not ignored; loss = sum of their losses (FP64) / count, 0 when count == 0. Without
// losses only the count: what the backward of a chunk needs before the last chunk's forward.
void cross_entropy_mean(Context& ctx, const CrossEntropyMeanArgs& args);

struct CrossEntropyBackwardArgs {
  Tensor logits;   // (rows, V) bf16 or f32: the forward's logits
  Tensor targets;  // (rows) i32
  Tensor lse;      // (rows) f32: saved by the forward
  Tensor count;    // (1) i32: saved by the forward
  Tensor dloss;    // (1) f32
  Tensor dlogits;  // (rows, V), logits' dtype: written (=); may be the logits tensor itself
};

void cross_entropy_backward(Context& ctx, const CrossEntropyBackwardArgs& args);

}  // namespace octet
