#include "model/describe.h"

#include <cstdio>
#include <sstream>

#include "model/moe_casts.h"

namespace octet {
namespace {

int64_t moe_layers(const ModelConfig& c) {
  return (c.num_hidden_layers - c.first_k_dense_replace) + c.num_nextn_predict_layers;
}
int64_t attention_layers(const ModelConfig& c) {
  return c.num_hidden_layers + c.num_nextn_predict_layers;
}

int64_t attention_params(const ModelConfig& c) {
  const int64_t h = c.num_attention_heads, d = c.hidden_size;
  int64_t q = c.q_lora_rank
                  ? d * *c.q_lora_rank + *c.q_lora_rank + *c.q_lora_rank * h * c.qk_head_dim()
                  : d * h * c.qk_head_dim();
  const int64_t kv = d * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank +
                     c.kv_lora_rank * h * (c.qk_nope_head_dim + c.v_head_dim);
  return q + kv + h * c.v_head_dim * d;
}

// Bytes per element of a GEMM input kept for the backward pass under `g` (FP8: a code and a 4-byte
// scale per 128 elements).
double kept_bytes(const GemmRecipe& g) {
  return g.is_fp8() ? 1.0 + 4.0 / 128.0 : 2.0;
}

double storage_bytes(Storage s) {
  switch (s) {
    case Storage::kBf16:
      return 2.0;
    case Storage::kFp8:
      return 1.0 + 4.0 / 128.0;
    case Storage::kE5M6:
      return 1.5 + 4.0 / 128.0;  // 12 bits packed, as DeepSeek-V3 stores it
  }
  return 2.0;
}

std::string human(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (v >= 1000.0 && i < 5) v /= 1000.0, ++i;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s%s", v, prefixes[i], unit);
  return buf;
}

std::string gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

ParameterCount count_parameters(const ModelConfig& c) {
  ParameterCount p;
  const int64_t d = c.hidden_size, mi = c.moe_intermediate_size;
  const int64_t blocks = attention_layers(c), moe = moe_layers(c);
  p.embedding =
      c.vocab_size * d * (c.tie_word_embeddings ? 1 : 2);  // MTP shares both with the model
  p.attention = attention_params(c) * blocks;
  p.dense_mlp = 3 * d * c.intermediate_size * c.first_k_dense_replace;
  p.routed_experts = 3 * d * mi * c.n_routed_experts * moe;
  p.shared_experts = 3 * d * mi * c.n_shared_experts * moe;
  p.router = (d + 1) * c.n_routed_experts * moe;
  // Two norms per block, the final norm, and per MTP depth enorm, hnorm and shared_head.norm.
  p.norms = 2 * d * blocks + d + 3 * d * c.num_nextn_predict_layers;
  p.mtp_projection = 2 * d * d * c.num_nextn_predict_layers;
  p.total = p.embedding + p.attention + p.dense_mlp + p.routed_experts + p.shared_experts +
            p.router + p.norms + p.mtp_projection;
  p.per_token = p.total - p.routed_experts + 3 * d * mi * c.num_experts_per_tok * moe;
  return p;
}

std::vector<SiteFlops> gemm_flops_per_token(const ModelConfig& c) {
  const double d = static_cast<double>(c.hidden_size),
               h = static_cast<double>(c.num_attention_heads);
  const double qk = static_cast<double>(c.qk_head_dim()), v = static_cast<double>(c.v_head_dim);
  const double kvl = static_cast<double>(c.kv_lora_rank),
               rope = static_cast<double>(c.qk_rope_head_dim);
  const double nope = static_cast<double>(c.qk_nope_head_dim),
               mi = static_cast<double>(c.moe_intermediate_size);
  const double blocks = static_cast<double>(attention_layers(c)),
               moe = static_cast<double>(moe_layers(c));
  const double dense = static_cast<double>(c.first_k_dense_replace),
               k = static_cast<double>(c.num_experts_per_tok);
  const double mtp = static_cast<double>(c.num_nextn_predict_layers);
  const double ql = c.q_lora_rank ? static_cast<double>(*c.q_lora_rank) : 0.0;
  return {
      {GemmSite::kAttnQDown, 2 * blocks * (c.q_lora_rank ? d * ql : d * h * qk)},
      {GemmSite::kAttnQUp, 2 * blocks * ql * h * qk},
      {GemmSite::kAttnKvDown, 2 * blocks * d * (kvl + rope)},
      {GemmSite::kAttnKvUp, 2 * blocks * kvl * h * (nope + v)},
      {GemmSite::kAttnOut, 2 * blocks * h * v * d},
      {GemmSite::kDenseGateUp, 2 * dense * d * 2 * static_cast<double>(c.intermediate_size)},
      {GemmSite::kDenseDown, 2 * dense * static_cast<double>(c.intermediate_size) * d},
      {GemmSite::kExpertGateUp, 2 * moe * k * d * 2 * mi},
      {GemmSite::kExpertDown, 2 * moe * k * mi * d},
      {GemmSite::kSharedGateUp, 2 * moe * static_cast<double>(c.n_shared_experts) * d * 2 * mi},
      {GemmSite::kSharedDown, 2 * moe * static_cast<double>(c.n_shared_experts) * mi * d},
      {GemmSite::kRouter, 2 * moe * d * static_cast<double>(c.n_routed_experts)},
      {GemmSite::kMtpProj, 2 * mtp * 2 * d * d},
      {GemmSite::kHead, 2 * (1 + mtp) * d * static_cast<double>(c.vocab_size)},
  };
}

double fp8_flop_share(const ModelConfig& c, const Recipe& r) {
  double all = 0, fp8 = 0;
  for (const auto& [site, f] : gemm_flops_per_token(c)) {
    all += f;
    if (r.at(site).is_fp8()) fp8 += f;
  }
  return all > 0 ? fp8 / all : 0.0;
}

double attention_flops_per_token(const ModelConfig& c, int64_t seq_len) {
  // QK^T over (qk) and PV over (v) dims, each 2 FLOPs per multiply-add; a causal token sees on
  // average (T + 1) / 2 keys.
  const double keys = (static_cast<double>(seq_len) + 1.0) / 2.0;
  return static_cast<double>(attention_layers(c)) * 2.0 * keys *
         static_cast<double>(c.num_attention_heads) *
         static_cast<double>(c.qk_head_dim() + c.v_head_dim);
}

MemoryEstimate estimate_memory(const ModelConfig& c, const Recipe& r, int64_t tokens) {
  MemoryEstimate m;
  const ParameterCount p = count_parameters(c);
  // FP32 master (4) + FP32 gradient (4) + BF16 first and second moments (2 + 2) for every
  // parameter, plus the copy a GEMM reads: BF16 (2), or FP8 row-wise and column-wise codes (1 + 1).
  m.weight_bytes = 12.0 * static_cast<double>(p.total) + 2.0 * static_cast<double>(p.total);

  const double d = static_cast<double>(c.hidden_size),
               h = static_cast<double>(c.num_attention_heads);
  const double qk = static_cast<double>(c.qk_head_dim()), v = static_cast<double>(c.v_head_dim);
  const double kvl = static_cast<double>(c.kv_lora_rank),
               mi = static_cast<double>(c.moe_intermediate_size);
  const double ql = c.q_lora_rank ? static_cast<double>(*c.q_lora_rank) : 0.0;
  const double k = static_cast<double>(c.num_experts_per_tok);
  auto kb = [&](GemmSite s) { return kept_bytes(r.at(s)); };
  // Per token and block: the two norms' inputs (BF16 residual stream), the attention projections'
  // inputs, q / k / v and the log-sum-exp for the attention backward, and the o_proj input. When
  // qk_nope is a multiple of 8 (MlaLayer::v_in_place), v is read in place in kv, so all of kv stays,
  // and k is rebuilt in backward from kv and kv_a's output (recompute_k) instead of kept.
  const double nope = static_cast<double>(c.qk_nope_head_dim),
               rope = static_cast<double>(c.qk_rope_head_dim);
  const double qkv =
      c.qk_nope_head_dim % 8 == 0 ? h * qk + h * (nope + v) + kvl + rope : 2 * h * qk + h * v;
  double attn = 2 * d * 2 + d * kb(GemmSite::kAttnQDown) + ql * (2 + kb(GemmSite::kAttnQUp)) +
                kvl * (2 + kb(GemmSite::kAttnKvUp)) + qkv * 2 + h * 4 +
                h * v * storage_bytes(r.attn_out_input);
  // Dense MLP: its input, and the SwiGLU input (its output is recomputed from it).
  const double dense = d * kb(GemmSite::kDenseGateUp) +
                       2 * static_cast<double>(c.intermediate_size) * kb(GemmSite::kDenseDown);
  // MoE: router input and scores, the k dispatched rows, the SwiGLU inputs, the shared expert's,
  // and the expert outputs the combine backward needs (fp8-flow: its combine is unweighted, so
  // only each row's FP32 routing weight, which the fused dSwiGLU reads).
  const double shared = static_cast<double>(c.n_shared_experts);
  const double combine_saved = r.fp8_flow ? k * 4 : k * d * 2;
  const double moe = d * 2 + static_cast<double>(c.n_routed_experts) * 4 +
                     k * d * storage_bytes(r.moe_dispatch) +
                     k * 2 * mi * kb(GemmSite::kExpertDown) + d * kb(GemmSite::kSharedGateUp) +
                     shared * 2 * mi * kb(GemmSite::kSharedDown) + combine_saved;
  const double per_token = attn * static_cast<double>(attention_layers(c)) +
                           dense * static_cast<double>(c.first_k_dense_replace) +
                           moe * static_cast<double>(moe_layers(c)) +
                           // final norm input and BF16 logits per head (main and each MTP depth)
                           (1 + static_cast<double>(c.num_nextn_predict_layers)) *
                               (d * 2 + static_cast<double>(c.vocab_size) * 2);
  m.activation_bytes = per_token * static_cast<double>(tokens);
  return m;
}

std::string describe_model(const ModelConfig& c, const Recipe& r, int64_t tokens, int64_t seq_len) {
  std::ostringstream os;
  const ParameterCount p = count_parameters(c);
  os << "parameters: " << human(static_cast<double>(p.total), "") << " (" << p.total << "), "
     << human(static_cast<double>(p.per_token), "") << " active per token\n";
  auto row = [&](const char* name, int64_t n) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "  %-16s %14lld  %5.1f%%\n", name, static_cast<long long>(n),
                  100.0 * static_cast<double>(n) / static_cast<double>(p.total));
    os << buf;
  };
  row("embedding/head", p.embedding);
  row("attention", p.attention);
  row("dense mlp", p.dense_mlp);
  row("routed experts", p.routed_experts);
  row("shared experts", p.shared_experts);
  row("router", p.router);
  row("norms", p.norms);
  row("mtp projection", p.mtp_projection);

