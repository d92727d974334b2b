// `octet quantize` and `octet dequantize`: FP8 quantization of safetensors files, in the layout of
// DeepSeek-V3's released weights (`<name>` in FP8 next to `<name>_scale_inv` in FP32), so that
// files written here and files published that way both dequantize.
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "backend/backend.h"
#include "cli.h"
#include "core/context.h"
#include "io/safetensors.h"
#include "ops/quantize/quantize.h"

namespace octet::cli {
namespace {

// Metadata written by quantize. Dequantize needs only the per-tensor granularity (a 1x128 and a
// 128x128 scale can have the same shape only when both describe the same groups, but the key
// removes any doubt); the others record how the file was made.
constexpr const char* kMetaPrefix = "octet.";
constexpr const char* kMetaFormat = "octet.format";
constexpr const char* kMetaGranularity = "octet.granularity";
constexpr const char* kMetaPow2 = "octet.pow2_scales";
constexpr const char* kMetaColumnwise = "octet.columnwise";
constexpr const char* kMetaTensorGranularity = "octet.granularity.";  // + tensor name

const std::string kScaleSuffix = "_scale_inv";
const std::string kColumnwiseSuffix = "_columnwise";

// Inference order for files without metadata: DeepSeek-V3's weight layout first.
const std::vector<std::pair<std::string, Granularity>> kGranularities = {
    {"128x128", Granularity::k128x128}, {"1x128", Granularity::k1x128},
    {"row", Granularity::kRow},         {"128x1", Granularity::k128x1},
    {"tensor", Granularity::kTensor},
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string strip_suffix(const std::string& s, const std::string& suffix) {
  return s.substr(0, s.size() - suffix.size());
}

Device parse_device(const Args& args) {
  return args.choice("device", {"cpu", "cuda"}, "cpu") == "cuda" ? Device::kCuda : Device::kCpu;
}

Granularity granularity_from_name(const std::string& name) {
  for (const auto& [n, g] : kGranularities)
    if (n == name) return g;
  OCTET_THROW("unknown granularity '", name, "'");
}

// A per-tensor scale is one number, written as a 0-d tensor; the other layouts are scale_shape's.
Shape file_scale_shape(Granularity g, int64_t rows, int64_t cols) {
  return g == Granularity::kTensor ? Shape{} : scale_shape(g, rows, cols);
}

Tensor on_device(Context& ctx, const Tensor& t) {
  return ctx.device == Device::kCpu ? t : t.to(ctx, ctx.device);
}

Tensor on_host(Context& ctx, const Tensor& t) {
  return t.device() == Device::kCpu ? t : t.to_host(ctx);
}

Tensor filled_f32(const Shape& shape, float value) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::fill_n(t.data_as<float>(), t.numel(), value);
  return t;
}

// ---------------------------------------------------------------------------------------------
// quantize

struct QuantizeOptions {
  Fp8Format format = Fp8Format::kE4M3;
  Granularity granularity = Granularity::k1x128;
  ScaleRounding rounding = ScaleRounding::kExact;
  QuantizeOutput output = QuantizeOutput::kRowwise;
};

// Appends `<name>`, `<name>_scale_inv` and, when asked, the column-wise pair.
void quantize_one(Context& ctx, const std::string& name, const Tensor& x,
                  const QuantizeOptions& opt, io::NamedTensors& out) {
  const int64_t rows = x.rows(), cols = x.cols();
  const Granularity g = opt.granularity;
  const bool columnwise = opt.output == QuantizeOutput::kBoth;
  const DType dt = fp8_dtype(opt.format);
  if (x.numel() == 0) {
    // Nothing to scale: scale 1 for every (possibly empty) group, and no kernel launch on zero
    // elements.
    out.emplace_back(name, Tensor::empty(x.shape(), dt));
    out.emplace_back(name + kScaleSuffix, filled_f32(file_scale_shape(g, rows, cols), 1.0f));
    if (columnwise) {
      out.emplace_back(name + kColumnwiseSuffix, Tensor::empty({cols, rows}, dt));
      out.emplace_back(name + kColumnwiseSuffix + kScaleSuffix,
                       filled_f32(file_scale_shape(g, cols, rows), 1.0f));
    }
    return;
  }
  QuantizeArgs args;
  args.input = on_device(ctx, x);
  args.format = opt.format;
  args.granularity = g;
  args.rounding = opt.rounding;
  args.output = opt.output;
  const QuantTensor q = quantize(ctx, args);
  out.emplace_back(name, on_host(ctx, q.data).reshape(x.shape()));
  out.emplace_back(name + kScaleSuffix,
                   on_host(ctx, q.scale_inv).reshape(file_scale_shape(g, rows, cols)));
  if (columnwise) {
    out.emplace_back(name + kColumnwiseSuffix, on_host(ctx, q.columnwise_data));
    out.emplace_back(name + kColumnwiseSuffix + kScaleSuffix,
                     on_host(ctx, q.columnwise_scale_inv).reshape(file_scale_shape(g, cols, rows)));
  }
}

// An F32 `<x>_scale_inv` next to an FP8 `<x>` is already a scale (re-quantizing a quantized file).
bool is_existing_scale(const std::string& name, const std::map<std::string, DType>& dtypes) {
  if (!ends_with(name, kScaleSuffix)) return false;
  const auto it = dtypes.find(strip_suffix(name, kScaleSuffix));
  return it != dtypes.end() && is_fp8(it->second);
}

void check_unique_names(const io::NamedTensors& tensors, const std::string& in_path) {
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors)
    OCTET_CHECK(seen.insert(name).second, in_path, ": two output tensors would be named '", name,
                "': an input tensor already has the name of a quantized tensor's ", kScaleSuffix,
                " or ", kColumnwiseSuffix, " output");
}

int run_quantize(const std::vector<std::string>& argv) {
  const Args args(argv, {"format", "granularity", "device"},
                  {"pow2-scales", "columnwise", "force"});
  args.expect_positional(2, 2, "octet quantize IN OUT [flags] (see --help)");
  QuantizeOptions opt;
  const std::string format = args.choice("format", {"e4m3", "e5m2"}, "e4m3");
  opt.format = format == "e4m3" ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  const std::string granularity =
      args.choice("granularity", {"tensor", "row", "1x128", "128x1", "128x128"}, "1x128");
  opt.granularity = granularity_from_name(granularity);
  opt.rounding = args.has("pow2-scales") ? ScaleRounding::kPow2 : ScaleRounding::kExact;
  opt.output = args.has("columnwise") ? QuantizeOutput::kBoth : QuantizeOutput::kRowwise;
  Context ctx = make_context(parse_device(args));
  const std::string& in_path = args.positional()[0];
  const std::string& out_path = args.positional()[1];
  refuse_output_over_input(in_path, out_path);
  refuse_existing_output(out_path, existing_output(args));

  const io::SafetensorsFile in = io::read_safetensors(in_path);
  std::map<std::string, DType> dtypes;
  for (const auto& [name, t] : in.tensors) dtypes[name] = t.dtype();
  std::map<std::string, std::string> meta = in.metadata;
  meta[kMetaFormat] = format;
  meta[kMetaGranularity] = granularity;
  meta[kMetaPow2] = args.has("pow2-scales") ? "true" : "false";
  meta[kMetaColumnwise] = args.has("columnwise") ? "true" : "false";

  io::NamedTensors out;
  int quantized = 0, copied = 0;
  for (const auto& [name, t] : in.tensors) {
    const bool floating = t.dtype() == DType::kF32 || t.dtype() == DType::kBF16;
    if (floating && !is_existing_scale(name, dtypes)) {
      quantize_one(ctx, name, t, opt, out);
      meta[kMetaTensorGranularity + name] = granularity;
      ++quantized;
    } else {
      out.emplace_back(name, t);
      ++copied;
    }
  }
  check_unique_names(out, in_path);
  io::write_safetensors(out_path, out, meta);
  std::printf("quantized %d tensor%s to %s %s%s%s, copied %d unchanged: %s\n", quantized,
              quantized == 1 ? "" : "s", format.c_str(), granularity.c_str(),
              opt.rounding == ScaleRounding::kPow2 ? " pow2" : "",
              opt.output == QuantizeOutput::kBoth ? " +columnwise" : "", copied, out_path.c_str());
  return 0;
}

// ---------------------------------------------------------------------------------------------
// dequantize

bool scale_fits(Granularity g, int64_t rows, int64_t cols, const Shape& s) {
  if (g == Granularity::kTensor) return shape_numel(s) == 1 && s.size() <= 2;
  return s == scale_shape(g, rows, cols);
}

std::string expected_scale_shapes(int64_t rows, int64_t cols) {
  std::string s;
  for (const auto& [n, g] : kGranularities)
    s += (s.empty() ? "" : ", ") + n + " " + shape_str(file_scale_shape(g, rows, cols));
  return s;
}

// From the metadata when quantize wrote it, else from the scale's shape (DeepSeek-V3's files carry
// no metadata: their 128x128 weight scales are recognised by shape).
Granularity resolve_granularity(const io::SafetensorsFile& in, const std::string& name,
                                const Tensor& data, const Tensor& scale) {
  const int64_t rows = data.rows(), cols = data.cols();
  const std::string scale_name = name + kScaleSuffix;
  // Only the per-tensor key: the file-wide one does not describe FP8 tensors that quantize copied
  // through.
  const auto it = in.metadata.find(kMetaTensorGranularity + name);
  if (it != in.metadata.end()) {
    const Granularity g = granularity_from_name(it->second);
    OCTET_CHECK(scale_fits(g, rows, cols, scale.shape()), in.path, ": tensor '", scale_name,
                "': expected shape ", shape_str(file_scale_shape(g, rows, cols)),
                " for granularity ", it->second, " (metadata '", it->first, "') of a ",
                shape_str(data.shape()), " tensor, got ", shape_str(scale.shape()));
    return g;
  }
  for (const auto& [n, g] : kGranularities)
    if (scale_fits(g, rows, cols, scale.shape())) return g;
  OCTET_THROW(in.path, ": tensor '", scale_name, "': shape ", shape_str(scale.shape()),
              " fits no granularity of a ", shape_str(data.shape()),
              " tensor (expected one of: ", expected_scale_shapes(rows, cols), ")");
}

Tensor dequantize_one(Context& ctx, const io::SafetensorsFile& in, const std::string& name,
                      const Tensor& data, const Tensor& scale, DType out_dtype) {
  const std::string scale_name = in.path + ": tensor '" + name + kScaleSuffix + "'";
  check_dtype(scale, scale_name.c_str(), {DType::kF32});
  const Granularity g = resolve_granularity(in, name, data, scale);
  if (data.numel() == 0) return Tensor::empty(data.shape(), out_dtype);
  QuantTensor q;
  q.format = data.dtype() == DType::kE4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
  q.granularity = g;
  q.data = on_device(ctx, data);
  q.scale_inv = on_device(ctx, scale);
  return on_host(ctx, dequantize(ctx, q, out_dtype)).reshape(data.shape());
}

int run_dequantize(const std::vector<std::string>& argv) {
  const Args args(argv, {"dtype", "device"}, {"force"});
  args.expect_positional(2, 2, "octet dequantize IN OUT [--dtype f32|bf16] [--device cpu|cuda]");
  const DType out_dtype =
      args.choice("dtype", {"f32", "bf16"}, "f32") == "f32" ? DType::kF32 : DType::kBF16;
  Context ctx = make_context(parse_device(args));
  const std::string& out_path = args.positional()[1];
  refuse_output_over_input(args.positional()[0], out_path);
  refuse_existing_output(out_path, existing_output(args));
  const io::SafetensorsFile in = io::read_safetensors(args.positional()[0]);

  std::map<std::string, const Tensor*> index;
  for (const auto& [name, t] : in.tensors) index[name] = &t;
  auto is_pair = [&](const std::string& name) {
    const auto it = index.find(name);
    return it != index.end() && is_fp8(it->second->dtype()) && index.count(name + kScaleSuffix);
  };
  // The transposed copy of a quantized tensor: dropped, the row-wise copy holds the same values.
  auto is_columnwise_copy = [&](const std::string& name, const Tensor& t) {
    if (!ends_with(name, kColumnwiseSuffix) || !is_pair(strip_suffix(name, kColumnwiseSuffix)))
      return false;
    const Tensor& base = *index.at(strip_suffix(name, kColumnwiseSuffix));
    return t.shape() == Shape{base.cols(), base.rows()};
  };

  io::NamedTensors out;
  int dequantized = 0, dropped = 0, copied = 0;
  for (const auto& [name, t] : in.tensors) {
    if (ends_with(name, kScaleSuffix) && is_pair(strip_suffix(name, kScaleSuffix))) continue;
    if (is_pair(name) && is_columnwise_copy(name, t)) {
      ++dropped;
    } else if (is_pair(name)) {
      out.emplace_back(name,
                       dequantize_one(ctx, in, name, t, *index.at(name + kScaleSuffix), out_dtype));
      ++dequantized;
    } else {
      out.emplace_back(name, t);
      ++copied;
    }
  }
  std::map<std::string, std::string> meta;
  for (const auto& [k, v] : in.metadata)
    if (k.rfind(kMetaPrefix, 0) != 0) meta[k] = v;  // the quantization record no longer applies
  io::write_safetensors(out_path, out, meta);
  std::printf(
      "dequantized %d tensor%s to %s, dropped %d column-wise cop%s, copied %d unchanged: %s\n",
      dequantized, dequantized == 1 ? "" : "s", out_dtype == DType::kF32 ? "f32" : "bf16", dropped,
      dropped == 1 ? "y" : "ies", copied, out_path.c_str());
  return 0;
}

}  // namespace

