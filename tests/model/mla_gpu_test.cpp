// MlaLayer on CUDA: with v read in place in kv and dv written into dkv by cuDNN, bitwise the output
// and gradients of the copy-based composition it replaced (mla_test_util.h), in bf16 and deepseek.
#include <gtest/gtest.h>

#include "mla_test_util.h"

namespace octet {
namespace {

// Every dimension a multiple of 16 (the FP8 GEMMs' rule on CUDA), as model_gpu_test's config.
ModelConfig gpu_config() {
  ModelConfig c = test::tiny_model_config();
  c.intermediate_size = 192;
  c.moe_intermediate_size = 64;
  return c;
}

TEST(MlaLayerGpu, MatchesCopyBasedCompositionBitwise) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  for (const char* recipe : {"bf16", "deepseek"})
    for (const bool recompute_k : {true, false})
      test::expect_mla_matches_reference(gpu, gpu_config(), recipe, recompute_k);
}

TEST(MlaLayerGpu, UnalignedNopeCopiesVAndMatchesBitwise) {
  OCTET_REQUIRE_GPU();
  Context gpu = make_context(Device::kCuda);
  ModelConfig c = gpu_config();
  c.qk_nope_head_dim = 12;  // v's window would start at column 12: v is copied
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 16;
  test::expect_mla_matches_reference(gpu, c, "bf16");
}

}  // namespace
}  // namespace octet
