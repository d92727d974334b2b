// CPU reference for gemm.h: an emulation of Hopper's FP8 GEMM, element by element.
//
// For each D[i, j] the products a[i, c] * b[j, c] of raw FP8 values (exact in FP32) are summed over
// a segment of K in the emulated accumulator; at the end of a segment the partial sum is promoted
// into an FP32 accumulator, multiplied by the group's scales when they vary along K (DeepGEMM's
// `accum += partial * (scale_a * scale_b)`). Segments end every `promote_interval` elements and,
// for block-scaled operands, at every 128-group boundary. Per-tensor and row scales multiply the
// final FP32 sum, as cuBLASLt applies SCALAR_32F and OUTER_VEC_32F scales in its epilogue.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "numerics/scale.h"
#include "ops/gemm/gemm_cpu.h"

namespace octet::cpu {
namespace {

// Truncates x (round toward zero) to `bits` fraction bits; x is the exact sum of a short partial
// and an FP8 product, so the double it arrives in holds it exactly.
double truncate_mantissa(double x, int bits) {
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  u &= ~((uint64_t{1} << (52 - bits)) - 1);
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// Sum of products over [c0, c1) in the emulated accumulator, returned as the FP32 value promoted.
float partial_sum(const float* a, const float* b, int64_t c0, int64_t c1, int bits) {
  if (bits == 0) {
    float p = 0.0f;
    for (int64_t c = c0; c < c1; ++c) p += a[c] * b[c];  // each product is exact in FP32
    return p;
  }
  double p = 0.0;
  for (int64_t c = c0; c < c1; ++c)
    p = truncate_mantissa(p + static_cast<double>(a[c]) * static_cast<double>(b[c]), bits);
  return static_cast<float>(p);  // exact: at most 23 fraction bits
}

int64_t next_boundary(int64_t c, int64_t k, int64_t promote, bool per_group) {
  int64_t end = k;
  if (promote > 0) end = std::min(end, (c / promote + 1) * promote);
  if (per_group) end = std::min(end, (c / kGroup + 1) * kGroup);
  return end;
}

void store(const RefOutput& d, int64_t i, int64_t j, float v, Accumulate acc) {
  if (d.dtype == DType::kF32) {
    float* p = static_cast<float*>(d.p) + i * d.ld + j;
    *p = acc == Accumulate::kAdd ? *p + v : v;
  } else {
    static_cast<uint16_t*>(d.p)[i * d.ld + j] = float_to_bf16(v);
  }
}

}  // namespace

float RefMatrix::scale(int64_t r, int64_t kg) const {
  switch (g) {
    case Granularity::kTensor:
      return s[0];
    case Granularity::kRow:
      return s[r];
    case Granularity::k1x128:
      return layout == ScaleLayout::kKMajor ? s[r * s_ld + kg] : s[kg * s_ld + r];
    case Granularity::k128x128:
      return s[(r / kGroup) * s_ld + kg];
    case Granularity::k128x1:
      break;
  }
  OCTET_THROW("gemm reference: unsupported granularity ", granularity_name(g));
}

std::vector<float> decode_values(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  const auto* p8 = t.data_as<const uint8_t>();
  const auto* p16 = t.data_as<const uint16_t>();
  for (size_t i = 0; i < v.size(); ++i) {
    switch (t.dtype()) {
      case DType::kE4M3:
        v[i] = e4m3_to_float(p8[i]);
        break;
      case DType::kE5M2:
        v[i] = e5m2_to_float(p8[i]);
        break;
      case DType::kBF16:
        v[i] = bf16_to_float(p16[i]);
        break;
      case DType::kF32:
        v[i] = t.data_as<const float>()[i];
        break;
      default:
        OCTET_THROW("gemm reference: cannot decode ", dtype_name(t.dtype()));
    }
  }
  return v;
}

RefMatrix ref_matrix(const std::vector<float>& values, const Fp8Operand& op) {
  RefMatrix m;
  m.v = values.data();
  m.ld = op.cols();
  m.rows = op.rows();
  m.k = op.cols();
  m.g = op.granularity;
  m.s = op.scale_inv.data_as<const float>();
  m.layout = scale_layout(op.granularity, op.scale_inv);
  m.s_ld = m.layout == ScaleLayout::kMNMajor
               ? mn_major_ld(op.rows())
               : scale_shape(op.granularity, op.rows(), op.cols()).back();
  return m;
}

// The plain FP32 accumulator (mantissa_bits == 0), 16 outputs of a row at a time over a transposed
// copy of B so that the inner loop vectorises. Each output still adds its products in increasing
// K with the same operations as the element-by-element loop below, so the results are identical;
// this is only faster (the CPU trainer spends most of its time here).
namespace {

void reference_gemm_fp32(const RefMatrix& a, const RefMatrix& b, Accumulate acc, const RefOutput& d,
                         bool per_group, int64_t promote) {
  constexpr int64_t kW = 16;
  const int64_t k = a.k, n = b.rows, np = (n + kW - 1) / kW * kW;
  std::vector<float> bt(static_cast<size_t>(k * np), 0.0f);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < k; ++c) bt[static_cast<size_t>(c * np + j)] = b.v[j * b.ld + c];
  for (int64_t i = 0; i < a.rows; ++i) {
    const float* ar = a.v + i * a.ld;
    for (int64_t j0 = 0; j0 < n; j0 += kW) {
      const int64_t jw = std::min(kW, n - j0);
      float total[kW] = {};
      for (int64_t c = 0; c < k;) {
        const int64_t end = next_boundary(c, k, promote, per_group);
        float part[kW] = {};
        for (int64_t cc = c; cc < end; ++cc) {
          const float av = ar[cc];
          const float* br = bt.data() + cc * np + j0;
          for (int64_t jj = 0; jj < kW; ++jj) part[jj] += av * br[jj];
        }
        if (per_group) {
          const int64_t kg = c / kGroup;
          for (int64_t jj = 0; jj < jw; ++jj)
            total[jj] = std::fma(part[jj], a.scale(i, kg) * b.scale(j0 + jj, kg), total[jj]);
        } else {
          for (int64_t jj = 0; jj < jw; ++jj) total[jj] += part[jj];
        }
        c = end;
      }
      for (int64_t jj = 0; jj < jw; ++jj) {
        float t = total[jj];
        if (!per_group) t *= a.scale(i, 0) * b.scale(j0 + jj, 0);
        store(d, i, j0 + jj, t, acc);
      }
    }
  }
}

}  // namespace

void reference_gemm(const RefMatrix& a, const RefMatrix& b, const AccumulatorEmulation& emu,
                    Accumulate acc, const RefOutput& d) {
  const bool per_group = scales_vary_along_k(a.g) || scales_vary_along_k(b.g);
  if (emu.mantissa_bits == 0) {
    reference_gemm_fp32(a, b, acc, d, per_group, emu.promote_interval);
    return;
  }
  const int64_t k = a.k;
  for (int64_t i = 0; i < a.rows; ++i) {
    const float* ar = a.v + i * a.ld;
    for (int64_t j = 0; j < b.rows; ++j) {
      const float* br = b.v + j * b.ld;
      float total = 0.0f;
      for (int64_t c = 0; c < k;) {
        const int64_t end = next_boundary(c, k, emu.promote_interval, per_group);
        const float partial = partial_sum(ar, br, c, end, emu.mantissa_bits);
        if (per_group) {
          const int64_t kg = c / kGroup;
          total = std::fma(partial, a.scale(i, kg) * b.scale(j, kg), total);
        } else {
          total += partial;
        }
        c = end;
      }
      if (!per_group) total *= a.scale(i, 0) * b.scale(j, 0);
      store(d, i, j, total, acc);
    }
  }
}

void gemm_fp8(Context&, const GemmFp8Args& args) {
  const std::vector<float> av = decode_values(args.a.data), bv = decode_values(args.b.data);
  reference_gemm(ref_matrix(av, args.a), ref_matrix(bv, args.b), args.emulation, args.accumulate,
                 {args.d.data(), args.d.dtype(), args.d.cols()});
}

namespace {
// The values of a BF16 / F32 operand as a K-major (rows, K) matrix, transposing an MN-major one.
std::vector<float> k_major_values(const Tensor& t, OperandLayout layout, int64_t& rows,
                                  int64_t& k) {
  std::vector<float> v = decode_values(t);
  rows = t.rows(), k = t.cols();
  if (layout == OperandLayout::kKMajor) return v;
  std::swap(rows, k);
  std::vector<float> out(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c) out[r * k + c] = v[c * rows + r];
  return out;
}
}  // namespace

void gemm_bf16(Context&, const GemmBf16Args& args) {
  int64_t m = 0, ka = 0, n = 0, kb = 0;
  const std::vector<float> av = k_major_values(args.a, args.a_layout, m, ka),
                           bv = k_major_values(args.b, args.b_layout, n, kb);
  static const float kOne = 1.0f;
  RefMatrix a{av.data(), ka, m, ka, Granularity::kTensor, &kOne, 1};
  RefMatrix b{bv.data(), kb, n, kb, Granularity::kTensor, &kOne, 1};
  reference_gemm(a, b, AccumulatorEmulation::fp32(), args.accumulate,
                 {args.d.data(), args.d.dtype(), args.d.cols()});
}

}  // namespace octet::cpu