Command quantize_command() {
  return {
      "quantize", "quantize the F32/BF16 tensors of a safetensors file to FP8 with scales",
      "usage: octet quantize IN OUT [--format e4m3|e5m2] [--granularity G] [--pow2-scales]\n"
      "                             [--columnwise] [--device cpu|cuda]\n\n"
      "Reads the safetensors file IN and writes OUT, where every F32 or BF16 tensor <name> "
      "becomes\n"
      "  <name>            FP8 (F8_E4M3 or F8_E5M2), same shape, row-major\n"
      "  <name>_scale_inv  F32, one per group: x ~ q * scale_inv\n"
      "with leading dimensions flattened into rows (a (rows, cols) matrix). Scale shapes by "
      "granularity:\n"
      "  tensor []   row [rows, 1]   1x128 [rows, ceil(cols/128)]   128x1 [ceil(rows/128), cols]\n"
      "  128x128 [ceil(rows/128), ceil(cols/128)]   (DeepSeek-V3's weight layout)\n"
      "Tensors of other dtypes (FP8, F16, integers) are copied through unchanged, as is an F32\n"
      "<name>_scale_inv already paired with an FP8 <name>. The quantization parameters are stored "
      "in\n"
      "__metadata__ (octet.format, octet.granularity, octet.granularity.<name>, ...) for "
      "dequantize.\n"
      "OUT is written atomically: on error nothing is written and an existing OUT is kept.\n"
      "An existing OUT is replaced only with --force; OUT is never IN.\n\n"
      "flags:\n"
      "  --format e4m3|e5m2      FP8 format (default e4m3)\n"
      "  --granularity G         tensor|row|1x128|128x1|128x128 (default 1x128)\n"
      "  --pow2-scales           round each scale down to a power of two (default: exact scales)\n"
      "  --columnwise            also write <name>_columnwise, the transpose [cols, rows] "
      "quantized with\n"
      "                          the same granularity, and <name>_columnwise_scale_inv\n"
      "  --device cpu|cuda       where to quantize (default cpu); results are bit-identical\n"
      "  --force                 replace an existing OUT",
      run_quantize};
}

Command dequantize_command() {
  return {
      "dequantize", "dequantize FP8 tensors with _scale_inv partners back to F32/BF16",
      "usage: octet dequantize IN OUT [--dtype f32|bf16] [--device cpu|cuda]\n\n"
      "Reads the safetensors file IN and writes OUT, where every FP8 tensor <name> that has an "
      "F32\n"
      "<name>_scale_inv partner becomes <name> = q * scale_inv in the original shape. The "
      "granularity\n"
      "comes from the metadata written by `octet quantize`, or else from the scale's shape (files\n"
      "without metadata, such as DeepSeek-V3's released weights with 128x128 weight_scale_inv).\n"
      "Column-wise copies (<name>_columnwise) are dropped; every other tensor is copied through.\n"
      "OUT is written atomically: on error nothing is written and an existing OUT is kept.\n"
      "An existing OUT is replaced only with --force; OUT is never IN.\n\n"
      "flags:\n"
      "  --dtype f32|bf16        output dtype (default f32)\n"
      "  --device cpu|cuda       where to dequantize (default cpu)\n"
      "  --force                 replace an existing OUT",
      run_dequantize};
}

}  // namespace octet::cli
