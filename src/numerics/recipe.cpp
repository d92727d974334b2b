#include "numerics/recipe.h"

#include <charconv>
#include <cstdio>
#include <sstream>

#include "core/check.h"
#include "core/quant_tensor.h"

namespace octet {
namespace {

constexpr GemmSite kHeavySites[] = {
    GemmSite::kAttnQDown,  GemmSite::kAttnQUp,      GemmSite::kAttnKvDown, GemmSite::kAttnKvUp,
    GemmSite::kAttnOut,    GemmSite::kDenseGateUp,  GemmSite::kDenseDown,  GemmSite::kExpertGateUp,
    GemmSite::kExpertDown, GemmSite::kSharedGateUp, GemmSite::kSharedDown,
};

GemmRecipe tensor_scaled(ScalingMode mode) {
  GemmRecipe g;
  g.precision = GemmPrecision::kFp8Tensor;
  g.scaling = mode;
  g.forward_format = Fp8Format::kE4M3;
  g.backward_format = Fp8Format::kE5M2;  // HYBRID: gradients need E5M2's range
  return g;
}

// DeepSeek-V3's block scaling at one site: E4M3 for every tensor, and power-of-2 scales where the
// report requires them (reference/fp8-facts.md section 4): the input of the Linear after
// attention, the MoE up-projection input (the FP8 dispatch payload), the SwiGLU output feeding the
// down-projection, and the activation gradient before the down-projection.
GemmRecipe block_scaled(GemmSite s) {
  GemmRecipe g;
  g.precision = GemmPrecision::kFp8Block;
  g.forward_format = Fp8Format::kE4M3;
  g.backward_format = Fp8Format::kE4M3;
  if (s == GemmSite::kAttnOut || s == GemmSite::kExpertGateUp || s == GemmSite::kExpertDown)
    g.activation_rounding = ScaleRounding::kPow2;
  if (s == GemmSite::kExpertDown) g.gradient_rounding = ScaleRounding::kPow2;
  return g;
}

// The FP8 settings a site takes when an override switches it to FP8 in this recipe.
GemmRecipe fp8_like(const Recipe& r, GemmSite s, GemmPrecision p) {
  return p == GemmPrecision::kFp8Block ? block_scaled(s) : tensor_scaled(r.tensor_scaling);
}

template <typename E, size_t N>
E parse_choice(std::string_view key, std::string_view value,
               const std::pair<const char*, E> (&table)[N]) {
  std::string list;
  for (const auto& [name, e] : table) {
    if (value == name) return e;
    if (!list.empty()) list += '|';
    list += name;
  }
  OCTET_THROW("recipe override ", key, ": bad value '", value, "', expected ", list);
}

int64_t parse_int(std::string_view key, std::string_view value) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  OCTET_CHECK(ec == std::errc() && end == value.data() + value.size(), "recipe override ", key,
              ": bad value '", value, "', expected an integer");
  return v;
}

}  // namespace

const char* gemm_site_name(GemmSite s) {
  switch (s) {
    case GemmSite::kAttnQDown:
      return "attn.q_down";
    case GemmSite::kAttnQUp:
      return "attn.q_up";
    case GemmSite::kAttnKvDown:
      return "attn.kv_down";
    case GemmSite::kAttnKvUp:
      return "attn.kv_up";
    case GemmSite::kAttnOut:
      return "attn.out";
    case GemmSite::kDenseGateUp:
      return "dense.gate_up";
    case GemmSite::kDenseDown:
      return "dense.down";
    case GemmSite::kExpertGateUp:
      return "expert.gate_up";
    case GemmSite::kExpertDown:
      return "expert.down";
    case GemmSite::kSharedGateUp:
      return "shared.gate_up";
    case GemmSite::kSharedDown:
      return "shared.down";
    case GemmSite::kRouter:
      return "router";
    case GemmSite::kMtpProj:
      return "mtp.proj";
    case GemmSite::kHead:
      return "head";
    case GemmSite::kCount:
      break;
  }
  return "?";
}

const char* gemm_precision_name(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::kBf16:
      return "bf16";
    case GemmPrecision::kFp8Tensor:
      return "fp8-tensor";
    case GemmPrecision::kFp8Block:
      return "fp8-block";
  }
  return "?";
}

const char* storage_name(Storage s) {
  switch (s) {
    case Storage::kBf16:
      return "bf16";
    case Storage::kFp8:
      return "fp8";
    case Storage::kE5M6:
      return "e5m6";
  }
  return "?";
}

