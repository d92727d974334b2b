// The model's parameters against the checkpoint form: loading a checkpoint's tensors and exporting
// them gives them back bit for bit (fused and stacked weights split again, the MTP copies of the
// shared embedding and head equal to the main ones), and a missing tensor is an error naming it.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "model/init.h"
#include "model/model.h"
#include "test_util.h"
#include "tiny_model.h"

namespace octet {
namespace {

TEST(ModelIo, LoadThenExportIsExact) {
  Context ctx = make_context(Device::kCpu);
  const ModelConfig c = test::tiny_model_config();
  Model m(ctx, c, {recipe_preset("bf16"), DType::kBF16});
  const io::NamedTensors init = init_parameters(c, 11);
  m.load(ctx, init);
  const io::NamedTensors out = m.export_tensors(ctx);
  ASSERT_EQ(out.size(), init.size());
  for (size_t i = 0; i < init.size(); ++i) {
    EXPECT_EQ(out[i].first, init[i].first);
    EXPECT_TRUE(test::bitwise_equal(out[i].second, init[i].second)) << init[i].first;
  }
  // Expert 3's up_proj is rows [F, 2F) of the stacked expert 3 block.
  const Parameter& gu = m.parameter("model.layers.1.mlp.experts.gate_up_proj");
  const int64_t F = c.moe_intermediate_size, D = c.hidden_size;
  const Tensor* up3 = nullptr;
  for (const auto& [n, t] : init)
    if (n == "model.layers.1.mlp.experts.3.up_proj.weight") up3 = &t;
  ASSERT_NE(up3, nullptr);
  EXPECT_EQ(gu.value.data_as<float>()[(3 * 2 * F + F) * D + 5], up3->data_as<float>()[5]);
}

TEST(ModelIo, MissingTensorIsNamed) {
  Context ctx = make_context(Device::kCpu);
  const ModelConfig c = test::tiny_model_config();
  Model m(ctx, c, {recipe_preset("bf16"), DType::kBF16});
  io::NamedTensors init = init_parameters(c, 11);
  const std::string gone = init[5].first;
  init.erase(init.begin() + 5);
  try {
    m.load(ctx, init);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(gone), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace octet
