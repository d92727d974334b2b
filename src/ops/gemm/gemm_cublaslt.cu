// cuBLASLt descriptors, heuristic and plan cache behind ops/gemm (see gemm_cublaslt.h).
#include "ops/gemm/gemm_cublaslt.h"

#include <sstream>

#include "backend/cuda_check.h"

#define OCTET_CUBLAS_CHECK(expr)                                                          \
  do {                                                                                    \
    const cublasStatus_t octet_st_ = (expr);                                              \
    if (octet_st_ != CUBLAS_STATUS_SUCCESS) {                                             \
      OCTET_THROW("cuBLASLt error in ", #expr, ": ", cublasLtGetStatusString(octet_st_)); \
    }                                                                                     \
  } while (0)

namespace octet {

// Hopper kernels use up to 32 MiB for split-K and stream-K reductions (cuBLAS documentation,
// "cublasSetWorkspace": 32 MiB recommended on Hopper).
constexpr int64_t kWorkspaceBytes = int64_t{32} << 20;

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~GemmPlan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

GemmState::~GemmState() {
  plans.clear();
  if (handle) cublasLtDestroy(handle);
}

GemmState& gemm_state(Context& ctx) {
  if (!ctx.gemm) {
    auto st = std::make_shared<GemmState>();
    OCTET_CUBLAS_CHECK(cublasLtCreate(&st->handle));
    st->workspace = Tensor::empty(ctx, {kWorkspaceBytes}, DType::kU8);
    ctx.gemm = st;
  }
  return *ctx.gemm;
}

namespace cuda {
namespace {

int alignment(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (u % static_cast<uintptr_t>(a)) != 0) a /= 2;
  return a;
}

const char* type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_8F_E4M3:
      return "E4M3";
    case CUDA_R_8F_E5M2:
      return "E5M2";
    case CUDA_R_16BF:
      return "BF16";
    case CUDA_R_32F:
      return "F32";
    default:
      return "?";
  }
}

const char* mode_name(cublasLtMatmulMatrixScale_t m) {
  switch (m) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F:
      return "SCALAR_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F:
      return "OUTER_VEC_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F:
      return "VEC128_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F:
      return "BLK128x128_32F";
    default:
      return "?";
  }
}

bool is_fp8(cudaDataType_t t) {
  return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2;
}

template <typename T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& v) {
  OCTET_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &v, sizeof v));
}

std::unique_ptr<GemmPlan> make_plan(GemmState& st, const LtMatmul& mm) {
  auto plan = std::make_unique<GemmPlan>();
  OCTET_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_attr(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, mm.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attr(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, mm.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N);
  if (is_fp8(mm.a_type)) {
    set_attr(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, static_cast<int32_t>(mm.a_mode));
    set_attr(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, static_cast<int32_t>(mm.b_mode));
    set_attr(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, mm.a_scale);
    set_attr(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, mm.b_scale);
    set_attr(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
             static_cast<int8_t>(mm.fast_accum ? 1 : 0));
  }
  // Layouts describe the operands as stored (column-major rows x cols).
  OCTET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, mm.a_type, mm.a_transposed ? mm.k : mm.m,
                                                mm.a_transposed ? mm.m : mm.k, mm.lda));
  OCTET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, mm.b_type, mm.b_transposed ? mm.n : mm.k,
                                                mm.b_transposed ? mm.k : mm.n, mm.ldb));
  OCTET_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, mm.d_type, mm.m, mm.n, mm.ldd));

  cublasLtMatmulPreference_t pref = nullptr;
  OCTET_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = static_cast<uint64_t>(st.workspace.nbytes());
  const uint32_t al_a = alignment(mm.a), al_b = alignment(mm.b), al_d = alignment(mm.d);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof ws);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                       sizeof al_a);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                       sizeof al_b);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d,
                                       sizeof al_d);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d,
                                       sizeof al_d);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(
      st.handle, plan->desc, plan->a, plan->b, plan->d, plan->d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  OCTET_CHECK(hs == CUBLAS_STATUS_SUCCESS && found > 0, "gemm: cuBLASLt has no kernel for ",
              describe(mm), " (heuristic: ", cublasLtGetStatusString(hs), ", ", found,
              " algorithms)");
  plan->algo = result.algo;
  return plan;
}

}  // namespace

std::string describe(const LtMatmul& mm) {
  std::ostringstream os;
  os << type_name(mm.a_type) << " x " << type_name(mm.b_type) << " -> " << type_name(mm.d_type)
     << " (cuBLAS column-major m=" << mm.m << " n=" << mm.n << " k=" << mm.k << ", lda=" << mm.lda
     << " ldb=" << mm.ldb << " ldd=" << mm.ldd << ", alignments A/B/D " << alignment(mm.a) << "/"
     << alignment(mm.b) << "/" << alignment(mm.d) << " bytes, op(A) "
     << (mm.a_transposed ? "T" : "N") << " op(B) " << (mm.b_transposed ? "T" : "N");
  if (is_fp8(mm.a_type))
    os << ", scale modes " << mode_name(mm.a_mode) << "/" << mode_name(mm.b_mode)
       << (mm.fast_accum ? ", fast accumulation" : "");
  os << (mm.accumulate ? ", D +=" : "") << ")";
  return os.str();
}

void run_lt_matmul(Context& ctx, const LtMatmul& mm) {
  if (mm.m == 0 || mm.n == 0) return;
  GemmState& st = gemm_state(ctx);
  const GemmState::Key key{mm.m,
                           mm.n,
                           mm.k,
                           mm.lda,
                           mm.ldb,
                           mm.ldd,
                           mm.a_type,
                           mm.b_type,
                           mm.d_type,
                           mm.a_mode,
                           mm.b_mode,
                           mm.fast_accum,
                           mm.accumulate,
                           alignment(mm.a),
                           alignment(mm.b),
                           alignment(mm.d),
                           mm.a_transposed,
                           mm.b_transposed};
  auto it = st.plans.find(key);
  if (it == st.plans.end()) it = st.plans.emplace(key, make_plan(st, mm)).first;
  GemmPlan& plan = *it->second;
  if (is_fp8(mm.a_type)) {
    set_attr(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, mm.a_scale);
    set_attr(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, mm.b_scale);
  }
  const float alpha = 1.0f, beta = mm.accumulate ? 1.0f : 0.0f;
  OCTET_CUBLAS_CHECK(cublasLtMatmul(st.handle, plan.desc, &alpha, mm.a, plan.a, mm.b, plan.b, &beta,
                                    mm.d, plan.d, mm.d, plan.d, &plan.algo, st.workspace.data(),
                                    static_cast<size_t>(st.workspace.nbytes()),
                                    static_cast<cudaStream_t>(ctx.stream)));
}

}  // namespace cuda

int64_t gemm_cached_plans(const Context& ctx) {
  return ctx.gemm ? static_cast<int64_t>(ctx.gemm->plans.size()) : 0;
}

}  // namespace octet