const char* fp8_transpose_name(Fp8Transpose t) {
  switch (t) {
    case Fp8Transpose::kScalingAware:
      return "scaling-aware";
    case Fp8Transpose::kRequantize:
      return "requantize";
    case Fp8Transpose::kRequantizeExact:
      return "requantize-exact";
  }
  return "?";
}

std::vector<std::string> recipe_names() {
  return {"bf16", "fp8-tensor-delayed", "fp8-tensor-current", "deepseek", "fp8-flow"};
}

std::string RecipeSpec::label() const {
  std::string s = preset;
  for (size_t i = 0; i < overrides.size(); ++i) s += (i ? ", " : " + ") + overrides[i];
  return s;
}

bool Recipe::any_fp8() const {
  for (const GemmRecipe& g : gemm)
    if (g.is_fp8()) return true;
  return false;
}

Recipe recipe_preset(std::string_view name) {
  Recipe r;
  r.spec.preset = std::string(name);
  if (name == "bf16") return r;
  if (name == "fp8-tensor-delayed" || name == "fp8-tensor-current") {
    r.tensor_scaling = name == "fp8-tensor-delayed" ? ScalingMode::kDelayed : ScalingMode::kCurrent;
    for (GemmSite s : kHeavySites) r.at(s) = tensor_scaled(r.tensor_scaling);
    r.attn_out_input = Storage::kFp8;
    return r;
  }
  if (name == "deepseek" || name == "fp8-flow") {
    for (GemmSite s : kHeavySites) r.at(s) = block_scaled(s);
    r.attn_out_input = Storage::kE5M6;
    r.moe_dispatch = Storage::kFp8;
    r.moe_swiglu_input = Storage::kFp8;  // DeepSeek-V3: SwiGLU input cached in FP8 (fp8-facts 4)
    if (name == "fp8-flow") {
      // The scaling-aware transpose builds every Wgrad operand between dispatch and combine from
      // the row-wise copy, which needs power-of-2 scales in both directions.
      r.at(GemmSite::kExpertGateUp).gradient_rounding = ScaleRounding::kPow2;
      r.fp8_flow = true;
    }
    return r;
  }
  std::string list;
  for (const auto& n : recipe_names()) {
    if (!list.empty()) list += ", ";
    list += n;
  }
  OCTET_THROW("unknown recipe '", name, "' (known: ", list, ")");
}

Recipe resolve_recipe(const RecipeSpec& spec) {
  Recipe r;
  try {
    r = recipe_preset(spec.preset);
  } catch (const Error& e) {
    OCTET_THROW("recipe: ", e.what());
  }
  for (size_t i = 0; i < spec.overrides.size(); ++i) {
    try {
      apply_recipe_override(r, spec.overrides[i]);
    } catch (const Error& e) {
      OCTET_THROW("recipe_overrides[", i, "] '", spec.overrides[i], "': ", e.what());
    }
  }
  r.validate();
  return r;
}

GemmRecipe::Quantization GemmRecipe::quantization(GemmOperand operand) const {
  const bool block = precision == GemmPrecision::kFp8Block;
  switch (operand) {
    case GemmOperand::kActivation:
      return {forward_format, block ? Granularity::k1x128 : Granularity::kTensor,
              activation_rounding};
    case GemmOperand::kWeight:  // 128x128 blocks, so W^T (the column-wise copy) has the same ones
      return {forward_format, block ? Granularity::k128x128 : Granularity::kTensor,
              ScaleRounding::kExact};
    case GemmOperand::kGradient:
      return {backward_format, block ? Granularity::k1x128 : Granularity::kTensor,
              gradient_rounding};
  }
  return {};
}

