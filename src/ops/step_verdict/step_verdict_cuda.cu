// CUDA kernels of step_verdict.h: a few threads' work each, enqueued on the context's stream;
// nothing synchronises with the host, so the step's verdict can be captured in a CUDA graph.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda_check.h"
#include "ops/step_verdict/step_verdict_backends.h"
#include "ops/step_verdict/step_verdict_math.h"

namespace octet::cuda {
namespace {

cudaStream_t stream_of(const Context& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

// One thread: the sums are sequential, in the host's order.
__global__ void verdict_kernel(const float* main, const float* mtp, int64_t ranks, int64_t per_rank,
                               int64_t depths, const double* ring, const int64_t* state,
                               int64_t capacity, double threshold, bool spike_skips, double* means,
                               int32_t* flags, float* skip) {
  const int64_t n = ranks * per_rank;
  means[0] = verdict::global_mean(main, ranks, per_rank);
  for (int64_t d = 0; d < depths; ++d)
    means[1 + d] = verdict::global_mean(mtp + d * n, ranks, per_rank);
  const bool nonfinite = !verdict::finite(means[0]);
  const bool spike =
      !nonfinite && verdict::is_spike(ring, capacity, state[0], state[1], threshold, means[0]);
  const bool skipped = nonfinite || (spike && spike_skips);
  flags[0] = (nonfinite ? kVerdictNonFinite : 0) | (spike ? kVerdictSpike : 0) |
             (skipped ? kVerdictSkip : 0);
  skip[0] = skipped ? __int_as_float(0x7fc00000) : 0.0f;
}

__global__ void remember_kernel(double* ring, int64_t* state, int64_t capacity, const double* means,
                                const int32_t* skipped) {
  if (skipped != nullptr && skipped[0] != 0) return;
  verdict::remember(ring, state, capacity, means[0]);
}

__global__ void add_counts_kernel(int32_t* out, const int32_t* in, int64_t e, bool first,
                                  const int32_t* skipped) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < e;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (skipped != nullptr && skipped[0] != 0) {
      out[i] = 0;
    } else {
      out[i] = (first ? 0 : out[i]) + in[i];
    }
  }
}

}  // namespace

void step_loss_verdict(Context& ctx, const StepVerdictArgs& a) {
  const int64_t n = a.main.numel();
  verdict_kernel<<<1, 1, 0, stream_of(ctx)>>>(
      a.main.data_as<const float>(), a.depths > 0 ? a.mtp.data_as<const float>() : nullptr, a.ranks,
      n / a.ranks, a.depths, a.window.values.data_as<const double>(),
      a.window.state.data_as<const int64_t>(), a.window.values.numel(), a.spike_threshold,
      a.spike_skips, a.means.data_as<double>(), a.flags.data_as<int32_t>(),
      a.skip.data_as<float>());
  OCTET_CUDA_CHECK(cudaGetLastError());
}

void step_remember_loss(Context& ctx, const RememberLossArgs& a) {
  remember_kernel<<<1, 1, 0, stream_of(ctx)>>>(
      a.window.values.data_as<double>(), a.window.state.data_as<int64_t>(), a.window.values.numel(),
      a.means.data_as<const double>(),
      a.skipped.data() ? a.skipped.data_as<const int32_t>() : nullptr);
  OCTET_CUDA_CHECK(cudaGetLastError());
}

void sum_counts_unless_skipped(Context& ctx, const SumCountsArgs& a) {
  const int64_t e = a.out.numel();
  if (e == 0) return;
  const unsigned blocks = static_cast<unsigned>((e + 255) / 256 < 64 ? (e + 255) / 256 : 64);
  const int32_t* skipped = a.skipped.data() ? a.skipped.data_as<const int32_t>() : nullptr;
  for (size_t m = 0; m < a.counts.size(); ++m)
    add_counts_kernel<<<blocks, 256, 0, stream_of(ctx)>>>(
        a.out.data_as<int32_t>(), a.counts[m].data_as<const int32_t>(), e, m == 0, skipped);
  OCTET_CUDA_CHECK(cudaGetLastError());
}

}  // namespace octet::cuda
