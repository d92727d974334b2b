// CPU reference for attention.h: plain loops in FP64, one score row (b, h, query i) at a time; it
// is the oracle of the CUDA kernels and the F32 path of the finite-difference checks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "numerics/fp8.h"
#include "ops/attention/attention_backends.h"

namespace octet::cpu {
namespace {

// Reads (B, T, H, D) operands (column windows of (B, T, H, W) tensors) as doubles and writes
// results in the tensor's dtype.
struct View {
  void* p;
  DType dtype;
  int64_t T, H, D, W;
  View(const HeadView& v, int64_t seq, int64_t heads)
      : p(v.data()), dtype(v.base.dtype()), T(seq), H(heads), D(v.head_dim()), W(v.row_stride()) {}
  View(const Tensor& t, int64_t seq, int64_t heads) : View(HeadView(t), seq, heads) {}
  int64_t index(int64_t b, int64_t i, int64_t h) const { return ((b * T + i) * H + h) * W; }
  double at(int64_t b, int64_t i, int64_t h, int64_t d) const {
    const int64_t e = index(b, i, h) + d;
    return dtype == DType::kF32 ? static_cast<const float*>(p)[e]
                                : bf16_to_float(static_cast<const uint16_t*>(p)[e]);
  }
  void put(int64_t b, int64_t i, int64_t h, int64_t d, double v) const {
    const int64_t e = index(b, i, h) + d;
    if (dtype == DType::kF32)
      static_cast<float*>(p)[e] = static_cast<float>(v);
    else
      static_cast<uint16_t*>(p)[e] = float_to_bf16(static_cast<float>(v));
  }
};

// Copies one head (all T rows of (b, h)) of a (B, T, H, D) tensor into a dense (T, D) double
// matrix.
std::vector<double> head(const View& v, int64_t b, int64_t h) {
  std::vector<double> m(static_cast<size_t>(v.T * v.D));
  for (int64_t i = 0; i < v.T; ++i)
    for (int64_t d = 0; d < v.D; ++d) m[static_cast<size_t>(i * v.D + d)] = v.at(b, i, h, d);
  return m;
}

double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// s[j] = scale * q_i . k_j for j <= i.
void score_row(const std::vector<double>& q, const std::vector<double>& k, int64_t i, int64_t dqk,
               double scale, std::vector<double>& s) {
  for (int64_t j = 0; j <= i; ++j)
    s[static_cast<size_t>(j)] = scale * dot(&q[i * dqk], &k[j * dqk], dqk);
}

}  // namespace

void attention_forward(Context&, const AttentionForwardArgs& a, const AttentionShape& s,
                       AttentionForwardResult& out) {
  const View vq(a.q, s.seq, s.heads), vk(a.k, s.seq, s.heads), vv(a.v, s.seq, s.heads);
  const View vo(out.o, s.seq, s.heads);
  float* lse = out.lse.data_as<float>();
  std::vector<double> row(static_cast<size_t>(s.seq)), acc(static_cast<size_t>(s.dv));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const auto q = head(vq, b, h), k = head(vk, b, h), v = head(vv, b, h);
      for (int64_t i = 0; i < s.seq; ++i) {
        score_row(q, k, i, s.dqk, s.scale, row);
        const double m = *std::max_element(row.begin(), row.begin() + i + 1);
        double l = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(row[static_cast<size_t>(j)] - m);
          l += p;
          for (int64_t d = 0; d < s.dv; ++d)
            acc[static_cast<size_t>(d)] += p * v[static_cast<size_t>(j * s.dv + d)];
        }
        for (int64_t d = 0; d < s.dv; ++d) vo.put(b, i, h, d, acc[static_cast<size_t>(d)] / l);
        lse[(b * s.heads + h) * s.seq + i] = static_cast<float>(m + std::log(l));
      }
    }
}

void attention_backward(Context&, const AttentionBackwardArgs& a, const AttentionShape& s,
                        AttentionGrads& out) {
  const int64_t T = s.seq, dqk = s.dqk, dv = s.dv;
  const View vq(a.q, T, s.heads), vk(a.k, T, s.heads), vv(a.v, T, s.heads);
  const View vo(a.o, T, s.heads), vdo(a.grad_o, T, s.heads);
  const View vdq(out.grad_q, T, s.heads), vdk(out.grad_k, T, s.heads);
  const View vdv =
      a.grad_v_into.given() ? View(a.grad_v_into, T, s.heads) : View(out.grad_v, T, s.heads);
  const float* lse = a.lse.data_as<const float>();
  std::vector<double> row(static_cast<size_t>(T)), dq(static_cast<size_t>(dqk));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const auto q = head(vq, b, h), k = head(vk, b, h), v = head(vv, b, h);
      const auto o = head(vo, b, h), go = head(vdo, b, h);
      std::vector<double> dk(static_cast<size_t>(T * dqk), 0.0),
          dvv(static_cast<size_t>(T * dv), 0.0);
      for (int64_t i = 0; i < T; ++i) {
        score_row(q, k, i, dqk, s.scale, row);
        const double li = lse[(b * s.heads + h) * T + i];
        const double Di = dot(&go[i * dv], &o[i * dv], dv);
        std::fill(dq.begin(), dq.end(), 0.0);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(row[static_cast<size_t>(j)] - li);
          const double dp = dot(&go[i * dv], &v[j * dv], dv);
          const double ds = p * (dp - Di);
          for (int64_t d = 0; d < dqk; ++d) {
            dq[static_cast<size_t>(d)] += ds * k[static_cast<size_t>(j * dqk + d)];
            dk[static_cast<size_t>(j * dqk + d)] += ds * q[static_cast<size_t>(i * dqk + d)];
          }
          for (int64_t d = 0; d < dv; ++d)
            dvv[static_cast<size_t>(j * dv + d)] += p * go[static_cast<size_t>(i * dv + d)];
        }
        for (int64_t d = 0; d < dqk; ++d) vdq.put(b, i, h, d, s.scale * dq[static_cast<size_t>(d)]);
      }
      for (int64_t j = 0; j < T; ++j) {
        for (int64_t d = 0; d < dqk; ++d)
          vdk.put(b, j, h, d, s.scale * dk[static_cast<size_t>(j * dqk + d)]);
        for (int64_t d = 0; d < dv; ++d) vdv.put(b, j, h, d, dvv[static_cast<size_t>(j * dv + d)]);
      }
    }
}

}  // namespace octet::cpu