void Recipe::validate() const {
  const std::string n = name();
  OCTET_CHECK(amax_history_len >= 1 && amax_history_len <= (1 << 20), "recipe ", n,
              ": amax_history_len must be in [1, 2^20], got ", amax_history_len);
  OCTET_CHECK(margin >= 0 && margin <= 64, "recipe ", n, ": margin must be in [0, 64], got ",
              margin);
  OCTET_CHECK(!at(GemmSite::kRouter).is_fp8(), "recipe ", n,
              ": the router runs in BF16 with FP32 scores in every recipe "
              "(gemm.router cannot be FP8)");
  const GemmRecipe& up = at(GemmSite::kExpertGateUp);
  OCTET_CHECK(moe_dispatch != Storage::kE5M6, "recipe ", n, ": moe_dispatch must be bf16 or fp8");
  OCTET_CHECK(moe_swiglu_input != Storage::kE5M6, "recipe ", n,
              ": moe_swiglu_input must be bf16 or fp8");
  OCTET_CHECK(moe_swiglu_input == Storage::kBf16 || !at(GemmSite::kExpertDown).is_delayed(),
              "recipe ", n,
              ": moe_swiglu_input=fp8 needs the down projection recomputed in backward, which "
              "delayed scaling at gemm.expert.down does not allow");
  OCTET_CHECK(moe_dispatch != Storage::kFp8 || up.precision == GemmPrecision::kFp8Block, "recipe ",
              n, ": an FP8 MoE dispatch carries 1x128 tiles, ",
              "so gemm.expert.gate_up must be fp8-block (it is ", gemm_precision_name(up.precision),
              ")");
  // The dispatch payload is quantized once with gate_up's activation settings; the experts' Wgrad
  // copy of it then comes from the scaling-aware transpose, which is exact for power-of-2 scales
  // only.
  OCTET_CHECK(moe_dispatch != Storage::kFp8 || up.activation_rounding == ScaleRounding::kPow2,
              "recipe ", n, ": an FP8 MoE dispatch needs power-of-2 activation scales on ",
              "gemm.expert.gate_up (the scaling-aware transpose makes its Wgrad copy)");
  if (fp8_flow) {
    const GemmRecipe& down = at(GemmSite::kExpertDown);
    OCTET_CHECK(moe_dispatch == Storage::kFp8, "recipe ", n, ": fp8_flow needs moe_dispatch=fp8");
    OCTET_CHECK(down.precision == GemmPrecision::kFp8Block, "recipe ", n,
                ": fp8_flow keeps every tensor between dispatch and combine in FP8, so "
                "gemm.expert.down must be fp8-block");
    for (const GemmRecipe* g : {&up, &down})
      OCTET_CHECK(g->activation_rounding == ScaleRounding::kPow2 &&
                      g->gradient_rounding == ScaleRounding::kPow2,
                  "recipe ", n, ": fp8_flow's scaling-aware transpose ",
                  "needs power-of-2 scales on the expert GEMMs");
  }
  for (int i = 0; i < kGemmSiteCount; ++i) {
    const GemmRecipe& g = gemm[static_cast<size_t>(i)];
    OCTET_CHECK(g.precision != GemmPrecision::kFp8Block ||
                    (g.forward_format == Fp8Format::kE4M3 && g.backward_format == Fp8Format::kE4M3),
                "recipe ", n, ": site ", gemm_site_name(static_cast<GemmSite>(i)),
                ": block scaling uses E4M3 for every tensor");
  }
}

