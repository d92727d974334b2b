// Expert parallelism of the MoE layer (moe_ep.h has the dataflow): the counts exchange, the
// all-to-all-v moves, and the routed experts' forward and backward across the EP group. Called by
// MoeLayer::forward / backward (moe.cpp) when the layer has an EP group of more than one rank.
#include "model/moe_ep.h"

#include <numeric>

#include "model/linear.h"
#include "model/moe.h"
#include "ops/moe_permute/moe_row_weight.h"
#include "ops/quantize/quantize.h"
#include "ops/swiglu/swiglu.h"

namespace octet {
namespace {

bool fp8_experts(const Recipe& r) {
  return r.at(GemmSite::kExpertGateUp).is_fp8() || r.at(GemmSite::kExpertDown).is_fp8();
}

// Element counts and displacements of one all_to_all_v from row counts.
struct Moves {
  std::vector<int64_t> send_n, send_at, recv_n, recv_at;
  int64_t send_rows = 0, recv_rows = 0;
};

Moves moves(const EpRoute& r, bool forward, int64_t cols) {
  const std::vector<int64_t>& out = forward ? r.send_rows : r.recv_rows;
  const std::vector<int64_t>& out_at = forward ? r.send_at : r.recv_at;
  const std::vector<int64_t>& in = forward ? r.recv_rows : r.send_rows;
  const std::vector<int64_t>& in_at = forward ? r.recv_at : r.send_at;
  Moves m;
  for (size_t p = 0; p < out.size(); ++p) {
    m.send_n.push_back(out[p] * cols);
    m.send_at.push_back(out_at[p] * cols);
    m.recv_n.push_back(in[p] * cols);
    m.recv_at.push_back(in_at[p] * cols);
    m.send_rows += out[p];
    m.recv_rows += in[p];
  }
  return m;
}

std::vector<int64_t> starts(const std::vector<int64_t>& n) {
  std::vector<int64_t> at(n.size(), 0);
  for (size_t p = 1; p < n.size(); ++p) at[p] = at[p - 1] + n[p - 1];
  return at;
}

}  // namespace

ExpertSlice expert_slice(int64_t num_experts, int rank, int size) {
  OCTET_CHECK(size >= 1 && num_experts % size == 0, "expert parallelism: ", num_experts,
              " routed experts do not divide over ", size,
              " EP ranks (parallel.ep must divide model.n_routed_experts)");
  OCTET_CHECK(rank >= 0 && rank < size, "expert parallelism: EP rank ", rank, " of ", size);
  return {rank * (num_experts / size), num_experts / size};
}

EpRoute ep_plan(Context& ctx, Comm& ep, const PermuteMap& map, bool pad) {
  const int world = ep.size(), me = ep.rank();
  const int64_t E = map.num_experts;
  const ExpertSlice mine = expert_slice(E, me, world);
  Tensor all = Tensor::empty(ctx, {world * E}, DType::kI32);
  ep.all_gather(ctx, map.counts.data(), all.data(), E, DType::kI32);
  // EP's one device-to-host read per MoE layer and pass: all_to_all_v takes host counts.
  const Tensor host = all.to_host(ctx);
  const int32_t* c = host.data_as<const int32_t>();
  EpRoute r;
  r.send_rows.assign(static_cast<size_t>(world), 0);
  r.recv_rows.assign(static_cast<size_t>(world), 0);
  for (int p = 0; p < world; ++p) {
    const ExpertSlice theirs = expert_slice(E, p, world);
    for (int64_t e = theirs.first; e < theirs.first + theirs.count; ++e)
      r.send_rows[static_cast<size_t>(p)] += c[me * E + e];
    for (int64_t e = mine.first; e < mine.first + mine.count; ++e)
      r.recv_rows[static_cast<size_t>(p)] += c[p * E + e];
  }
  r.send_at = starts(r.send_rows);
  r.recv_at = starts(r.recv_rows);
  r.received = std::accumulate(r.recv_rows.begin(), r.recv_rows.end(), int64_t{0});
  // Received rows come by source rank, within a source by local expert: each row's local expert,
  // then the stable sort of moe_permute_map puts them expert-major, sources in rank order.
  Tensor idx = Tensor::empty({r.received, 1}, DType::kI32);
  int64_t i = 0;
  for (int p = 0; p < world; ++p)
    for (int64_t e = 0; e < mine.count; ++e)
      for (int32_t n = 0; n < c[p * E + mine.first + e]; ++n)
        idx.data_as<int32_t>()[i++] = static_cast<int32_t>(e);
  r.local = moe_permute_map(ctx, {.topk_idx = idx.to(ctx, ctx.device),
                                  .num_experts = mine.count,
                                  .padding = pad ? PermutePadding::kTo128 : PermutePadding::kNone});
  return r;
}

Tensor ep_exchange(Context& ctx, Comm& ep, const EpRoute& r, const Tensor& rows, bool forward) {
  OCTET_CHECK(rows.rank() == 2, "expert parallelism: rows to exchange must be 2-D, got ",
              shape_str(rows.shape()));
  const Moves m = moves(r, forward, rows.cols());
  OCTET_CHECK(rows.rows() == m.send_rows, "expert parallelism: ", rows.rows(),
              " rows to send, the route has ", m.send_rows);
  Tensor out = Tensor::empty(ctx, {m.recv_rows, rows.cols()}, rows.dtype());
  ep.all_to_all_v(ctx, rows.data(), m.send_n.data(), m.send_at.data(), out.data(), m.recv_n.data(),
                  m.recv_at.data(), rows.dtype());
  return out;
}

QuantTensor ep_exchange(Context& ctx, Comm& ep, const EpRoute& r, const QuantTensor& rows,
                        bool forward) {
  OCTET_CHECK(rows.granularity == Granularity::k1x128 && !rows.has_columnwise(),
              "expert parallelism: the FP8 dispatch moves row-wise 1x128 tensors");
  QuantTensor q;
  q.format = rows.format;
  q.granularity = Granularity::k1x128;
  q.rounding = rows.rounding;
  q.amax = rows.amax;
  q.data = ep_exchange(ctx, ep, r, rows.data, forward);
  q.scale_inv = ep_exchange(ctx, ep, r, rows.scale_inv, forward);
  return q;
}

Tensor MoeLayer::ep_forward(Context& ctx, const Precision& p, const Tensor& x2, Saved& s) {
  const Recipe& r = p.recipe;
  const GemmRecipe& up_r = r.at(GemmSite::kExpertGateUp);
  const GemmRecipe& down_r = r.at(GemmSite::kExpertDown);
  auto route = std::make_shared<EpRoute>(ep_plan(ctx, *ep, s.map, fp8_experts(r)));
  s.ep = route;
  s.layout.sizes = route->local.group_sizes;
  GroupedInput xp;
  if (r.fp8_flow || r.moe_dispatch == Storage::kFp8) {
    // Quantized once before the dispatch; the payload and its scales travel in FP8 / FP32.
    const QuantTensor q = moe_permute_quantize(
        ctx, s.map, quantize_args(up_r, GemmOperand::kActivation, x2, QuantizeOutput::kRowwise));
    xp.qx = moe_permute(ctx, route->local, ep_exchange(ctx, *ep, *route, q, true));
  } else {
    xp.x = moe_permute(ctx, route->local,
                       ep_exchange(ctx, *ep, *route, moe_permute(ctx, s.map, x2), true));
  }
  s.gu = gate_up.forward(ctx, p, xp, s.layout, s.gate_up);  // (R', 2F)
  GroupedInput h;
  const GemmRecipe::Quantization hq = down_r.quantization(GemmOperand::kActivation);
  if (r.fp8_flow) {
    // The routing weight of each row moves with it (FP32, 4 bytes a row), into the expert.
    const Tensor w = moe_permute_weights(ctx, s.map, s.route.topk_weight);
    const Tensor w_recv = ep_exchange(ctx, *ep, *route, w.reshape({w.numel(), 1}), true);
    s.w_rows = moe_permute(ctx, route->local, w_recv).reshape({route->local.num_rows});
    h.qx = swiglu_quantize(ctx, {.gate_up = s.gu,
                                 .format = hq.format,
                                 .rounding = hq.rounding,
                                 .epsilon = 0.0f,
                                 .row_weight = s.w_rows});
  } else if (down_r.precision == GemmPrecision::kFp8Block && hq.rounding == ScaleRounding::kPow2) {
    h.qx = swiglu_quantize(ctx, {.gate_up = s.gu, .format = hq.format, .rounding = hq.rounding});
  } else {
    h.x = Tensor::empty(ctx, {s.gu.rows(), s.gu.cols() / 2}, s.gu.dtype());
    swiglu_forward(ctx, {.gate_up = s.gu, .h = h.x});
  }
  const Tensor out = down.forward(ctx, p, h, s.layout, s.down);  // (R', D)
  // Back to received order (k = 1: a copy), then to the sources in BF16, in their map's layout.
  const Tensor back = ep_exchange(ctx, *ep, *route,
                                  moe_permute_backward(ctx, route->local, out, out.dtype()), false);
  if (r.fp8_flow) return moe_permute_backward(ctx, s.map, back, x2.dtype());  // unweighted sum
  s.expert_out = back;
  return moe_combine(
      ctx, s.map,
      {.expert_out = back, .topk_weight = s.route.topk_weight, .out_dtype = x2.dtype()});
}

std::pair<Tensor, Tensor> MoeLayer::ep_backward(Context& ctx, const Precision& p, const Tensor& dy2,
                                                const Saved& s) {
  const GemmRecipe& down_r = p.recipe.at(GemmSite::kExpertDown);
  const EpRoute& route = *s.ep;
  auto to_sources = [&](const Tensor& local_rows, DType dtype) {
    return ep_exchange(ctx, *ep, route, moe_permute_backward(ctx, route.local, local_rows, dtype),
                       false);
  };
  if (p.recipe.fp8_flow) {
    // dy quantized once at the source and dispatched in FP8 with its scales (moe_flow.cpp).
    const QuantTensor dyq = moe_permute_quantize(
        ctx, s.map, quantize_args(down_r, GemmOperand::kGradient, dy2, QuantizeOutput::kRowwise));
    const GroupedInput dyp{
        .x = Tensor(),
        .qx = moe_permute(ctx, route.local, ep_exchange(ctx, *ep, route, dyq, true))};
    const auto [dxp, dw] = flow_experts_backward(ctx, p, dyp, s);
    const Tensor dx_src = to_sources(dxp, dy2.dtype());
    const Tensor dw_src = to_sources(dw.reshape({dw.numel(), 1}), DType::kF32);
    PermuteBackwardResult back = moe_permute_backward_with_weights(ctx, s.map, dx_src, dy2.dtype(),
                                                                   dw_src.reshape({dw_src.rows()}));
    return {std::move(back.d_x), std::move(back.d_topk_weight)};
  }
  // The combine's backward at the source; d_expert_out goes to the owners in BF16 (the expert's
  // down projection quantizes it there, as on one rank).
  const CombineGrads cg = moe_combine_backward(ctx, s.map,
                                               {.d_out = dy2,
                                                .expert_out = s.expert_out,
                                                .topk_weight = s.route.topk_weight,
                                                .d_expert_out_dtype = dy2.dtype()});
  const Tensor d_out =
      moe_permute(ctx, route.local, ep_exchange(ctx, *ep, route, cg.d_expert_out, true));
  const Tensor dh = down.backward(ctx, p, d_out, s.layout, s.down);
  Tensor dgu = Tensor::empty(ctx, s.gu.shape(), dh.dtype());
  swiglu_backward(ctx, {.dh = dh, .gate_up = s.gu, .d_gate_up = dgu});
  const Tensor dxp = gate_up.backward(ctx, p, dgu, s.layout, s.gate_up);
  return {moe_permute_backward(ctx, s.map, to_sources(dxp, dy2.dtype()), dy2.dtype()),
          cg.d_topk_weight};
}

}  // namespace octet
