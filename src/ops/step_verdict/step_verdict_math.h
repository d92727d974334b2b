// Internal: the arithmetic of step_verdict.h, shared by the CPU reference and the CUDA kernels (one
// thread), so both compute it alike. In double, without fused multiply-adds (the CUDA side rounds
// each operation, as the host does), in the order the trainer's host code summed: the verdicts are
// bit for bit the ones the host used to make.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define OCTET_VERDICT_FN __host__ __device__ inline
#else
#define OCTET_VERDICT_FN inline
#endif

namespace octet::verdict {

#ifdef __CUDA_ARCH__
__device__ inline double add(double a, double b) {
  return __dadd_rn(a, b);
}
__device__ inline double sub(double a, double b) {
  return __dsub_rn(a, b);
}
__device__ inline double mul(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ inline double div(double a, double b) {
  return __ddiv_rn(a, b);
}
__device__ inline double root(double a) {
  return __dsqrt_rn(a);
}
__device__ inline bool finite(double a) {
  return isfinite(a);
}
#else
inline double add(double a, double b) {
  return a + b;
}
inline double sub(double a, double b) {
  return a - b;
}
inline double mul(double a, double b) {
  volatile double p = a * b;  // never fused into a following add
  return p;
}
inline double div(double a, double b) {
  return a / b;
}
inline double root(double a) {
  return __builtin_sqrt(a);
}
inline bool finite(double a) {
  return __builtin_isfinite(a);
}
#endif

// The mean of R ranks' K values each (x[r * K + m]) in global micro-batch order: global index
// j = m * R + r, sum_j x_j / N with N = R * K, each term divided before it is added.
OCTET_VERDICT_FN double global_mean(const float* x, int64_t ranks, int64_t per_rank) {
  const int64_t n = ranks * per_rank;
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t m = j / ranks, r = j % ranks;
    sum = add(sum, div(static_cast<double>(x[r * per_rank + m]), static_cast<double>(n)));
  }
  return sum;
}

// Whether `loss` exceeds mean + threshold * sd of a full window (count == capacity > 0); the ring
// is read oldest first from `head`:
//   mean = (sum v) / n,   sd = sqrt((sum (v - mean)^2) / n),   spike = loss > mean + threshold * sd
OCTET_VERDICT_FN bool is_spike(const double* ring, int64_t capacity, int64_t count, int64_t head,
                               double threshold, double loss) {
  if (capacity == 0 || count < capacity) return false;
  double mean = 0, var = 0;
  for (int64_t i = 0; i < count; ++i) mean = add(mean, ring[(head + i) % capacity]);
  mean = div(mean, static_cast<double>(count));
  for (int64_t i = 0; i < count; ++i) {
    const double d = sub(ring[(head + i) % capacity], mean);
    var = add(var, mul(d, d));
  }
  const double sd = root(div(var, static_cast<double>(count)));
  return loss > add(mean, mul(threshold, sd));
}

// Appends `loss` to the ring (count, head in state[0], state[1]), dropping the oldest when full.
OCTET_VERDICT_FN void remember(double* ring, int64_t* state, int64_t capacity, double loss) {
  if (capacity == 0) return;
  const int64_t count = state[0], head = state[1];
  if (count < capacity) {
    ring[(head + count) % capacity] = loss;
    state[0] = count + 1;
  } else {
    ring[head] = loss;
    state[1] = (head + 1) % capacity;
  }
}

}  // namespace octet::verdict

#undef OCTET_VERDICT_FN
