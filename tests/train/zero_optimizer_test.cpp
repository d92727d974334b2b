// ZeRO-1 AdamW on in-process ranks: the layout, the same weights bit for bit at world sizes 1 to
// 4 (the gradients summed in rank order), the moments' state independent of the world size (saved
// at 4, resumed at 2), agreement with AdamWOptimizer, and a non-finite gradient on one rank
// skipping the step on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/backend.h"
#include "dist/inprocess_comm.h"
#include "test_util.h"
#include "train/zero_optimizer.h"

namespace octet::train {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kTimeout{30000};

const std::vector<int64_t> kSizes = {1000, 37, 3 * 4096 + 5, 1, 700, 64};
constexpr int64_t kPiece = 1000;

TEST(ZeroLayout, PiecesAreWorldIndependentContiguousAndCoverEverything) {
  for (int w : {1, 2, 3, 4, 7}) {
    const ZeroLayout l = ZeroLayout::make(kSizes, kPiece, w);
    const ZeroLayout one = ZeroLayout::make(kSizes, kPiece, 1);
    ASSERT_EQ(l.pieces.size(), one.pieces.size());
    int64_t total = 0;
    for (size_t i = 0; i < l.pieces.size(); ++i) {
      EXPECT_EQ(l.pieces[i].param, one.pieces[i].param);
      EXPECT_EQ(l.pieces[i].offset, one.pieces[i].offset);
      EXPECT_EQ(l.pieces[i].numel, one.pieces[i].numel);
      EXPECT_LE(l.pieces[i].numel, kPiece);
      if (i > 0) {
        EXPECT_GE(l.pieces[i].rank, l.pieces[i - 1].rank);  // contiguous runs
      }
      total += l.pieces[i].numel;
    }
    int64_t sum = 0;
    for (int64_t s : l.shard_elems) sum += s;
    EXPECT_EQ(sum, total);
    EXPECT_EQ(total, 1000 + 37 + 3 * 4096 + 5 + 1 + 700 + 64);
    // Balanced to within a piece of the equal share.
    for (int64_t s : l.shard_elems) EXPECT_LE(std::llabs(s - total / w), kPiece) << "world " << w;
  }
  EXPECT_THROW(ZeroLayout::make(kSizes, 0, 2), Error);
}

struct Params {
  std::vector<Parameter> storage;
  std::vector<Parameter*> ptrs;
};

Params make_params(Context& ctx) {
  Params p;
  p.storage.resize(kSizes.size());
  for (size_t i = 0; i < kSizes.size(); ++i) {
    Parameter& q = p.storage[i];
    q.name = "p" + std::to_string(i);
    q.value = test::random_tensor({kSizes[i]}, DType::kF32, 100 + i).to(ctx, ctx.device);
    q.grad = Tensor::empty(ctx, {kSizes[i]}, DType::kF32);
    q.weight_decay = i % 2 == 0;
  }
  for (Parameter& q : p.storage) p.ptrs.push_back(&q);
  return p;
}

// Micro-batch r's gradient of parameter i at step s. Multiples of 2^-12 below 8 in magnitude: sums
// of a few are exact in FP32, so they do not depend on the order of the summation (the tests where
// ranks hold different numbers of micro-batches need that; the others pass with any values).
Tensor grad_of(int64_t i, int r, int s) {
  Tensor t =
      test::random_tensor({kSizes[static_cast<size_t>(i)]}, DType::kF32,
                          1000 * static_cast<uint64_t>(s) + 10 * static_cast<uint64_t>(r) + i);
  for (int64_t k = 0; k < t.numel(); ++k) {
    float& v = t.data_as<float>()[k];
    v = std::round(std::clamp(v, -7.0f, 7.0f) * 4096.0f) / 4096.0f;
  }
  return t;
}

AdamWConfig adamw(float clip) {
  AdamWConfig c;
  c.lr = 1e-2f;
  c.grad_clip = clip;
  return c;
}

// `world` ranks run `steps` steps with the gradients of `global` micro-batches (rank r adds
// micro-batches r, r + world, ...); returns rank 0's final weights and norms. With `load`, the
// optimizer first restores that state; with `save`, the final state goes there.
struct Outcome {
  std::vector<Tensor> weights;
  std::vector<float> norms;
  io::NamedTensors state;
};
// With `hook`, the last local micro-batch adds the parameters' gradients last to first and names
// each to grads_ready() once added (as the model's backward does), so buckets go out early; the
// sends must then all have happened before step().
Outcome run(int world, int global, int first_step, int steps, float clip,
            const io::NamedTensors* load = nullptr, const std::vector<Tensor>* start = nullptr,
            ZeroConfig z = {kPiece, 777}, bool hook = false) {
  Outcome out;
  run_inprocess_ranks_or_throw(
      world,
      [&](Context& ctx) {
        Params p = make_params(ctx);
        if (start)
          for (size_t i = 0; i < p.storage.size(); ++i)
            std::memcpy(p.storage[i].value.data(), (*start)[i].data(), (*start)[i].nbytes());
        ZeroAdamW opt(ctx, ctx.comm, p.ptrs, adamw(clip), z);
        if (load) opt.load_state_dict(ctx, *load);
        const int me = ctx.comm->rank();
        std::vector<float> norms;
        for (int s = first_step; s < first_step + steps; ++s) {
          opt.zero_grad(ctx);
          for (int m = me; m < global; m += world) {
            const bool last = m + world >= global;
            if (hook && last) opt.begin_final_backward();
            for (size_t j = 0; j < p.storage.size(); ++j) {
              const size_t i = hook ? p.storage.size() - 1 - j : j;
              const Tensor g = grad_of(static_cast<int64_t>(i), m, s);
              float* d = p.storage[i].grad.data_as<float>();
              for (int64_t k = 0; k < g.numel(); ++k) d[k] += g.data_as<const float>()[k];
              if (hook) opt.grads_ready(ctx, {&p.storage[i]});
            }
          }
          norms.push_back(opt.step(ctx, 1e-2f).grad_norm);
          if (hook)
            EXPECT_EQ(opt.buckets_sent_early(), static_cast<int64_t>(opt.layout().buckets.size()));
        }
        io::NamedTensors state = opt.state_dict(ctx);  // collective
        if (me == 0) {
          for (Parameter& q : p.storage) out.weights.push_back(q.value.to_host(ctx));
          out.norms = norms;
          out.state = std::move(state);
        }
      },
      kTimeout);
  return out;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i)
    EXPECT_TRUE(test::bitwise_equal(a.weights[i], b.weights[i])) << what << ": p" << i;
  EXPECT_EQ(a.norms, b.norms) << what;
  ASSERT_EQ(a.state.size(), b.state.size());
  for (size_t i = 0; i < a.state.size(); ++i)
    EXPECT_TRUE(test::bitwise_equal(a.state[i].second, b.state[i].second))
        << what << ": " << a.state[i].first;
}

