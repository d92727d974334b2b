// CPU reference for moe_router.h: plain loops and sorts over the keys of moe_router_math.h. Every
// FP32 operation goes through numerics/fp32_rn.h so that the CUDA kernels can match it bit for bit.
#include <algorithm>
#include <cstring>
#include <vector>

#include "ops/moe_router/moe_router_backends.h"
#include "ops/moe_router/moe_router_math.h"

namespace octet::cpu {
namespace {

using router::select_key;

// The k largest keys of `keys`, largest first.
std::vector<uint64_t> top_keys(std::vector<uint64_t> keys, int64_t k) {
  std::sort(keys.begin(), keys.end(), [](uint64_t a, uint64_t b) { return a > b; });
  keys.resize(static_cast<size_t>(k));
  return keys;
}

// One token's choice: experts by descending candidate value, ties to the lower index.
void route_token(const float* logit, const float* bias, const RouterConfig& c, int32_t* idx_out,
                 float* weight_out, std::vector<float>& s) {
  const int64_t E = c.num_experts, G = E / c.n_group;
  std::vector<float> biased(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    s[e] = rn::sigmoid_rn(logit[e]);
    biased[e] = router::canonical(rn::add(s[e], bias[e]));
  }
  // Group scores: the sum of the two largest selection scores of the group.
  std::vector<uint64_t> group_keys;
  for (int64_t g = 0; g < c.n_group; ++g) {
    float score = 0.0f;
    if (c.n_group > 1) {
      std::vector<uint64_t> keys;
      for (int64_t e = g * G; e < (g + 1) * G; ++e)
        keys.push_back(select_key(biased[e], static_cast<uint32_t>(e)));
      const std::vector<uint64_t> top2 = top_keys(keys, 2);
      score = rn::add(biased[router::key_index(top2[0])], biased[router::key_index(top2[1])]);
    }
    group_keys.push_back(select_key(score, static_cast<uint32_t>(g)));
  }
  std::vector<bool> kept(static_cast<size_t>(c.n_group), false);
  for (uint64_t key : top_keys(group_keys, c.topk_group)) kept[router::key_index(key)] = true;

  std::vector<uint64_t> cand;
  for (int64_t e = 0; e < E; ++e) {
    if (kept[e / G])
      cand.push_back(select_key(biased[e], static_cast<uint32_t>(e)));
    else if (c.mask_fill == GroupMaskFill::kZero)
      cand.push_back(select_key(0.0f, static_cast<uint32_t>(e)));
  }
  const std::vector<uint64_t> chosen = top_keys(cand, c.top_k);
  float denom = 0.0f;
  for (int64_t j = 0; j < c.top_k; ++j) {
    idx_out[j] = static_cast<int32_t>(router::key_index(chosen[j]));
    denom = rn::add(denom, s[idx_out[j]]);
  }
  denom = rn::add(denom, router::kNormEpsilon);
  for (int64_t j = 0; j < c.top_k; ++j) {
    const float sj = s[idx_out[j]];
    weight_out[j] = c.norm == TopkNorm::kSumToOne
                        ? rn::mul(rn::div(sj, denom), c.routed_scaling_factor)
                        : rn::mul(sj, c.routed_scaling_factor);
  }
}

void check_expert(int32_t e, int64_t experts, const char* what, int64_t row) {
  OCTET_CHECK(e >= 0 && e < experts, what, ": expert id ", e, " at row ", row, " is outside [0, ",
              experts, ")");
}

}  // namespace

void moe_router_forward(Context&, const RouterForwardArgs& args, RouterOutput& out) {
  const RouterConfig& c = args.config;
  const int64_t T = args.logits.rows(), E = c.num_experts, k = c.top_k;
  const float* logits = args.logits.data_as<const float>();
  const float* bias = args.bias.data_as<const float>();
  int32_t* idx = out.topk_idx.data_as<int32_t>();
  float* w = out.topk_weight.data_as<float>();
  int32_t* counts = out.counts.data_as<int32_t>();
  std::fill_n(counts, E, 0);
  std::vector<float> s(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    route_token(logits + t * E, bias, c, idx + t * k, w + t * k, s);
    for (int64_t j = 0; j < k; ++j) ++counts[idx[t * k + j]];
  }
}

void moe_router_backward(Context&, const RouterBackwardArgs& args, Tensor& d_logits) {
  const RouterConfig& c = args.config;
  const int64_t T = args.logits.rows(), E = c.num_experts, k = c.top_k;
  const float* logits = args.logits.data_as<const float>();
  const int32_t* idx = args.topk_idx.data_as<const int32_t>();
  const float* g = args.d_topk_weight.data_as<const float>();
  float* d = d_logits.data_as<float>();
  std::fill_n(d, T * E, 0.0f);
  std::vector<float> s(static_cast<size_t>(k));
  for (int64_t t = 0; t < T; ++t) {
    float denom = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      check_expert(idx[t * k + j], E, "router backward topk_idx", t);
      s[j] = rn::sigmoid_rn(logits[t * E + idx[t * k + j]]);
      denom = rn::add(denom, s[j]);
    }
    denom = rn::add(denom, router::kNormEpsilon);
    float dot = 0.0f;
    for (int64_t j = 0; j < k; ++j) dot = rn::add(dot, rn::mul(g[t * k + j], rn::div(s[j], denom)));
    for (int64_t j = 0; j < k; ++j) {
      const float gj = g[t * k + j];
      const float ds = c.norm == TopkNorm::kSumToOne
                           ? rn::div(rn::mul(c.routed_scaling_factor, rn::sub(gj, dot)), denom)
                           : rn::mul(c.routed_scaling_factor, gj);
      d[t * E + idx[t * k + j]] = rn::mul(ds, rn::mul(s[j], rn::sub(1.0f, s[j])));
    }
  }
}