void apply_recipe_override(Recipe& r, std::string_view assignment) {
  const size_t eq = assignment.find('=');
  OCTET_CHECK(eq != std::string_view::npos, "recipe override '", assignment,
              "': expected key=value");
  const std::string_view key = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  if (key.rfind("gemm.", 0) == 0) {
    const std::string_view site = key.substr(5);
    const GemmPrecision p = parse_choice<GemmPrecision>(key, value,
                                                        {{"bf16", GemmPrecision::kBf16},
                                                         {"fp8-tensor", GemmPrecision::kFp8Tensor},
                                                         {"fp8-block", GemmPrecision::kFp8Block}});
    OCTET_CHECK(site != gemm_site_name(GemmSite::kRouter) || p == GemmPrecision::kBf16,
                "recipe override ", key,
                ": the router site runs in BF16 with FP32 scores in "
                "every recipe (DeepSeek-V3) and cannot be switched to ",
                value);
    bool matched = false;
    for (int i = 0; i < kGemmSiteCount; ++i) {
      const auto s = static_cast<GemmSite>(i);
      if (site != "*" && site != gemm_site_name(s)) continue;
      matched = true;
      if (r.at(s).precision == p || s == GemmSite::kRouter) continue;
      r.at(s) = p == GemmPrecision::kBf16 ? GemmRecipe{} : fp8_like(r, s, p);
    }
    if (!matched) {
      std::string list;
      for (int i = 0; i < kGemmSiteCount; ++i) {
        if (i) list += '|';
        list += gemm_site_name(static_cast<GemmSite>(i));
      }
      OCTET_THROW("recipe override ", key, ": unknown GEMM site '", site, "', expected ", list,
                  " or *");
    }
    if (site == "*" && p == GemmPrecision::kBf16)
      r.moe_dispatch = Storage::kBf16, r.fp8_flow = false, r.moe_swiglu_input = Storage::kBf16;
  } else if (key == "attn_out_input") {
    r.attn_out_input = parse_choice<Storage>(
        key, value, {{"bf16", Storage::kBf16}, {"fp8", Storage::kFp8}, {"e5m6", Storage::kE5M6}});
  } else if (key == "moe_dispatch") {
    r.moe_dispatch =
        parse_choice<Storage>(key, value, {{"bf16", Storage::kBf16}, {"fp8", Storage::kFp8}});
  } else if (key == "moe_swiglu_input") {
    r.moe_swiglu_input =
        parse_choice<Storage>(key, value, {{"bf16", Storage::kBf16}, {"fp8", Storage::kFp8}});
  } else if (key == "fp8_flow") {
    r.fp8_flow = parse_choice<bool>(key, value, {{"true", true}, {"false", false}});
  } else if (key == "fp8_transpose") {
    r.fp8_transpose =
        parse_choice<Fp8Transpose>(key, value,
                                   {{"scaling-aware", Fp8Transpose::kScalingAware},
                                    {"requantize", Fp8Transpose::kRequantize},
                                    {"requantize-exact", Fp8Transpose::kRequantizeExact}});
  } else if (key == "amax_history_len") {
    r.amax_history_len = parse_int(key, value);
  } else if (key == "amax_reduction") {
    r.amax_reduction = parse_choice<AmaxReduction>(
        key, value, {{"max", AmaxReduction::kMax}, {"most_recent", AmaxReduction::kMostRecent}});
  } else if (key == "margin") {
    r.margin = static_cast<int>(parse_int(key, value));
  } else {
    OCTET_THROW("recipe override: unknown key '", key,
                "' (expected gemm.<site>, attn_out_input, "
                "moe_dispatch, moe_swiglu_input, fp8_flow, fp8_transpose, amax_history_len, "
                "amax_reduction or margin)");
  }
  r.spec.overrides.emplace_back(assignment);
  r.validate();
}

std::string recipe_table(const Recipe& r) {
  std::ostringstream os;
  auto rounding = [](ScaleRounding x) { return x == ScaleRounding::kPow2 ? "pow2" : "exact"; };
  char line[160];
  std::snprintf(line, sizeof line, "%-15s %-11s %-8s %-10s %-10s\n", "gemm site", "precision",
                "scaling", "formats", "scales");
  os << line;
  for (int i = 0; i < kGemmSiteCount; ++i) {
    const GemmRecipe& g = r.gemm[static_cast<size_t>(i)];
    std::string formats = "bf16", scaling = "-", scales = "-";
    if (g.is_fp8()) {
      formats = std::string(format_name(g.forward_format)) + "/" + format_name(g.backward_format);
      scaling = g.precision == GemmPrecision::kFp8Block
                    ? "blocks"
                    : (g.scaling == ScalingMode::kDelayed ? "delayed" : "current");
      scales = std::string(rounding(g.activation_rounding)) + "/" + rounding(g.gradient_rounding);
    }
    std::snprintf(line, sizeof line, "%-15s %-11s %-8s %-10s %-10s\n",
                  gemm_site_name(static_cast<GemmSite>(i)), gemm_precision_name(g.precision),
                  scaling.c_str(), formats.c_str(), scales.c_str());
    os << line;
  }
  os << "o_proj input cached as " << storage_name(r.attn_out_input) << "; MoE dispatch payload "
     << storage_name(r.moe_dispatch) << "; MoE SwiGLU input cached as "
     << storage_name(r.moe_swiglu_input) << "; column-wise copies of FP8 tensors by "
     << (r.fp8_transpose == Fp8Transpose::kScalingAware
             ? std::string("the scaling-aware transpose")
             : std::string("dequantize + requantize (") + fp8_transpose_name(r.fp8_transpose) + ")")
     << "\n";
  if (r.fp8_flow)
    os << "FP8-Flow MoE dataflow: every tensor between the dispatch and the combine stays FP8 in "
          "both directions (x and dy quantized once, 1x128 pow2, before their dispatch; SwiGLU and "
          "dSwiGLU fused with the quantization of their outputs; routing weights applied in "
          "SwiGLU, the combine an unweighted BF16 sum with FP32 accumulation)\n";
  os << "always: embedding BF16; router BF16 with FP32 scores; RMSNorm, softmax, accumulation "
        "FP32; master weights and gradients FP32; AdamW moments BF16\n";
  return os.str();
}

}  // namespace octet