TEST(ZeroAdamW, SameWeightsBitForBitAtEveryWorldSize) {
  for (int world : {2, 3, 4}) {
    const Outcome one = run(1, world, 0, 3, 1.0f);
    const Outcome many = run(world, world, 0, 3, 1.0f);
    expect_same(one, many, "world " + std::to_string(world));
  }
}

TEST(ZeroLayout, BucketsHoldWholeConsecutivePiecesAndEveryRankAPaddedPart) {
  for (int w : {1, 2, 4})
    for (int64_t bucket : {int64_t{1}, int64_t{777}, int64_t{2500}, INT64_MAX}) {
      const ZeroLayout l = ZeroLayout::make(kSizes, kPiece, w, bucket);
      const ZeroLayout one = ZeroLayout::make(kSizes, kPiece, 1);
      ASSERT_EQ(l.pieces.size(), one.pieces.size());
      int next = 0;
      int64_t shard = 0;
      for (size_t b = 0; b < l.buckets.size(); ++b) {
        const ZeroLayout::Bucket& k = l.buckets[b];
        EXPECT_EQ(k.first, next);
        EXPECT_LT(k.first, k.end);
        EXPECT_EQ(k.shard_offset, shard);
        int64_t n = 0;
        std::vector<int64_t> part(static_cast<size_t>(w), 0);
        for (int i = k.first; i < k.end; ++i) {
          const ZeroLayout::Piece& c = l.pieces[static_cast<size_t>(i)];
          EXPECT_EQ(c.numel, one.pieces[static_cast<size_t>(i)].numel);
          EXPECT_EQ(c.bucket, static_cast<int>(b));
          EXPECT_EQ(c.shard_offset, k.shard_offset + part[static_cast<size_t>(c.rank)]);
          part[static_cast<size_t>(c.rank)] += c.numel;
          n += c.numel;
        }
        // At most bucket_elems, unless one piece alone is larger.
        EXPECT_TRUE(n <= bucket || k.end - k.first == 1) << "bucket " << b;
        EXPECT_EQ(k.part, *std::max_element(part.begin(), part.end()));
        next = k.end;
        shard += k.part;
      }
      EXPECT_EQ(next, static_cast<int>(l.pieces.size()));
      EXPECT_EQ(l.max_shard, shard);
      if (bucket == 1) EXPECT_EQ(l.buckets.size(), l.pieces.size());  // a bucket per piece
      if (bucket == INT64_MAX) EXPECT_EQ(l.buckets.size(), 1u);
    }
  EXPECT_THROW(ZeroLayout::make(kSizes, kPiece, 2, 0), Error);
}