  os << "\nrecipe " << r.name() << ":\n" << recipe_table(r);
  if (r.at(GemmSite::kExpertGateUp).is_fp8() || r.at(GemmSite::kExpertDown).is_fp8()) {
    // Counted on a small MoE layer run on the CPU: the dataflow's casts, independent of shapes.
    const MoeCastCounts mc = count_moe_casts(r);
    os << "casts per MoE layer per step (BF16/FP32 <-> FP8, counted in the ops):\n"
       << "  routed path    " << format_cast_counts(mc.routed) << "\n"
       << "  shared experts " << format_cast_counts(mc.shared) << "\n";
  }
  double all = 0;
  for (const auto& s : gemm_flops_per_token(c)) all += s.flops_per_token;
  const double attn = attention_flops_per_token(c, seq_len);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "\nGEMM FLOPs per token (forward): %s; in FP8: %.1f%%\n"
                "attention core FLOPs per token at sequence length %lld (BF16): %s\n"
                "a training step is about 3x the forward: %s per token\n",
                human(all, "FLOP").c_str(), 100.0 * fp8_flop_share(c, r),
                static_cast<long long>(seq_len), human(attn, "FLOP").c_str(),
                human(3 * (all + attn), "FLOP").c_str());
  os << buf;

  os << "\nmemory estimate for " << tokens
     << " tokens per step (weights: FP32 master + FP32 grad + BF16 "
     << "moments + GEMM copy; activations: tensors saved for backward):\n";
  for (const auto& name : recipe_names()) {
    Recipe preset = recipe_preset(name);
    if (name == r.spec.preset) preset = r;  // with its overrides
    const MemoryEstimate m = estimate_memory(c, preset, tokens);
    std::snprintf(buf, sizeof buf,
                  "  %-20s weights %12s  activations %12s  FP8 GEMM FLOPs %5.1f%%\n", name.c_str(),
                  gib(m.weight_bytes).c_str(), gib(m.activation_bytes).c_str(),
                  100.0 * fp8_flop_share(c, preset));
    os << buf;
  }
  return os.str();
}

}  // namespace octet