void moe_router_bias_update(Context&, const RouterBiasUpdateArgs& args) {
  const int64_t E = args.bias.numel();
  const int32_t* counts = args.counts.data_as<const int32_t>();
  float* bias = args.bias.data_as<float>();
  int64_t total = 0;
  for (int64_t e = 0; e < E; ++e) total += counts[e];
  for (int64_t e = 0; e < E; ++e) {
    const int64_t diff = total - E * static_cast<int64_t>(counts[e]);
    const float sign = diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f);
    bias[e] = rn::add(bias[e], rn::mul(args.rate, sign));
  }
}

namespace {

// Per-token score sums S_t (FP32, expert order) and per-(sequence, expert) selection counts.
struct BalanceStats {
  std::vector<float> score_sum;  // (B T)
  std::vector<int64_t> counts;   // (B, E)
};

BalanceStats balance_stats(const SeqBalanceLossArgs& a) {
  const int64_t rows = a.logits.rows(), E = a.logits.cols(), k = a.topk_idx.cols();
  const int64_t T = rows / a.num_sequences;
  const float* logits = a.logits.data_as<const float>();
  const int32_t* idx = a.topk_idx.data_as<const int32_t>();
  BalanceStats st;
  st.score_sum.assign(static_cast<size_t>(rows), 0.0f);
  st.counts.assign(static_cast<size_t>(a.num_sequences * E), 0);
  for (int64_t t = 0; t < rows; ++t) {
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum = rn::add(sum, rn::sigmoid_rn(logits[t * E + e]));
    st.score_sum[t] = sum;
    for (int64_t j = 0; j < k; ++j) {
      check_expert(idx[t * k + j], E, "balance loss topk_idx", t);
      ++st.counts[(t / T) * E + idx[t * k + j]];
    }
  }
  return st;
}

}  // namespace

void moe_seq_balance_loss_forward(Context&, const SeqBalanceLossArgs& args, Tensor& loss) {
  const int64_t rows = args.logits.rows(), E = args.logits.cols(), k = args.topk_idx.cols();
  const int64_t B = args.num_sequences, T = rows / B;
  const float* logits = args.logits.data_as<const float>();
  const BalanceStats st = balance_stats(args);
  double total = 0.0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t chunk = (T + kBalanceChunks - 1) / kBalanceChunks;
      double p = 0.0;
      for (int64_t c0 = 0; c0 < T; c0 += chunk) {
        double part = 0.0;
        for (int64_t t = b * T + c0; t < b * T + std::min(T, c0 + chunk); ++t)
          part = rn::add(part, static_cast<double>(
                                   rn::div(rn::sigmoid_rn(logits[t * E + e]), st.score_sum[t])));
        p = rn::add(p, part);
      }
      const double f =
          rn::div(rn::mul(static_cast<double>(E), static_cast<double>(st.counts[b * E + e])),
                  rn::mul(static_cast<double>(k), static_cast<double>(T)));
      total = rn::add(total, rn::mul(f, rn::div(p, static_cast<double>(T))));
    }
  }
  loss.data_as<float>()[0] = static_cast<float>(
      rn::div(rn::mul(total, static_cast<double>(args.alpha)), static_cast<double>(B)));
}

void moe_seq_balance_loss_backward(Context&, const SeqBalanceLossArgs& args, float d_loss,
                                   Tensor& d_logits) {
  const int64_t rows = args.logits.rows(), E = args.logits.cols(), k = args.topk_idx.cols();
  const int64_t B = args.num_sequences, T = rows / B;
  const float* logits = args.logits.data_as<const float>();
  float* d = d_logits.data_as<float>();
  const BalanceStats st = balance_stats(args);
  // c_{b,e} = d_loss * alpha * E * count / (k T^2 B), in FP64 in this order, rounded once.
  const double denom = rn::mul(
      rn::mul(rn::mul(static_cast<double>(k), static_cast<double>(T)), static_cast<double>(T)),
      static_cast<double>(B));
  std::vector<float> coef(static_cast<size_t>(B * E));
  for (int64_t i = 0; i < B * E; ++i) {
    const double num =
        rn::mul(rn::mul(rn::mul(static_cast<double>(d_loss), static_cast<double>(args.alpha)),
                        static_cast<double>(E)),
                static_cast<double>(st.counts[i]));
    coef[i] = static_cast<float>(rn::div(num, denom));
  }
  std::vector<float> s(static_cast<size_t>(E));
  for (int64_t t = 0; t < rows; ++t) {
    const float* c = coef.data() + (t / T) * E;
    float dot = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      s[e] = rn::sigmoid_rn(logits[t * E + e]);
      dot = rn::add(dot, rn::mul(c[e], rn::div(s[e], st.score_sum[t])));
    }
    for (int64_t e = 0; e < E; ++e) {
      const float ds = rn::div(rn::sub(c[e], dot), st.score_sum[t]);
      d[t * E + e] = rn::add(d[t * E + e], rn::mul(ds, rn::mul(s[e], rn::sub(1.0f, s[e]))));
    }
  }
}

}  // namespace octet::cpu
