// Expert parallelism of the MoE layer (moe.h): the routed experts sharded over the ranks of an EP
// group, the tokens moved to the experts' owners and back by all-to-all-v (dist/comm.h).
//
// Ownership. With E routed experts and an EP group of W ranks (E % W == 0), EP rank r holds experts
// [r E/W, (r+1) E/W): its GroupedLinear parameters are (E/W, Out, In), contiguous slices of the
// single-rank stacked weights. The router, the shared experts, attention and every dense layer are
// replicated; each rank routes its own tokens over all E experts.
//
// One MoE layer, forward (per rank, its T tokens, k choices each):
//   1. map   = permute map of the T x k choices by global expert, no padding (moe_permute_map):
//              rows of expert 0, 1, ..., so the rows for EP rank p are one contiguous run.
//   2. counts: all_gather over EP of the (E) per-expert counts, read once to the host: every rank
//              then knows how many rows it sends to and receives from each peer. This is the one
//              device-to-host read per MoE layer and pass that EP costs (Comm::all_to_all_v takes
//              host counts); a single-rank run keeps its synchronisation-free path.
//   3. dispatch: ONE all_to_all_v of the payload rows, FP8 when the recipe's moe_dispatch is fp8
//              (quantized once before the dispatch, 1x128 power-of-2 scales), plus ONE of their
//              1x128 scales (FP32, D/128 per row); BF16 rows for the bf16 recipe.
//   4. local: the received rows (source-rank order, within a source by local expert) are permuted
//              into the local experts' grouped layout (expert-major, sources in rank order; padded
//              to 128 per expert for FP8 Wgrad) by a second permute map with k = 1, and run through
//              the local grouped GEMMs (gate_up, SwiGLU, down) as on one rank.
//   5. combine: the expert outputs go back to received order (an exact copy) and ONE all_to_all_v
//              in BF16 returns them to their source, in the source's map layout; the source
//              applies the routing weights (moe_combine) exactly as one rank does.
// Backward mirrors it: the combine's backward at the source (d_expert_out = w * dy, BF16, and the
// routing weights' gradient), sent to the owners (BF16; fp8-flow: dy quantized once and sent in FP8
// with its scales), the local experts' backward, dX returned in BF16 and summed over the k choices
// at the source (moe_permute_backward). fp8-flow also moves the (R) FP32 routing weight of each
// row (forward) and its gradient (backward), 4 bytes per row.
//
// Numerics against one rank on the same tokens: every row is computed alone in the forward, the
// Dgrad and the combine, so losses and activations are bit for bit; the experts' Wgrad sums an
// expert's rows from all sources in one GEMM (one FP32 accumulation over K) where one rank with
// gradient accumulation adds micro-batch by micro-batch, so the expert gradients differ in the last
// bits (tests/train/expert_parallel_test.cpp states the tolerance).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dist/comm.h"
#include "ops/moe_permute/moe_permute.h"

namespace octet {

// What one MoE layer's EP exchange needs again in its backward (MoeLayer::Saved::ep).
struct EpRoute {
  std::vector<int64_t> send_rows, recv_rows;  // per EP rank: rows to / from it
  std::vector<int64_t> send_at, recv_at;      // per EP rank: first row (displacement)
  int64_t received = 0;                       // rows received in all
  PermuteMap local;  // received rows (k = 1) -> the local experts' grouped layout
};

// The routed experts EP rank `rank` of `size` holds: [first, first + count).
struct ExpertSlice {
  int64_t first = 0, count = 0;
};
// Checks E % size == 0 (a clear error naming both) and returns rank's slice.
ExpertSlice expert_slice(int64_t num_experts, int rank, int size);

// Steps 1-2 above: the counts exchanged over `ep` (one device-to-host read) and the local map.
// `map` is the source map (by global expert, no padding); `pad` pads the local layout to 128.
EpRoute ep_plan(Context& ctx, Comm& ep, const PermuteMap& map, bool pad);

// Moves `rows` (rows x cols, any dtype) to the experts' owners (forward: send_rows out,
// recv_rows in) or back to their sources (!forward). One all_to_all_v.
Tensor ep_exchange(Context& ctx, Comm& ep, const EpRoute& r, const Tensor& rows, bool forward);
// The FP8 payload and its 1x128 scales: two all_to_all_v (payload, scales). The result's amax is
// this rank's (not used by the current-scaling recipes that EP allows).
QuantTensor ep_exchange(Context& ctx, Comm& ep, const EpRoute& r, const QuantTensor& rows,
                        bool forward);

}  // namespace octet