// The buckets change what travels together and when, never a bit of the result: every bucket size,
// sent after the backward or during it (the hook), at DP 2 and 4, equals one rank with one bucket,
// with one micro-batch per rank and with gradient accumulation (2 per rank). One bucket per
// parameter: pieces as large as the largest parameter and buckets of one element.
TEST(ZeroAdamW, BucketsSentDuringTheBackwardGiveTheSameBits) {
  const int64_t whole = 3 * 4096 + 5;
  for (const int64_t piece : {kPiece, whole}) {
    for (int world : {2, 4}) {
      for (int accum : {1, 2}) {
        const int global = world * accum;
        const Outcome ref = run(1, global, 0, 3, 0.5f, nullptr, nullptr, {piece, INT64_MAX});
        const Outcome unbucketed =
            run(world, global, 0, 3, 0.5f, nullptr, nullptr, {piece, INT64_MAX});
        expect_same(ref, unbucketed, "one bucket, world " + std::to_string(world));
        for (int64_t bucket : {int64_t{1}, int64_t{777}, int64_t{5000}, INT64_MAX})
          for (bool hook : {false, true}) {
            const Outcome got =
                run(world, global, 0, 3, 0.5f, nullptr, nullptr, {piece, bucket}, hook);
            const std::string what = "piece " + std::to_string(piece) + ", world " +
                                     std::to_string(world) + ", accum " + std::to_string(accum) +
                                     ", bucket " + std::to_string(bucket) +
                                     (hook ? ", during the backward" : ", after it");
            if (accum == 1)
              expect_same(ref, got, what);  // one rank sums the micro-batches in rank order too
            else
              expect_same(unbucketed, got, what);
          }
      }
    }
  }
}

TEST(ZeroAdamW, StateSavedAtFourResumesAtTwoAndOne) {
  const Outcome straight = run(1, 4, 0, 4, 1.0f);
  const Outcome first = run(4, 4, 0, 2, 1.0f);
  const Outcome at2 = run(2, 4, 2, 2, 1.0f, &first.state, &first.weights);
  const Outcome at1 = run(1, 4, 2, 2, 1.0f, &first.state, &first.weights);
  ASSERT_EQ(at2.weights.size(), straight.weights.size());
  for (size_t i = 0; i < straight.weights.size(); ++i) {
    EXPECT_TRUE(test::bitwise_equal(straight.weights[i], at2.weights[i])) << "p" << i;
    EXPECT_TRUE(test::bitwise_equal(straight.weights[i], at1.weights[i])) << "p" << i;
  }
}

