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

GemmRecipe block_scaled() {
  GemmRecipe g;
  g.precision = GemmPrecision::kFp8Block;
  g.forward_format = Fp8Format::kE4M3;  // DeepSeek-V3: E4M3 for every tensor
  g.backward_format = Fp8Format::kE4M3;
  return g;
}

// The FP8 settings a site takes when an override switches it to FP8 in this recipe.
GemmRecipe fp8_like(const Recipe& r, GemmPrecision p) {
  if (p == GemmPrecision::kFp8Block) return block_scaled();
  const bool delayed = r.name == "fp8-tensor-delayed";
  return tensor_scaled(delayed ? ScalingMode::kDelayed : ScalingMode::kCurrent);
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

std::vector<std::string> recipe_names() {
  return {"bf16", "fp8-tensor-delayed", "fp8-tensor-current", "deepseek", "fp8-flow"};
}

Recipe recipe_preset(std::string_view name) {
  Recipe r;
  r.name = std::string(name);
  if (name == "bf16") return r;
  if (name == "fp8-tensor-delayed" || name == "fp8-tensor-current") {
    const ScalingMode mode =
        name == "fp8-tensor-delayed" ? ScalingMode::kDelayed : ScalingMode::kCurrent;
    for (GemmSite s : kHeavySites) r.at(s) = tensor_scaled(mode);
    r.attn_out_input = Storage::kFp8;
    return r;
  }
  if (name == "deepseek" || name == "fp8-flow") {
    for (GemmSite s : kHeavySites) r.at(s) = block_scaled();
    // Power-of-2 scales where DeepSeek-V3 requires them (reference/fp8-facts.md section 4): the
    // input of the Linear after attention, the MoE up-projection input (the FP8 dispatch payload),
    // the SwiGLU output feeding the down-projection, and the activation gradient before the
    // down-projection.
    r.at(GemmSite::kAttnOut).activation_rounding = ScaleRounding::kPow2;
    r.at(GemmSite::kExpertGateUp).activation_rounding = ScaleRounding::kPow2;
    r.at(GemmSite::kExpertDown).activation_rounding = ScaleRounding::kPow2;
    r.at(GemmSite::kExpertDown).gradient_rounding = ScaleRounding::kPow2;
    r.attn_out_input = Storage::kE5M6;
    r.moe_dispatch = Storage::kFp8;
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

void Recipe::validate() const {
  OCTET_CHECK(amax_history_len >= 1 && amax_history_len <= (1 << 20), "recipe ", name,
              ": amax_history_len must be in [1, 2^20], got ", amax_history_len);
  OCTET_CHECK(margin >= 0 && margin <= 64, "recipe ", name, ": margin must be in [0, 64], got ",
              margin);
  const GemmRecipe& up = at(GemmSite::kExpertGateUp);
  OCTET_CHECK(moe_dispatch != Storage::kE5M6, "recipe ", name,
              ": moe_dispatch must be bf16 or fp8");
  OCTET_CHECK(moe_dispatch != Storage::kFp8 || up.precision == GemmPrecision::kFp8Block, "recipe ",
              name,
              ": an FP8 MoE dispatch carries 1x128 tiles, so gemm.expert.gate_up must be "
              "fp8-block (it is ",
              gemm_precision_name(up.precision), ")");
  if (fp8_flow) {
    const GemmRecipe& down = at(GemmSite::kExpertDown);
    OCTET_CHECK(moe_dispatch == Storage::kFp8, "recipe ", name,
                ": fp8_flow needs moe_dispatch=fp8");
    OCTET_CHECK(down.precision == GemmPrecision::kFp8Block, "recipe ", name,
                ": fp8_flow keeps every tensor between dispatch and combine in FP8, so "
                "gemm.expert.down must "
                "be fp8-block");
    for (const GemmRecipe* g : {&up, &down})
      OCTET_CHECK(g->activation_rounding == ScaleRounding::kPow2 &&
                      g->gradient_rounding == ScaleRounding::kPow2,
                  "recipe ", name,
                  ": fp8_flow's scaling-aware transpose needs power-of-2 scales on the "
                  "expert GEMMs");
  }
  for (int i = 0; i < kGemmSiteCount; ++i) {
    const GemmRecipe& g = gemm[static_cast<size_t>(i)];
    OCTET_CHECK(g.precision != GemmPrecision::kFp8Block ||
                    (g.forward_format == Fp8Format::kE4M3 && g.backward_format == Fp8Format::kE4M3),
                "recipe ", name, ": site ", gemm_site_name(static_cast<GemmSite>(i)),
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
    bool matched = false;
    for (int i = 0; i < kGemmSiteCount; ++i) {
      const auto s = static_cast<GemmSite>(i);
      if (site != "*" && site != gemm_site_name(s)) continue;
      matched = true;
      if (r.at(s).precision == p) continue;
      r.at(s) = p == GemmPrecision::kBf16 ? GemmRecipe{} : fp8_like(r, p);
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
      r.moe_dispatch = Storage::kBf16, r.fp8_flow = false;
  } else if (key == "attn_out_input") {
    r.attn_out_input = parse_choice<Storage>(
        key, value, {{"bf16", Storage::kBf16}, {"fp8", Storage::kFp8}, {"e5m6", Storage::kE5M6}});
  } else if (key == "moe_dispatch") {
    r.moe_dispatch =
        parse_choice<Storage>(key, value, {{"bf16", Storage::kBf16}, {"fp8", Storage::kFp8}});
  } else if (key == "fp8_flow") {
    r.fp8_flow = parse_choice<bool>(key, value, {{"true", true}, {"false", false}});
  } else if (key == "amax_history_len") {
    r.amax_history_len = parse_int(key, value);
  } else if (key == "amax_reduction") {
    r.amax_reduction = parse_choice<AmaxReduction>(
        key, value, {{"max", AmaxReduction::kMax}, {"most_recent", AmaxReduction::kMostRecent}});
  } else if (key == "margin") {
    r.margin = static_cast<int>(parse_int(key, value));
  } else {
    OCTET_THROW(
        "recipe override: unknown key '", key,
        "' (expected gemm.<site>, attn_out_input, moe_dispatch, fp8_flow, amax_history_len, "
        "amax_reduction or margin)");
  }
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
     << storage_name(r.moe_dispatch) << (r.fp8_flow ? "; FP8-Flow casting-free MoE dataflow" : "")
     << "\n";
  os << "always: embedding, router, MTP projection, head BF16; RMSNorm, softmax, accumulation "
        "FP32; master "
        "weights and gradients FP32; AdamW moments BF16\n";
  return os.str();
}

}  // namespace octet
