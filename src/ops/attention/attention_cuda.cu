// CUDA launchers of the attention family (device code in attention_kernels.cuh). Arguments were
// validated and outputs allocated by attention.cpp; everything is enqueued on the context's stream
// and nothing here synchronises with the host. The only device memory besides the outputs is the
// backward's D = rowsum(dO * o), (B, H, T) f32: linear in T.
#include <type_traits>

#include "backend/cuda_check.h"
#include "ops/attention/attention_backends.h"
#include "ops/attention/attention_kernels.cuh"

namespace octet::cuda {
namespace {

using kernels::AttentionParams;
using kernels::kAttnRows;
using kernels::kAttnThreads;
using kernels::kSmemPad;

// Register-tile bucket of a head dim (a multiple of 16 in [16, 256]).
int bucket(int d) {
  return d <= 64 ? 64 : d <= 128 ? 128 : d <= 192 ? 192 : 256;
}

template <typename F>
void with_bucket(int d, F&& f) {
  switch (bucket(d)) {
    case 64:
      f(std::integral_constant<int, 64>{});
      break;
    case 128:
      f(std::integral_constant<int, 128>{});
      break;
    case 192:
      f(std::integral_constant<int, 192>{});
      break;
    default:
      f(std::integral_constant<int, 256>{});
      break;
  }
}

// Key (forward, dQ) block width: the wide-accumulator kernels take narrower score tiles to stay
// within 255 registers.
constexpr int key_block(int acc_bucket) {
  return acc_bucket <= 128 ? 64 : 32;
}
// Query block of the dK/dV kernels: 64 while both accumulators are small, else 32.
constexpr int query_block(int dqk_bucket, int dv_bucket) {
  return dqk_bucket + dv_bucket <= 256 ? 64 : 32;
}
// dK and dV accumulate in one pass when their registers (half a float per element and lane) fit.
constexpr bool fused_dkdv(int dqk_bucket, int dv_bucket) {
  return dqk_bucket + dv_bucket <= 320;
}

int64_t tile_elems(int rows, int d) {
  return int64_t{rows} * (d + kSmemPad);
}

template <typename Kernel>
void launch(Kernel kernel, dim3 grid, int64_t smem_bytes, cudaStream_t st,
            const AttentionParams& p) {
  OCTET_CHECK(smem_bytes <= 227 * 1024, "attention: kernel needs ", smem_bytes,
              " bytes of shared memory");
  OCTET_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem_bytes)));
  kernel<<<grid, kAttnThreads, static_cast<size_t>(smem_bytes), st>>>(p);
  OCTET_CUDA_CHECK_LAUNCH();
}

AttentionParams make_params(const Tensor& q, const Tensor& k, const Tensor& v,
                            const AttentionShape& s) {
  AttentionParams p{};
  p.q = q.data_as<const uint16_t>();
  p.k = k.data_as<const uint16_t>();
  p.v = v.data_as<const uint16_t>();
  p.T = s.seq;
  p.H = static_cast<int>(s.heads);
  p.dqk = s.dqk;
  p.dv_dim = s.dv;
  p.scale = s.scale;
  p.scale_log2 = s.scale * kernels::kLog2e;
  return p;
}

dim3 tile_grid(const AttentionShape& s, int rows_per_tile) {
  return dim3(static_cast<unsigned>(s.batch * s.heads),
              static_cast<unsigned>((s.seq + rows_per_tile - 1) / rows_per_tile));
}

template <int kDqk, int kDv, bool kDk, bool kDvOut>
void launch_dkdv(const AttentionParams& p, const AttentionShape& s, cudaStream_t st) {
  constexpr int kBlockM = query_block(kDqk, kDv);
  const int64_t smem = 2 * (tile_elems(kAttnRows, s.dqk) + (kDk ? tile_elems(kAttnRows, s.dv) : 0) +
                            2 * tile_elems(kBlockM, s.dqk) + 2 * tile_elems(kBlockM, s.dv)) +
                       4 * 4 * kBlockM;
  launch(kernels::attention_backward_dkdv_kernel<kBlockM, kDqk, kDv, kDk, kDvOut>,
         tile_grid(s, kAttnRows), smem, st, p);
}

}  // namespace

void attention_forward(Context& ctx, const AttentionForwardArgs& args, const AttentionShape& s,
                       AttentionForwardResult& out) {
  AttentionParams p = make_params(args.q, args.k, args.v, s);
  p.out_o = out.o.data_as<uint16_t>();
  p.lse = out.lse.data_as<float>();
  const auto st = static_cast<cudaStream_t>(ctx.stream);
  with_bucket(s.dv, [&](auto dv_bucket) {
    constexpr int kDv = decltype(dv_bucket)::value, kBlockN = key_block(kDv);
    const int64_t smem = 2 * (tile_elems(kAttnRows, s.dqk) + 2 * tile_elems(kBlockN, s.dqk) +
                              2 * tile_elems(kBlockN, s.dv));
    launch(kernels::attention_forward_kernel<kBlockN, kDv>, tile_grid(s, kAttnRows), smem, st, p);
  });
}

void attention_backward(Context& ctx, const AttentionBackwardArgs& args, const AttentionShape& s,
                        AttentionGrads& out) {
  AttentionParams p = make_params(args.q, args.k, args.v, s);
  p.o = args.o.data_as<const uint16_t>();
  p.dO = args.grad_o.data_as<const uint16_t>();
  p.lse = const_cast<float*>(args.lse.data_as<const float>());  // read only in the backward kernels
  p.dq = out.grad_q.data_as<uint16_t>();
  p.dk = out.grad_k.data_as<uint16_t>();
  p.dv = out.grad_v.data_as<uint16_t>();
  const auto st = static_cast<cudaStream_t>(ctx.stream);

  Tensor delta = Tensor::empty(ctx, {s.batch, s.heads, s.seq}, DType::kF32);
  p.delta = delta.data_as<const float>();
  kernels::attention_delta_kernel<<<tile_grid(s, kernels::kDeltaRows), 256, 0, st>>>(
      p, delta.data_as<float>());
  OCTET_CUDA_CHECK_LAUNCH();

  with_bucket(s.dqk, [&](auto qk_bucket) {
    with_bucket(s.dv, [&](auto dv_bucket) {
      constexpr int kDqk = decltype(qk_bucket)::value, kDv = decltype(dv_bucket)::value;
      if constexpr (fused_dkdv(kDqk, kDv)) {
        launch_dkdv<kDqk, kDv, true, true>(p, s, st);
      } else {
        launch_dkdv<kDqk, 64, true, false>(p, s, st);
        launch_dkdv<64, kDv, false, true>(p, s, st);
      }
    });
    constexpr int kDqk = decltype(qk_bucket)::value, kBlockN = key_block(kDqk);
    const int64_t smem = 2 * (tile_elems(kAttnRows, s.dqk) + tile_elems(kAttnRows, s.dv) +
                              2 * tile_elems(kBlockN, s.dqk) + 2 * tile_elems(kBlockN, s.dv));
    launch(kernels::attention_backward_dq_kernel<kBlockN, kDqk>, tile_grid(s, kAttnRows), smem, st,
           p);
  });
  // `delta` is freed stream-ordered after the kernels that read it.
}

}  // namespace octet::cuda
