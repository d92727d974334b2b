// The consumer side of the grouped FP8 GEMMs' mainloop, with each K tile's promotion overlapped with
// the next K tile's tensor-core work. Included only by grouped_gemm_sm90_config.cuh.
//
// Blockwise scaling promotes after every 128 of K: the WGMMAs of a K tile accumulate into a partial
// tile, which is then scaled by that K tile's scales and added to the FP32 accumulator
// (acc += partial * sa * sb). CUTLASS 4.2's pointer-array blockwise mainloop waits for a K tile's
// WGMMAs to finish before it promotes them, so the tensor cores of a warp group idle during every
// promotion (about 8% more time a K step than cuBLASLt's dense blockwise kernel, docs/benchmarks.md).
// Here each warp group keeps two partial tiles and alternates between them: it issues K tile i's
// WGMMAs into one, waits only for tile i-1's (warpgroup_wait<1>), releases tile i-1's shared memory
// stage and promotes tile i-1's partial while tile i's run. The promotions are CUTLASS's
// multiplications and additions on the same values in the same order (the first K tile's product
// is written rather than added to the accumulator): 12-step deepseek and fp8-flow trainings gave
// bit for bit the losses of CUTLASS's loop (docs/benchmarks.md).
//
// Everything else (the producer's TMA and scale loads, the shared memory, the arguments and the
// kernel) is CUTLASS's collective, which this derives from; only mma() is replaced, and
// tensors_perform_update, which takes each group's scale layouts from the arguments (below). The
// overlap's cost is a second partial tile in registers: 3 x 64 FP32 a thread for the 128x128
// cooperative tile, inside the 232 registers the cooperative kernel gives its consumer warps.
#pragma once

#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>

namespace octet::cuda::sm90 {

template <class Collective>
struct OverlappedPromotionMma : Collective {
  using typename Collective::MainloopPipeline;
  using typename Collective::Params;
  using typename Collective::PipelineState;
  using typename Collective::TensorStorage;
  using typename Collective::TiledMma;
  using typename Collective::TileShape;

  // One promotion per K tile: a K tile is one scale block along K.
  static_assert(Collective::ScalePromotionInterval *
                        cute::size<2>(typename TiledMma::AtomShape_MNK{}) ==
                    cute::size<2>(TileShape{}),
                "the overlapped mainloop promotes once per K tile");

