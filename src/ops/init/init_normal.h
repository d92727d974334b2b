// Parameter initialisation on any backend: N(0, std^2) from the counter-based Philox stream of
// core/rng.h, and constant fills, written in place into an F32 tensor on the context's device.
//
// Element k of the tensor is float(std * z_k), z_k index k of Rng(seed, stream)'s normals
// (Rng::normal4 of block k / 4, FP64), rounded once to FP32. That is model/init.h's definition,
// and both backends give the host's values bit for bit:
//   CPU   the host loop, split over threads by blocks of 4 elements (each element is a pure
//         function of its index, so the split cannot change a bit).
//   CUDA  one thread per block of 4. z goes through log, sqrt, cos and sin, and CUDA's FP64 log,
//         cos and sin may differ from the host's libm by an ulp or two (rng.h), which changes the
//         FP32 result only when std * z lies within a few FP64 ulps of an FP32 rounding boundary.
//         So the kernel certifies each element: it rounds p = std * z and also p -/+ |p| * 2^-m
//         (m = margin_log2, 40: 2^12 FP64 ulps, far beyond any difference between two libms of
//         a few ulps each). When the three round to the same FP32 value, every FP64 value within
//         that distance of p, the host's included, rounds to it: the element is exact. Otherwise
//         (about 2^-15.5 of the elements at m = 40) the kernel lists the index, and the host
//         computes those elements with its own libm and scatters them into the tensor. The
//         result is the host's tensor by construction, whatever either libm does.
#pragma once

#include <cstdint>

#include "core/context.h"
#include "core/tensor.h"

namespace octet {

struct InitNormalArgs {
  Tensor out;  // F32 on the context's device, any shape (row-major element order); written
  uint64_t seed = 0;
  uint64_t stream = 0;  // the Rng stream (model/init.h: init_stream(name))
  double std = 1.0;
  // CUDA: the certification margin's exponent (see above); the default is the one to use. A
  // smaller value sends more elements through the host (the tests use 20: the whole tensor).
  int margin_log2 = 40;
};

struct InitNormalStats {
  int64_t host_elements = 0;  // CUDA: elements computed on the host (not certified); CPU: all
};

// Fills args.out as described above. Synchronises on CUDA (the uncertified indices are read).
InitNormalStats init_normal(Context& ctx, const InitNormalArgs& args);

// out[i] = value for every element (F32 on the context's device); enqueued only.
void init_fill(Context& ctx, Tensor& out, float value);

// The host's value of element k (the definition above), one element at a time.
float init_normal_value(uint64_t seed, uint64_t stream, double std, int64_t k);

}  // namespace octet
