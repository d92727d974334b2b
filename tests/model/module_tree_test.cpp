// The module tree (model/module_tree.h) and what derives from it: the fused parameters tile their
// checkpoint parts exactly, every block role is where the model wires it, and the checkpoint names
// and the model's parameters follow the tree.
#include "model/module_tree.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <utility>

#include "backend/backend.h"
#include "model/checkpoint.h"
#include "model/model.h"
#include "tiny_model.h"

namespace octet {
namespace {

ModelConfig variant(bool q_lora, bool tied, int64_t shared_experts) {
  ModelConfig c = test::tiny_model_config();
  if (!q_lora) c.q_lora_rank.reset();
  c.tie_word_embeddings = tied;
  c.n_shared_experts = shared_experts;
  return c;
}

// Each parameter (layer, role) is either held whole by one tensor or tiled by its parts: offsets
// cover [0, numel) without gap or overlap, all parts agreeing on the parameter's shape.
TEST(ModuleTree, FusedPartsTileTheirParameter) {
  for (const ModelConfig& c : {variant(true, false, 1), variant(false, true, 0)}) {
    std::map<std::pair<int64_t, ParamRole>, std::vector<const ModuleTensor*>> params;
    const std::vector<ModuleTensor> tree = module_tree(c);
    for (const ModuleTensor& t : tree)
      if (!t.copy_of) params[{t.layer, t.role}].push_back(&t);
    for (const auto& [key, parts] : params) {
      const Shape& shape = parts.front()->param_shape;
      std::map<int64_t, int64_t> spans;  // offset -> numel
      for (const ModuleTensor* t : parts) {
        EXPECT_EQ(t->param_shape, shape) << "layer " << key.first;
        EXPECT_TRUE(spans.emplace(t->param_offset, shape_numel(t->shape)).second);
        EXPECT_EQ(t->fused(), parts.size() > 1 || t->expert >= 0);
      }
      int64_t next = 0;
      for (const auto& [offset, n] : spans) {
        EXPECT_EQ(offset, next) << "layer " << key.first << " role "
                                << static_cast<int>(key.second);
        next = offset + n;
      }
      EXPECT_EQ(next, shape_numel(shape)) << "layer " << key.first;
    }
  }
}

// The MTP modules' embedding and head hold no parameter of their own: they copy the main model's,
// which is the embedding for the head when the embeddings are tied.
TEST(ModuleTree, MtpCopiesNameTheSharedParameters) {
  for (const bool tied : {false, true}) {
    const ModelConfig c = variant(true, tied, 1);
    int copies = 0;
    for (const ModuleTensor& t : module_tree(c)) {
      if (!t.copy_of) continue;
      ++copies;
      EXPECT_GE(t.mtp_depth, 0);
      if (t.role == ParamRole::kMtpEmbedding) EXPECT_EQ(*t.copy_of, ParamRole::kEmbedding);
      if (t.role == ParamRole::kMtpHead)
        EXPECT_EQ(*t.copy_of, tied ? ParamRole::kEmbedding : ParamRole::kLmHead);
    }
    EXPECT_EQ(copies, 2 * c.num_nextn_predict_layers);
  }
}

// The checkpoint names and the model's parameters both derive from the tree: one spec per tree
// tensor in the same order, fused names only for fused parts, and one model parameter per
// (layer, role) that holds values, under parameter_name.
TEST(ModuleTree, CheckpointAndModelFollowTheTree) {
  const ModelConfig c = variant(true, false, 1);
  const std::vector<ModuleTensor> tree = module_tree(c);
  const std::vector<TensorSpec> specs = expected_tensors(c);
  ASSERT_EQ(specs.size(), tree.size());
  std::set<std::string> names, params;
  for (size_t i = 0; i < tree.size(); ++i) {
    EXPECT_EQ(specs[i].role, tree[i].role);
    EXPECT_EQ(specs[i].shape, tree[i].shape);
    EXPECT_EQ(specs[i].fused_name.empty(), !tree[i].fused()) << specs[i].name;
    EXPECT_TRUE(names.insert(specs[i].name).second) << specs[i].name << " twice";
    if (!tree[i].copy_of) params.insert(parameter_name(tree[i].role, tree[i].layer));
  }
  EXPECT_EQ(specs[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(parameter_name(ParamRole::kExpertsGateUp, 2),
            "model.layers.2.mlp.experts.gate_up_proj");

  Context cpu = make_context(Device::kCpu);
  Model m(cpu, c, {recipe_preset("bf16"), DType::kBF16});
  std::set<std::string> held;
  for (Parameter* p : m.parameters()) held.insert(p->name);
  EXPECT_EQ(held, params);
  // Blocks are wired by role: layer 1 (MoE) finds its stacked experts, the MTP layer its norms.
  EXPECT_EQ(m.layer(1).moe->gate_up.param->name, "model.layers.1.mlp.experts.gate_up_proj");
  EXPECT_EQ(m.mtp(0).enorm.param->name, "model.layers.3.enorm.weight");
}

}  // namespace
}  // namespace octet