  // The producer's view of group b's scales: CUTLASS's pointer-array mainloop rebuilds each group's
  // scale layouts from its problem shape (compact: a row of scales holds only that group's K
  // blocks); this takes the layouts the set-up kernel wrote into the arguments instead, so that a
  // group may read its scales in place inside a larger array (the Wgrad: each expert's token blocks
  // are columns of the whole (rows, ceil(R / 128)) scales, grouped_wgrad_sm90_fp8.cuh). The shapes
  // are the same; where a set-up kernel writes the compact layouts (Fprop, Dgrad), so are the
  // strides, and the kernel reads what CUTLASS's own would.
  template <class InputTensors, class ProblemShape_MNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const& inputs,
                                                     Params const& mainloop_params,
                                                     ProblemShape_MNKL problem_shape_mnkl,
                                                     int32_t next_batch) {
    using namespace cute;
    InputTensors t =
        Collective::tensors_perform_update(inputs, mainloop_params, problem_shape_mnkl, next_batch);
    get<2>(t) = make_tensor(make_gmem_ptr(mainloop_params.ptr_SFA[next_batch]),
                            mainloop_params.layout_SFA[next_batch]);
    get<3>(t) = make_tensor(make_gmem_ptr(mainloop_params.ptr_SFB[next_batch]),
                            mainloop_params.layout_SFB[next_batch]);
    return t;
  }

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read,
                          FrgTensorC& accum, int k_tile_count, int thread_idx,
                          TensorStorage& shared_tensors, Params const& /*mainloop_params*/) {
    using namespace cute;
    using LayoutSFA = typename Collective::SmemLayoutSFA;  // (M scales, K scales, stages)
    using LayoutSFB = typename Collective::SmemLayoutSFB;  // (N scales, K scales, stages)
    constexpr bool kRowScalesA = Collective::ScaleMsPerTile > 1;
    constexpr bool kColScalesB = Collective::ScaleNsPerTile > 1;
    static_assert(is_rmem<FrgTensorC>::value, "the accumulator lives in registers");

    if (k_tile_count <= 0) {
      clear(accum);
      return;
    }

    auto sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()),
                          typename Collective::SmemLayoutA{});  // (BLK_M, BLK_K, stages)
    auto sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()),
                          typename Collective::SmemLayoutB{});  // (BLK_N, BLK_K, stages)
    // The scales seen as (BLK_M, BLK_N, (K scales, stages)) tensors, broadcast along the other
    // operand's dimension, so that they partition exactly like the accumulator.
    auto sSFA = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFA.data()),
        make_layout(make_shape(shape<0>(LayoutSFA{}), get<1>(TileShape{}),
                               make_shape(shape<1>(LayoutSFA{}), shape<2>(LayoutSFA{}))),
                    make_stride(stride<0>(LayoutSFA{}), _0{},
                                make_stride(stride<1>(LayoutSFA{}), stride<2>(LayoutSFA{})))));
    auto sSFB = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFB.data()),
        make_layout(make_shape(get<0>(TileShape{}), shape<0>(LayoutSFB{}),
                               make_shape(shape<1>(LayoutSFB{}), shape<2>(LayoutSFB{}))),
                    make_stride(_0{}, stride<0>(LayoutSFB{}),
                                make_stride(stride<1>(LayoutSFB{}), stride<2>(LayoutSFB{})))));

    TiledMma tiled_mma;
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    auto wg_layout = make_layout(Int<size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup>{},
                                 Int<cutlass::NumThreadsPerWarpGroup>{});
    auto wg_mma = tiled_mma.get_slice(wg_layout(warp_group));
    auto tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, stages)
    auto tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, stages)
    auto tCsSFA =
        tiled_mma.get_slice(thread_idx).partition_C(sSFA);  // (MMA, MMA_M, MMA_N, (K, stages))
    auto tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(sSFB);

    // Two partial tiles and their scales, used alternately.
    auto part0 = make_fragment_like(accum);
    auto part1 = make_fragment_like(accum);
    auto sfa0 = make_tensor_like<float>(tCsSFA(_, _, _, _0{}));
    auto sfb0 = make_tensor_like<float>(tCsSFB(_, _, _, _0{}));
    auto sfa1 = make_tensor_like<float>(tCsSFA(_, _, _, _0{}));
    auto sfb1 = make_tensor_like<float>(tCsSFB(_, _, _, _0{}));

    // Waits for the next K tile's stage, reads its scales and issues its WGMMAs into `part`; the
    // scales are folded into one factor where an operand has a single scale in the tile.
    auto issue = [&](auto& part, auto& sfa, auto& sfb) {
      pipeline.consumer_wait(smem_pipe_read, pipeline.consumer_try_wait(smem_pipe_read));
      const int stage = smem_pipe_read.index();
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), sfa);
      copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), sfb);
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      warpgroup_fence_operand(part);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), part);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(part);
      if constexpr (!kRowScalesA && !kColScalesB) {
        sfa(_0{}) = sfa(_0{}) * sfb(_0{});
      } else if constexpr (kRowScalesA && !kColScalesB) {
        const float b = sfb(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(sfa)); ++i)
          filter_zeros(sfa)(i) = filter_zeros(sfa)(i) * b;
      } else if constexpr (!kRowScalesA && kColScalesB) {
        const float a = sfa(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(sfb)); ++i)
          filter_zeros(sfb)(i) = filter_zeros(sfb)(i) * a;
      }
      ++smem_pipe_read;
    };
    // acc (+)= part * scales, once `part`'s WGMMAs are complete.
    auto promote = [&](auto& part, auto const& sfa, auto const& sfb, auto first) {
      warpgroup_fence_operand(part);
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) {
        float v;
        if constexpr (!kRowScalesA && !kColScalesB) {
          v = part(i) * sfa(_0{});
        } else if constexpr (kRowScalesA && !kColScalesB) {
          v = part(i) * sfa(i);
        } else if constexpr (!kRowScalesA && kColScalesB) {
          v = part(i) * sfb(i);
        } else {
          v = part(i) * sfa(i) * sfb(i);
        }
        if constexpr (decltype(first)::value) {
          accum(i) = v;
        } else {
          accum(i) += v;
        }
      }
      warpgroup_fence_operand(accum);
    };
    // Tile i-1's WGMMAs are complete once at most one batch (tile i's) is outstanding: its stage
    // goes back to the producer. The last tile's stage is released by mma_tail, as in CUTLASS.
    PipelineState smem_pipe_release = smem_pipe_read;
    auto retire_previous = [&] {
      warpgroup_wait<1>();
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
    };

    issue(part0, sfa0, sfb0);
    if (k_tile_count == 1) {
      warpgroup_wait<0>();
      promote(part0, sfa0, sfb0, true_type{});
      return;
    }
    issue(part1, sfa1, sfb1);
    retire_previous();
    promote(part0, sfa0, sfb0, true_type{});
    int left = k_tile_count - 2;  // part1's tile is in flight
    CUTLASS_PRAGMA_NO_UNROLL
    for (; left >= 2; left -= 2) {
      issue(part0, sfa0, sfb0);
      retire_previous();
      promote(part1, sfa1, sfb1, false_type{});
      issue(part1, sfa1, sfb1);
      retire_previous();
      promote(part0, sfa0, sfb0, false_type{});
    }
    if (left == 1) {
      issue(part0, sfa0, sfb0);
      retire_previous();
      promote(part1, sfa1, sfb1, false_type{});
      warpgroup_wait<0>();
      promote(part0, sfa0, sfb0, false_type{});
    } else {
      warpgroup_wait<0>();
      promote(part1, sfa1, sfb1, false_type{});
    }
  }
};

}  // namespace octet::cuda::sm90
