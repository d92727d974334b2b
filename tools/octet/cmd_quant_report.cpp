// `octet quant-report`: what each FP8 scaling recipe costs in accuracy on real tensors, before a
// run commits to one. Quantization and dequantization go through the library's ops (on the chosen
// device); the statistics are computed on the host in double precision.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cli.h"
#include "core/context.h"
#include "io/safetensors.h"
#include "ops/quantize/quantize.h"

namespace octet::cli {
namespace {

struct Recipe {
  const char* name;
  Fp8Format format;
  Granularity granularity;
  ScaleRounding rounding;
};

// Per-tensor scaling (TransformerEngine's default) against DeepSeek-V3's fine-grained groups: 1x128
// for activations, 128x128 for weights, with and without the power-of-2 scales of FP8-Flow-MoE.
constexpr Recipe kRecipes[] = {
    {"tensor e4m3", Fp8Format::kE4M3, Granularity::kTensor, ScaleRounding::kExact},
    {"tensor e5m2", Fp8Format::kE5M2, Granularity::kTensor, ScaleRounding::kExact},
    {"row e4m3", Fp8Format::kE4M3, Granularity::kRow, ScaleRounding::kExact},
    {"1x128 e4m3", Fp8Format::kE4M3, Granularity::k1x128, ScaleRounding::kExact},
    {"1x128 e4m3 pow2", Fp8Format::kE4M3, Granularity::k1x128, ScaleRounding::kPow2},
    {"128x128 e4m3", Fp8Format::kE4M3, Granularity::k128x128, ScaleRounding::kExact},
    {"128x128 e4m3 pow2", Fp8Format::kE4M3, Granularity::k128x128, ScaleRounding::kPow2},
};

// Scaled magnitudes above the largest finite value plus half the spacing below it would round past
// it in a format without a top: those are the values the saturating cast clips. Below that bound
// the cast returns the nearest value anyway (current scaling puts amax * scale within FP32 rounding
// of fp8_max).
float clip_bound(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? 448.0f + 16.0f : 57344.0f + 4096.0f;
}

// Group of element (i, j) in the row-major scale_inv layout of numerics/scale.h.
struct GroupMap {
  int64_t gh, gw, gcols;
  GroupMap(Granularity g, int64_t rows, int64_t cols) {
    const int64_t r = std::max<int64_t>(rows, 1), c = std::max<int64_t>(cols, 1);
    gh = g == Granularity::kTensor
             ? r
             : (g == Granularity::k128x1 || g == Granularity::k128x128 ? kGroup : 1);
    gw = g == Granularity::kTensor || g == Granularity::kRow
             ? c
             : (g == Granularity::k1x128 || g == Granularity::k128x128 ? kGroup : 1);
    gcols = ceil_div(c, gw);
  }
  int64_t operator()(int64_t i, int64_t j) const { return (i / gh) * gcols + j / gw; }
};

// The scale the quantizer applied to each group, recomputed with its rule: scale_inv does not give
// it back exactly (1 / (1 / s) need not round to s).
std::vector<float> group_scales(const std::vector<float>& x, int64_t rows, int64_t cols,
                                const Recipe& r, const GroupMap& map) {
  std::vector<uint32_t> amax(static_cast<size_t>(map(rows - 1, cols - 1) + 1), 0u);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      uint32_t& a = amax[static_cast<size_t>(map(i, j))];
      a = std::max(a, abs_bits(x[static_cast<size_t>(i * cols + j)]));
    }
  const ScaleRule rule{.format = r.format, .rounding = r.rounding, .epsilon = 0.0f, .margin = 0};
  std::vector<float> scales(amax.size());
  for (size_t k = 0; k < amax.size(); ++k) scales[k] = compute_scale(bits_float(amax[k]), rule);
  return scales;
}

struct Stats {
  double snr_db = 0;
  double flushed = 0;    // share of nonzero finite values that dequantize to zero
  double saturated = 0;  // share of finite values clipped at the FP8 maximum
  double max_rel_err = 0;
  int64_t nonfinite = 0;  // excluded from every statistic
};

Stats measure(const std::vector<float>& x, const float* deq, int64_t rows, int64_t cols,
              const Recipe& r) {
  const GroupMap map(r.granularity, rows, cols);
  const std::vector<float> scales = group_scales(x, rows, cols, r, map);
  const float bound = clip_bound(r.format);
  double signal = 0, noise = 0;
  int64_t finite = 0, nonzero = 0, flushed = 0, saturated = 0;
  Stats s;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const size_t k = static_cast<size_t>(i * cols + j);
      const double v = x[k], err = v - static_cast<double>(deq[k]);
      if (!std::isfinite(v)) {
        ++s.nonfinite;
        continue;
      }
      ++finite;
      signal += v * v;
      noise += err * err;
      if (std::fabs(rn::mul(x[k], scales[static_cast<size_t>(map(i, j))])) > bound) ++saturated;
      if (v == 0) continue;
      ++nonzero;
      if (deq[k] == 0.0f) ++flushed;
      s.max_rel_err = std::max(s.max_rel_err, std::fabs(err / v));
    }
  }
  s.snr_db = noise == 0 ? INFINITY : 10.0 * std::log10(signal / noise);
  s.flushed = nonzero ? static_cast<double>(flushed) / static_cast<double>(nonzero) : 0.0;
  s.saturated = finite ? static_cast<double>(saturated) / static_cast<double>(finite) : 0.0;
  return s;
}

