// Internal (CUDA builds only): octet's cuBLASLt layer. GemmState (declared in core/context.h) owns
// the cuBLASLt handle, the workspace and the plan cache; run_lt_matmul() runs one matmul described
// in cuBLAS's column-major terms, building its plan (descriptors + the heuristic's algorithm) on
// first use.
#pragma once

#include <cublasLt.h>

#include <map>
#include <memory>
#include <tuple>

#include "core/context.h"

namespace octet {

namespace cuda {

// D (m x n, column-major, ldd) [+]= alpha * op(A) op(B) with op(A) = A^T for A stored (k x m, lda)
// and B stored (k x n, ldb): the "TN" form, the only one FP8 tensor cores take. BF16 may also take
// A stored (m x k) (a_transposed = false: op(A) = A) and B stored (n x k) (b_transposed = true:
// op(B) = B^T). Scales are device pointers read in the layout of their mode (see gemm_cuda.cu);
// null for BF16.
struct LtMatmul {
  int64_t m = 0, n = 0, k = 0;
  cudaDataType_t a_type = CUDA_R_8F_E4M3, b_type = CUDA_R_8F_E4M3, d_type = CUDA_R_32F;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* d = nullptr;
  int64_t ldd = 0;
  cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
  bool fast_accum = false;
  bool accumulate = false;   // beta = 1 with C = D
  bool a_transposed = true;  // op(A) = A^T, A stored (k x m): the TN form
  bool b_transposed = false;
};

void run_lt_matmul(Context& ctx, const LtMatmul& mm);

// A short description for error messages ("FP8 E4M3 x E4M3 -> BF16, m=.. n=.. k=.., modes
// VEC128/BLK").
std::string describe(const LtMatmul& mm);

}  // namespace cuda

struct GemmPlan;

struct GemmState {
  // Everything that changes the descriptors or the heuristic's answer, pointer alignments included
  // (cuBLASLt assumes 256-byte aligned pointers unless told otherwise, and grouped GEMMs pass
  // sub-tensors that are not).
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,  // m n k lda ldb ldd
                         int, int, int, int, int,    // types, scale modes
                         bool, bool, int, int, int,  // fast, acc, alignments
                         bool, bool>;                // transposes

  cublasLtHandle_t handle = nullptr;
  Tensor workspace;
  std::map<Key, std::unique_ptr<GemmPlan>> plans;

  GemmState() = default;
  GemmState(const GemmState&) = delete;
  GemmState& operator=(const GemmState&) = delete;
  ~GemmState();
};

// The context's GemmState, made on first use (handle, 32 MiB workspace).
GemmState& gemm_state(Context& ctx);

}  // namespace octet
