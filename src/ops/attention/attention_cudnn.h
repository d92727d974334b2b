// Internal (builds with cuDNN only): the context's cuDNN state for attention. AttentionState
// (declared in core/context.h) owns the cuDNN handle and the graph cache: one built cuDNN frontend
// graph per pass and shape, made on first use (attention_cudnn.cpp).
#pragma once

#include <array>
#include <map>
#include <memory>
#include <tuple>

#include "core/context.h"

struct cudnnContext;  // cudnnHandle_t is cudnnContext*
namespace cudnn_frontend::graph {
class Graph;
}

namespace octet {

struct AttentionGraph {
  std::shared_ptr<cudnn_frontend::graph::Graph> graph;  // validated, planned, built
  int64_t workspace_bytes = 0;
};

struct AttentionState {
  // pass, B, T, H, Dqk, Dv, the bits of the softmax scale, the row strides of q, k, v and dv
  // (0 in the forward) and the H of the strides (AttentionShape::row_heads, 0 unless a chunk)
  using Key =
      std::tuple<int, int64_t, int64_t, int64_t, int, int, uint32_t, std::array<int64_t, 5>>;

  cudnnContext* handle = nullptr;
  std::map<Key, std::unique_ptr<AttentionGraph>> graphs;

  AttentionState() = default;
  AttentionState(const AttentionState&) = delete;
  AttentionState& operator=(const AttentionState&) = delete;
  ~AttentionState();
};

// The context's AttentionState, made on first use (creates the cuDNN handle).
AttentionState& attention_state(Context& ctx);

}  // namespace octet