std::vector<float> host_floats(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kF32) {
    std::copy_n(t.data_as<const float>(), v.size(), v.begin());
  } else {
    const uint16_t* p = t.data_as<const uint16_t>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_float(p[i]);
  }
  return v;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

using Table = std::vector<std::vector<std::string>>;

// Appends one row per recipe for the host tensor `t` (f32 or bf16, numel > 0). Names come from the
// file and are printed through printable(): a name may hold terminal escape sequences.
void report_tensor(Context& ctx, const std::string& name, const Tensor& t, Table& table,
                   std::vector<std::string>& notes) {
  const int64_t rows = t.rows(), cols = t.cols();
  const std::vector<float> x = host_floats(t);
  QuantizeArgs args;
  args.input = t.reshape({rows, cols});
  if (ctx.device != Device::kCpu) args.input = args.input.to(ctx, ctx.device);
  int64_t nonfinite = 0;
  for (const Recipe& r : kRecipes) {
    args.format = r.format;
    args.granularity = r.granularity;
    args.rounding = r.rounding;
    const QuantTensor q = quantize(ctx, args);
    Tensor deq = dequantize(ctx, q, DType::kF32);
    if (deq.device() != Device::kCpu) deq = deq.to_host(ctx);
    const Stats s = measure(x, deq.data_as<const float>(), rows, cols, r);
    nonfinite = s.nonfinite;
    table.push_back({printable(name), shape_str(t.shape()), std::string(dtype_name(t.dtype())),
                     r.name, std::isinf(s.snr_db) ? std::string("inf") : fmt("%.2f", s.snr_db),
                     fmt("%.4f%%", 100.0 * s.flushed), fmt("%.4f%%", 100.0 * s.saturated),
                     fmt("%.2e", s.max_rel_err)});
  }
  if (nonfinite)
    notes.push_back("'" + printable(name) + "': " + std::to_string(nonfinite) +
                    " non-finite values left out of the statistics");
}

