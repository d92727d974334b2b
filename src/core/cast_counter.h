// Cast counting: how many times the ops convert between the wide formats (BF16, FP32) and FP8,
// so that a dataflow's casts are counted, not claimed (FP8-Flow-MoE, reference/fp8-facts.md
// section 5: 12 explicit casts per MoE layer in a BF16-centred flow, 2 in FP8-Flow).
//
// The ops layer reports every conversion it performs to the Context's counter when one is attached
// (Context::casts; null, the default, costs one branch). The model names the region the casts
// belong to with a CastScope ("moe.routed", ...); conversions outside any scope count under
// "other". Counts are per call of the op on the host, so they are exact whatever the device and
// never synchronise.
//
// What counts as what:
//   kQuantize      an explicit BF16/FP32 -> FP8 quantization: one per FP8 copy written by
//                  ops/quantize quantize() (row-wise and column-wise copies count one each: each is
//                  its own rounding of the wide tensor)
//   kFusedQuantize a quantization fused into the op that computes the wide value (SwiGLU +
//                  quantize, dSwiGLU + quantize): the wide tensor never exists in memory
//   kDequantize    an FP8 -> BF16/FP32 dequantization (ops/quantize dequantize())
//   kTranspose     a scaling-aware transpose, FP8 -> FP8 without a wide intermediate
//   kScaleRelayout not a cast of values: a dense FP8 GEMM operand (ops/gemm gemm_fp8) whose 1x128
//                  scales are K-major, which the CUDA backend re-lays out into cuBLASLt's
//                  MN-major layout on that call (core/scale_layout.h); counted on every device
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "core/context.h"

namespace octet {

enum class CastKind : uint8_t {
  kQuantize,
  kFusedQuantize,
  kDequantize,
  kTranspose,
  kScaleRelayout,
  kCount
};
inline constexpr int kCastKindCount = static_cast<int>(CastKind::kCount);

inline const char* cast_kind_name(CastKind k) {
  switch (k) {
    case CastKind::kQuantize:
      return "quantize";
    case CastKind::kFusedQuantize:
      return "fused_quantize";
    case CastKind::kDequantize:
      return "dequantize";
    case CastKind::kTranspose:
      return "fp8_transpose";
    case CastKind::kScaleRelayout:
      return "scale_relayout";
    case CastKind::kCount:
      break;
  }
  return "?";
}

struct CastCounts {
  std::array<int64_t, kCastKindCount> n{};
  int64_t operator[](CastKind k) const { return n[static_cast<size_t>(k)]; }
  int64_t& operator[](CastKind k) { return n[static_cast<size_t>(k)]; }
  // The explicit casts of FP8-Flow-MoE's count: standalone quantizations and dequantizations.
  int64_t explicit_casts() const {
    return (*this)[CastKind::kQuantize] + (*this)[CastKind::kDequantize];
  }
  bool operator==(const CastCounts&) const = default;
};

struct CastCounter {
  std::string scope = "other";                 // the region now running (CastScope sets it)
  std::map<std::string, CastCounts> by_scope;  // accumulated until reset()

  void add(CastKind k, int64_t n) { by_scope[scope][k] += n; }
  CastCounts at(const std::string& s) const {
    const auto it = by_scope.find(s);
    return it == by_scope.end() ? CastCounts{} : it->second;
  }
  void reset() { by_scope.clear(); }
};

// Called by the ops' dispatchers.
inline void count_casts(Context& ctx, CastKind k, int64_t n) {
  if (ctx.casts) ctx.casts->add(k, n);
}

// Stops counting while it lives: for a CPU reference that composes counted ops into what is one
// cast of the op it implements (the fused FP8 dispatch's quantize + permute).
class CastCountPause {
 public:
  explicit CastCountPause(Context& ctx) : ctx_(ctx), counter_(std::move(ctx.casts)) {}
  ~CastCountPause() { ctx_.casts = std::move(counter_); }
  CastCountPause(const CastCountPause&) = delete;
  CastCountPause& operator=(const CastCountPause&) = delete;

 private:
  Context& ctx_;
  std::shared_ptr<CastCounter> counter_;
};

// Names the region of the casts counted while it lives; restores the previous one.
class CastScope {
 public:
  CastScope(Context& ctx, std::string scope) : counter_(ctx.casts.get()) {
    if (counter_ != nullptr) prev_ = std::exchange(counter_->scope, std::move(scope));
  }
  ~CastScope() {
    if (counter_ != nullptr) counter_->scope = std::move(prev_);
  }
  CastScope(const CastScope&) = delete;
  CastScope& operator=(const CastScope&) = delete;

 private:
  CastCounter* counter_;
  std::string prev_;
};

}  // namespace octet
