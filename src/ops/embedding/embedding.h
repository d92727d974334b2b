// Token embedding: a gather of rows of a (V, D) table by int32 token ids, and its backward, the
// scatter-add of the output gradient into the table's FP32 gradient.
//
//   out[t, :]     = table[ids[t], :]                   converted to out's dtype (=)
//   dtable[v, :] += S_v,   S_v = sum of dout[t, :] over the positions t with ids[t] == v
//
// S_v is summed in FP32 starting from 0, over t in increasing order, and added to dtable once;
// every backend follows that order exactly, so CPU and CUDA agree bit for bit and the CUDA backward
// is deterministic (it sorts positions by id with a stable radix sort, then reduces each run in
// order; no atomics). Rows of dtable whose id does not occur are left untouched.
//
// Ids must lie in [0, V). The CPU backend throws, naming the position, for one that does not; the
// CUDA backend cannot throw from the device without a synchronisation, so it writes a row of NaN to
// `out` in the forward (the loss shows it) and skips the id in the backward.
#pragma once

#include "core/context.h"

namespace octet {

struct EmbeddingForwardArgs {
  Tensor ids;    // (rows) i32, any shape with rows elements (e.g. (B, T))
  Tensor table;  // (V, D) f32 (master weights) or bf16
  Tensor out;    // (rows, D) bf16 or f32, any shape whose matrix view is (rows, D): written (=)
};

void embedding_forward(Context& ctx, const EmbeddingForwardArgs& args);

struct EmbeddingBackwardArgs {
  Tensor ids;     // (rows) i32: the forward's ids
  Tensor dout;    // (rows, D) bf16 or f32, matrix view as in the forward
  Tensor dtable;  // (V, D) f32: accumulated (+=)
};

void embedding_backward(Context& ctx, const EmbeddingBackwardArgs& args);

}  // namespace octet