void print_table(const Table& table) {
  std::vector<size_t> width(table.front().size(), 0);
  for (const auto& row : table)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  // Text columns (tensor, shape, dtype, recipe) left-aligned, numbers right-aligned.
  constexpr size_t kTextColumns = 4;
  for (const auto& row : table) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      line += (c ? "  " : "") + (c < kTextColumns ? row[c] + pad : pad + row[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  }
}

// A stand-in for an LLM activation: Gaussian bulk, 0.5% outliers 2^8..2^12 larger (the massive
// activations that make per-tensor scaling lose the bulk) and a few rows 2^-20 smaller (such as
// padding tokens, which a coarse scale flushes to zero). Seeded, so every run reports the same
// numbers.
Tensor demo_tensor() {
  constexpr int64_t kRows = 1024, kCols = 4096;
  std::mt19937_64 rng(0x0C7E7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::uniform_int_distribution<int> outlier_exp(8, 12);
  Tensor t = Tensor::empty({kRows, kCols}, DType::kF32);
  float* p = t.data_as<float>();
  for (int64_t i = 0; i < kRows; ++i) {
    const float row_scale = i % 128 == 37 ? 0x1p-20f : 1.0f;
    for (int64_t j = 0; j < kCols; ++j) {
      float v = normal(rng) * row_scale;
      if (uniform(rng) < 0.005f) v = std::ldexp(v, outlier_exp(rng));
      p[i * kCols + j] = v;
    }
  }
  return t;
}

// Non-empty F32/BF16 tensors, except the scales of tensors already in FP8 (DeepSeek-V3's
// `weight_scale_inv`): quantizing a scale says nothing about a recipe.
bool reportable(const io::SafetensorsFile& f, const std::string& name, const Tensor& t) {
  if ((t.dtype() != DType::kF32 && t.dtype() != DType::kBF16) || t.numel() == 0) return false;
  const std::string suffix = "_scale_inv";
  if (name.size() <= suffix.size() ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return true;
  const std::string base = name.substr(0, name.size() - suffix.size());
  return !(f.contains(base) && is_fp8(f.at(base).dtype()));
}

int run_quant_report(const std::vector<std::string>& argv) {
  const Args args(argv, {"device"}, {"demo"});
  args.expect_positional(0, 1, "octet quant-report IN|--demo [--device cpu|cuda]");
  const bool demo = args.has("demo");
  OCTET_CHECK(demo != (args.positional().size() == 1),
              demo ? "give IN or --demo, not both" : "missing IN (a safetensors file), or --demo");
  const Device device =
      args.choice("device", {"cpu", "cuda"}, "cpu") == "cuda" ? Device::kCuda : Device::kCpu;
  Context ctx = make_context(device);

  io::SafetensorsFile file;
  if (demo) {
    file.path = "demo";
    file.tensors.emplace_back("demo.activation", demo_tensor());
    std::printf(
        "demo: synthetic activation [1024, 4096] f32: N(0, 1), 0.5%% outliers x 2^8..2^12, "
        "8 rows x 2^-20\n\n");
  } else {
    file = io::read_safetensors(args.positional()[0]);
  }
  Table table = {
      {"tensor", "shape", "dtype", "recipe", "snr_db", "flushed", "saturated", "max_rel_err"}};
  std::vector<std::string> notes;
  int skipped = 0;
  for (const auto& [name, t] : file.tensors) {
    if (!reportable(file, name, t)) {
      ++skipped;
      continue;
    }
    report_tensor(ctx, name, t, table, notes);
  }
  OCTET_CHECK(table.size() > 1, file.path, ": no non-empty F32 or BF16 tensor to report on");
  print_table(table);
  if (skipped)
    notes.push_back(std::to_string(skipped) +
                    " tensor(s) skipped: not F32/BF16, empty, or the scale of an FP8 tensor");
  for (const auto& n : notes) std::printf("note: %s\n", n.c_str());
  return 0;
}

}  // namespace

Command quant_report_command() {
  return {
      "quant-report", "accuracy of FP8 scaling recipes on the tensors of a safetensors file",
      "usage: octet quant-report IN [--device cpu|cuda]\n"
      "       octet quant-report --demo [--device cpu|cuda]\n\n"
      "For every F32/BF16 tensor of the safetensors file IN (leading dimensions flattened into "
      "rows)\n"
      "and every recipe, quantizes and dequantizes it and prints one table row:\n"
      "  snr_db       10 log10(sum x^2 / sum (x - deq)^2), in double; inf when exact\n"
      "  flushed      share of nonzero values that dequantize to zero (underflow)\n"
      "  saturated    share of values the cast clipped: |x * scale| beyond the largest FP8 value "
      "by\n"
      "               more than half its spacing (current scaling clips only beside inf or NaN)\n"
      "  max_rel_err  largest |x - deq| / |x| over nonzero values\n"
      "Non-finite values are left out of the statistics. Recipes: per-tensor e4m3 and e5m2, "
      "row-wise\n"
      "e4m3, 1x128 e4m3 (DeepSeek-V3 activations), 128x128 e4m3 (its weights), the last two also "
      "with\n"
      "power-of-2 scales. Tensors of other dtypes, and the F32 <name>_scale_inv of FP8 tensors, "
      "are\n"
      "skipped.\n\n"
      "flags:\n"
      "  --demo                  report on a seeded synthetic activation (1024x4096, Gaussian "
      "with\n"
      "                          0.5% large outliers and a few tiny rows) instead of IN\n"
      "  --device cpu|cuda       where to quantize (default cpu); the numbers are the same",
      run_quant_report};
}

}  // namespace octet::cli
