// CPU reference for rope.h: a loop over rows and channels, every output the shared scalar rotation
// of rope_math.h, so the CUDA kernel matches it bit for bit.
#include <cstring>

#include "ops/cpu_elements.h"
#include "ops/rope/rope_backends.h"
#include "ops/rope/rope_math.h"

namespace octet::cpu {
namespace {

template <typename T>
void rope_rows(const RopeArgs& a, const RopeGeometry& g, RopeDirection dir, Tensor& out) {
  const T* x = a.input.data_as<const T>();
  T* y = out.data_as<T>();
  const int d = static_cast<int>(a.table.rope_dim), half = d / 2;
  const float* cs = a.table.cos.data_as<const float>();
  const float* sn = a.table.sin.data_as<const float>();
  const bool fwd = dir == RopeDirection::kForward, inter = a.pairing == RopePairing::kInterleave;
  std::memcpy(y, x, static_cast<size_t>(out.nbytes()));  // channels outside the rope part
  for (int64_t r = 0; r < g.rows; ++r) {
    const int64_t t = (r / g.heads) % g.seq;
    const T* xr = x + r * g.width + a.offset;
    T* yr = y + r * g.width + a.offset;
    for (int i = 0; i < d; ++i) {
      const rope_math::RopePick pk = rope_math::rope_pick(i, half, inter, fwd);
      const float c = cs[t * half + pk.j], s = fwd ? sn[t * half + pk.j] : -sn[t * half + pk.j];
      const float p = load(xr, pk.p), q = load(xr, pk.q);
      store(yr, i,
            pk.first ? rope_math::rotate_first(p, q, c, s) : rope_math::rotate_second(p, q, c, s));
    }
  }
}

}  // namespace

void rope(Context&, const RopeArgs& args, const RopeGeometry& g, RopeDirection dir, Tensor& out) {
  if (args.input.dtype() == DType::kF32)
    rope_rows<float>(args, g, dir, out);
  else
    rope_rows<uint16_t>(args, g, dir, out);
}

}  // namespace octet::cpu