// Against the single-device optimizer on the summed gradient: without clipping the update is the
// same per element (bit for bit). With clipping the norms are summed in a different order and
// agree to FP32 rounding (relative 1e-6); the clipped gradients then differ in the last bit, which
// now and then flips the BF16 rounding of a moment (a relative 2^-8 change in m or v), so a few
// weights move by up to about lr * 2^-7 per step: most stay bit-identical, none moves further.
TEST(ZeroAdamW, AgreesWithAdamWOptimizer) {
  for (float clip : {0.0f, 0.5f}) {
    const Outcome zero = run(2, 2, 0, 3, clip);
    Context ctx = make_context(Device::kCpu);
    Params p = make_params(ctx);
    AdamWOptimizer ref(ctx, p.ptrs, adamw(clip));
    for (int s = 0; s < 3; ++s) {
      ref.zero_grad(ctx);
      for (size_t i = 0; i < p.storage.size(); ++i) {
        const Tensor g0 = grad_of(static_cast<int64_t>(i), 0, s);
        const Tensor g1 = grad_of(static_cast<int64_t>(i), 1, s);
        float* d = p.storage[i].grad.data_as<float>();
        for (int64_t k = 0; k < g0.numel(); ++k)
          d[k] = g0.data_as<const float>()[k] + g1.data_as<const float>()[k];
      }
      ref.step(ctx, 1e-2f);
      const StepStats st = ref.finish_step(ctx);
      EXPECT_NEAR(st.grad_norm, zero.norms[static_cast<size_t>(s)], 1e-6 * st.grad_norm);
    }
    for (size_t i = 0; i < p.storage.size(); ++i) {
      if (clip == 0.0f) {
        EXPECT_TRUE(test::bitwise_equal(p.storage[i].value, zero.weights[i])) << "p" << i;
        continue;
      }
      const float* a = p.storage[i].value.data_as<const float>();
      const float* b = zero.weights[i].data_as<const float>();
      const int64_t n = p.storage[i].value.numel();
      int64_t differ = 0;
      for (int64_t k = 0; k < n; ++k) {
        differ += a[k] != b[k];
        ASSERT_NEAR(a[k], b[k], 3 * 1e-2f / 128) << "p" << i << "[" << k << "]";
      }
      EXPECT_LE(differ, n / 20 + 1) << "p" << i;
    }
  }
}

TEST(ZeroAdamW, ANonFiniteGradientOnOneRankSkipsEveryRank) {
  run_inprocess_ranks_or_throw(
      3,
      [&](Context& ctx) {
        Params p = make_params(ctx);
        std::vector<Tensor> before;
        for (Parameter& q : p.storage) before.push_back(q.value.to_host(ctx));
        ZeroAdamW opt(ctx, ctx.comm, p.ptrs, adamw(1.0f), {kPiece, 777});
        opt.zero_grad(ctx);
        if (ctx.comm->rank() == 2) p.storage[3].grad.data_as<float>()[0] = NAN;
        const StepStats s = opt.step(ctx, 1e-2f);
        EXPECT_TRUE(s.skipped);
        EXPECT_EQ(opt.steps_taken(), 0);
        for (size_t i = 0; i < p.storage.size(); ++i)
          EXPECT_TRUE(test::bitwise_equal(before[i], p.storage[i].value));
      },
      kTimeout);
}

TEST(ZeroAdamW, RanksWithDifferentParametersAreRefused) {
  const std::vector<std::string> errors = run_inprocess_ranks(
      2,
      [&](Context& ctx) {
        Params p = make_params(ctx);
        if (ctx.comm->rank() == 1) p.ptrs.pop_back();
        ZeroAdamW opt(ctx, ctx.comm, p.ptrs, adamw(1.0f));
      },
      kTimeout);
  for (const std::string& e : errors)
    EXPECT_NE(e.find("data-parallel rank 1 holds different parameters"), std::string::npos) << e;
}

}  // namespace
}  // namespace octet::train
