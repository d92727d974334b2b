// Helpers shared by the grouped GEMM tests (CPU and GPU): MoE layouts with empty and skewed
// experts, per-expert quantized weights, and the per-expert dense GEMMs they must equal.
#pragma once

#include <cstring>
#include <numeric>

#include "gemm_test_util.h"
#include "ops/grouped_gemm/grouped_gemm.h"

namespace octet::test {

inline Tensor group_sizes_tensor(const std::vector<int64_t>& sizes, DType dt) {
  Tensor t = Tensor::empty({static_cast<int64_t>(sizes.size())}, dt);
  for (size_t e = 0; e < sizes.size(); ++e) {
    if (dt == DType::kI32)
      t.data_as<int32_t>()[e] = static_cast<int32_t>(sizes[e]);
    else
      t.data_as<int64_t>()[e] = sizes[e];
  }
  return t;
}

inline std::vector<int64_t> offsets_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> off(sizes.size(), 0);
  for (size_t e = 1; e < sizes.size(); ++e) off[e] = off[e - 1] + sizes[e - 1];
  return off;
}

// Rows [r0, r0 + rows) of a host tensor, as a new (rows, cols) tensor.
inline Tensor host_rows(const Tensor& t, int64_t r0, int64_t rows) {
  Tensor out = Tensor::empty({rows, t.cols()}, t.dtype());
  const int64_t row_bytes = t.cols() * dtype_size(t.dtype());
  if (rows)
    std::memcpy(out.data(), static_cast<const char*>(t.data()) + r0 * row_bytes, rows * row_bytes);
  return out;
}

// Columns [c0, c0 + cols) of a host tensor (any dtype).
inline Tensor host_cols(const Tensor& t, int64_t c0, int64_t cols) {
  Tensor out = Tensor::empty({t.rows(), cols}, t.dtype());
  const int64_t es = dtype_size(t.dtype());
  for (int64_t i = 0; i < t.rows(); ++i)
    std::memcpy(static_cast<char*>(out.data()) + i * cols * es,
                static_cast<const char*>(t.data()) + (i * t.cols() + c0) * es,
                static_cast<size_t>(cols * es));
  return out;
}

// E experts' (n, k) weights, each quantized 128x128 on its own and stacked: data (E * n, k),
// scale_inv (E, ceil(n/128), ceil(k/128)). Also returns the dequantized stack (E * n, k) f32.
struct StackedWeights {
  Fp8Operand op;
  Tensor dequantized;
};

inline StackedWeights stack_experts(Context& cpu, const std::vector<Tensor>& w) {
  const int64_t experts = static_cast<int64_t>(w.size()), n = w[0].rows(), k = w[0].cols();
  const int64_t nb = ceil_div(n, kGroup), kb = ceil_div(k, kGroup);
  StackedWeights s;
  s.op.granularity = Granularity::k128x128;
  s.op.data = Tensor::empty({experts * n, k}, DType::kE4M3);
  s.op.scale_inv = Tensor::empty({experts, nb, kb}, DType::kF32);
  s.dequantized = Tensor::empty({experts * n, k}, DType::kF32);
  for (int64_t e = 0; e < experts; ++e) {
    const QuantTensor q = quant(cpu, w[static_cast<size_t>(e)], Granularity::k128x128,
                                Fp8Format::kE4M3, QuantizeOutput::kRowwise);
    std::memcpy(s.op.data.data_as<uint8_t>() + e * n * k, q.data.data(),
                static_cast<size_t>(n * k));
    std::memcpy(s.op.scale_inv.data_as<float>() + e * nb * kb, q.scale_inv.data(),
                static_cast<size_t>(nb * kb * 4));
    const Tensor dq = dequantize(cpu, q, DType::kF32);
    std::memcpy(s.dequantized.data_as<float>() + e * n * k, dq.data(),
                static_cast<size_t>(n * k * 4));
  }
  return s;
}

// Rows [r0, r0 + rows) of a block-scaled (1x128 or 128x128) host operand, with scale rows
// [scale_row0, scale_row0 + scale_rows), as a dense operand of gemm.h.
inline Fp8Operand expert_rows(const Fp8Operand& op, int64_t r0, int64_t rows, int64_t scale_row0,
                              int64_t scale_rows) {
  Fp8Operand o = op;
  o.data = host_rows(op.data, r0, rows);
  const int64_t s_cols = ceil_div(op.cols(), kGroup);
  o.scale_inv = host_rows(op.scale_inv.reshape({op.scale_inv.numel() / s_cols, s_cols}), scale_row0,
                          scale_rows);
  return o;
}

inline uint64_t total(const std::vector<int64_t>& sizes) {
  return static_cast<uint64_t>(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}));
}

}  // namespace octet::test
