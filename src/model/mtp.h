// Multi-Token Prediction module of DeepSeek-V3 (report section 2.2), one per depth k = 1..K:
//
//   x_k = eh_proj([enorm(Emb(t_{i+k})) ; hnorm(h_{k-1})])      (rows, 2D) -> (rows, D), BF16 GEMM
//   h_k = DecoderLayer(x_k)                                     a full (MoE) layer, FP8 GEMMs
//   loss_k = CE(shared_head(h_k), t_{i+k+1})                   shared output projection, own norm
//
// h_0 is the main model's last hidden state (before the final norm). The concatenation order,
// embedding first, is the one DeepSeek-V3's released weights are used with (its inference code,
// vLLM and SGLang); the report writes the two halves the other way round. The embedding and the
// output projection are the main model's (shared); only the norms, eh_proj and the layer are the
// module's own.
#pragma once

#include "model/block.h"
#include "model/head.h"

namespace octet {

struct MtpModule {
  NormLayer enorm, hnorm;
  LinearLayer eh_proj;  // (D, 2D)
  DecoderLayer layer;
  OutputHead head;  // shared_head: its own norm, the shared projection

  struct Saved {
    NormLayer::Saved e, h;
    LinearSaved eh;
    DecoderLayer::Saved layer;
  };

  // emb (rows, D): Emb of the tokens k ahead; h_prev (rows, D) -> h_k (rows, D).
  Tensor forward(Context& ctx, const Precision& p, const RopeTable& rope, const Tensor& emb,
                 const Tensor& h_prev, int64_t B, int64_t T, Saved& s);
  struct Grads {
    Tensor d_emb, d_h_prev;
  };
  Grads backward(Context& ctx, const Precision& p, const RopeTable& rope, const Tensor& dh,
                 const Saved& s);
};

}  // namespace octet
