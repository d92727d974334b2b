// What a decoder layer keeps from its forward for its backward, in bytes: every tensor of its
// Saved structs (model/block.h and below), each buffer counted once (saved tensors share storage:
// a Linear keeps the very tensor the attention keeps, a norm the residual stream). Tensors without
// storage (released row-wise copies that keep only a shape) count nothing. Runs on any device: it
// reads sizes only.
//
// docs/model.md (Memory) has the table per layer at the baseline shape. Call it after a
// forward, before the backward releases the Saved.
#pragma once

#include <cstdint>

#include "model/block.h"

namespace octet {

struct SavedBytes {
  int64_t attention = 0;  // MLA: its Linears' inputs, norms, q/k/v/o and lse
  int64_t norms = 0;      // the layer's input and post-attention norms (the residual stream)
  int64_t mlp = 0;        // dense MLP or MoE (router, dispatch map, experts, shared experts)
  int64_t total() const { return attention + norms + mlp; }
};

SavedBytes saved_bytes(const DecoderLayer::Saved& s);

}  // namespace octet
