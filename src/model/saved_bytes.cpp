// Saved-activation accounting (saved_bytes.h): walks the Saved structs, counting each buffer once.
#include "model/saved_bytes.h"

#include <set>

namespace octet {
namespace {

class Counter {
 public:
  int64_t add(const Tensor& t) {
    if (t.data() == nullptr || t.numel() == 0 || !seen_.insert(t.data()).second) return 0;
    return t.nbytes();
  }
  int64_t add(const QuantTensor& q) {
    return add(q.data) + add(q.scale_inv) + add(q.amax) + add(q.columnwise_data) +
           add(q.columnwise_scale_inv);
  }
  int64_t add(const LinearSaved& s) { return add(s.x) + add(s.qx); }
  int64_t add(const NormLayer::Saved& s) { return add(s.x) + add(s.rstd); }
  int64_t add(const GroupedLinearLayer::Saved& s) {
    int64_t n = add(s.x) + add(s.qx);
    for (const LinearSaved& e : s.per_expert) n += add(e);
    return n;
  }
  int64_t add(const SwigluMlp::Saved& s) { return add(s.gate_up) + add(s.down) + add(s.gu); }

 private:
  std::set<const void*> seen_;
};

}  // namespace

SavedBytes saved_bytes(const DecoderLayer::Saved& s) {
  Counter c;
  SavedBytes b;
  // The residual stream first: the norms own it, the blocks that share it count nothing more.
  b.norms = c.add(s.input_norm) + c.add(s.post_norm);
  const MlaLayer::Saved& a = s.attn;
  for (const LinearSaved* l : {&a.q_a, &a.q_b, &a.q, &a.kv_a, &a.kv_b, &a.o})
    b.attention += c.add(*l);
  b.attention += c.add(a.q_a_norm) + c.add(a.kv_a_norm);
  for (const Tensor* t : {&a.q_rot, &a.k, &a.kva, &a.v.base, &a.out, &a.lse})
    b.attention += c.add(*t);
  b.mlp = c.add(s.mlp);
  const MoeLayer::Saved& m = s.moe;
  for (const Tensor* t :
       {&m.x, &m.logits, &m.route.topk_idx, &m.route.topk_weight, &m.route.counts, &m.map.row_of,
        &m.map.token_of, &m.map.counts, &m.map.group_sizes, &m.map.offsets, &m.layout.sizes, &m.gu,
        &m.expert_out, &m.aux_loss, &m.w_rows})
    b.mlp += c.add(*t);
  b.mlp += c.add(m.gate_up) + c.add(m.down) + c.add(m.shared) + c.add(m.gu_fp8) + c.add(m.x_fp8);
  return b;
}

}  // namespace octet
