// CPU reference for rope_key.h: loops over rows; every rotation rope_math.h's, every head sum FP32
// in increasing h from 0 (as layout_cpu.cpp's kSum), so it matches the composition bit for bit.
#include <cstring>
#include <vector>

#include "ops/cpu_elements.h"
#include "ops/rope/rope_backends.h"
#include "ops/rope/rope_math.h"

namespace octet::cpu {
namespace {

// v rounded to T and back (the sum's one rounding to the dtype).
template <typename T>
float round_to(float v) {
  T t;
  store(&t, 0, v);
  return load(&t, 0);
}

template <typename T>
void forward(const RopeKeyArgs& a, const RopeKeyGeometry& g, Tensor& k) {
  const T* kv = a.kv.data_as<const T>();
  const T* kr = a.kr.data_as<const T>();
  T* out = k.data_as<T>();
  const int d = static_cast<int>(g.rope), half = d / 2;
  const int64_t dqk = g.nope + g.rope;
  const float* cs = a.table.cos.data_as<const float>();
  const float* sn = a.table.sin.data_as<const float>();
  const bool inter = a.pairing == RopePairing::kInterleave;
  for (int64_t n = 0; n < g.batch * g.seq; ++n) {
    const int64_t t = n % g.seq;
    const T* x = kr + n * g.kr_width + a.kr_col;
    for (int64_t h = 0; h < g.heads; ++h) {
      const int64_t r = n * g.heads + h;
      T* y = out + r * dqk;
      std::memcpy(y, kv + r * g.kv_width, static_cast<size_t>(g.nope) * sizeof(T));
      for (int i = 0; i < d; ++i) {
        const rope_math::RopePick pk = rope_math::rope_pick(i, half, inter, true);
        const float c = cs[t * half + pk.j], s = sn[t * half + pk.j];
        const float p = load(x, pk.p), q = load(x, pk.q);
        store(
            y, g.nope + i,
            pk.first ? rope_math::rotate_first(p, q, c, s) : rope_math::rotate_second(p, q, c, s));
      }
    }
  }
}

template <typename T>
void backward(const RopeKeyBackwardArgs& a, const RopeKeyGeometry& g) {
  const T* dk = a.grad_k.data_as<const T>();
  T* dkr = a.grad_kr.data_as<T>();
  const int d = static_cast<int>(g.rope), half = d / 2;
  const int64_t dqk = g.nope + g.rope;
  const float* cs = a.table.cos.data_as<const float>();
  const float* sn = a.table.sin.data_as<const float>();
  const bool inter = a.pairing == RopePairing::kInterleave;
  std::vector<float> sum(static_cast<size_t>(d));
  for (int64_t n = 0; n < g.batch * g.seq; ++n) {
    const int64_t t = n % g.seq;
    for (int i = 0; i < d; ++i) {
      float v = 0.0f;
      for (int64_t h = 0; h < g.heads; ++h) v += load(dk, (n * g.heads + h) * dqk + g.nope + i);
      sum[static_cast<size_t>(i)] = round_to<T>(v);
    }
    T* y = dkr + n * g.kr_width + a.kr_col;
    for (int i = 0; i < d; ++i) {
      const rope_math::RopePick pk = rope_math::rope_pick(i, half, inter, false);
      const float c = cs[t * half + pk.j], s = -sn[t * half + pk.j];
      const float p = sum[static_cast<size_t>(pk.p)], q = sum[static_cast<size_t>(pk.q)];
      store(y, i,
            pk.first ? rope_math::rotate_first(p, q, c, s) : rope_math::rotate_second(p, q, c, s));
    }
  }
}

}  // namespace

void rope_key_forward(Context&, const RopeKeyArgs& a, const RopeKeyGeometry& g, Tensor& k) {
  if (a.kv.dtype() == DType::kF32)
    forward<float>(a, g, k);
  else
    forward<uint16_t>(a, g, k);
}

void rope_key_backward(Context&, const RopeKeyBackwardArgs& a, const RopeKeyGeometry& g) {
  if (a.grad_k.dtype() == DType::kF32)
    backward<float>(a, g);
  else
    backward<uint16_t>(a, g);
}

}  // namespace octet::cpu
