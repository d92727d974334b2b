// Shared by first_writer_test.cpp (CPU) and first_writer_gpu_test.cpp (CUDA): a backward whose
// Linear layers' and routed experts' gradients are left unzeroed for their first writer
// (Model::first_writer_parameters, Parameter::first_writer: the trainer's one-micro-batch steps)
// gives bit for bit the gradients of a backward after zero_grad (but for the sign of an exact
// zero), every parameter's, in the recipes with FP8 (blockwise; per-tensor current scaling, whose
// scales do not depend on earlier steps) and BF16 Wgrads, over gradients that held NaN bytes; the
// tiny model's MTP depth writes the shared head's gradient a second time, and with a tied head the
// embedding's weight is no first writer's.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/init.h"
#include "model/model.h"
#include "test_util.h"
#include "tiny_model.h"

namespace octet::test {

inline void expect_first_writer_grads_match(Device device) {
  ModelConfig c = tiny_model_config();
  c.intermediate_size = 192;  // multiples of 16, as the FP8 GEMMs need on CUDA
  c.moe_intermediate_size = 64;
  for (const char* recipe : {"deepseek", "fp8-flow", "bf16", "fp8-tensor-current"})
    for (bool tied : {false, true}) {
      SCOPED_TRACE(std::string(recipe) + (tied ? ", tied head" : ""));
      c.tie_word_embeddings = tied;
      Context ctx = make_context(device);
      Model m(ctx, c, {recipe_preset(recipe), DType::kBF16});
      m.load(ctx, init_parameters(c, 3));
      ModelBatch b = test::patterned_batch(c, 2, 64);
      b.inputs = b.inputs.to(ctx, device);
      b.targets = b.targets.to(ctx, device);
      m.prepare(ctx);
      // Two backwards after zero_grad: the gradients of the second are the reference (the first
      // leaves every gradient holding something, as a previous step would).
      std::vector<Tensor> want;
      for (int pass = 0; pass < 2; ++pass) {
        m.zero_grad(ctx);
        m.step(ctx, b, Pass::kForwardBackward);
      }
      for (Parameter* p : m.parameters()) want.push_back(p->grad.to_host(ctx));
      // Now the first writers' gradients are left as they are, NaN bytes at that.
      const std::vector<Parameter*> writers = m.first_writer_parameters();
      ASSERT_GT(writers.size(), m.expert_parameters().size());  // the Linear layers' too
      m.zero_grad(ctx);
      for (Parameter* p : writers) {
        ctx.be().memset(p->grad.data(), 0xFF, p->grad.nbytes());
        p->first_writer = p->grad_fresh = true;
      }
      m.step(ctx, b, Pass::kForwardBackward);
      const std::vector<Parameter*> params = m.parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_FALSE(params[i]->grad_fresh) << params[i]->name << ": the backward left it fresh";
        const Tensor got = params[i]->grad.to_host(ctx);
        ASSERT_EQ(got.numel(), want[i].numel());
        // Bit for bit, but for the sign of an exact zero: 0 + (-0) is +0, while = stores -0 (which
        // AdamW treats as +0).
        const auto* w = want[i].data_as<const uint32_t>();
        const auto* g = got.data_as<const uint32_t>();
        int64_t bad = 0, first = -1;
        for (int64_t j = 0; j < got.numel(); ++j)
          if (w[j] != g[j] && ((w[j] | g[j]) & 0x7FFFFFFFu) != 0 && bad++ == 0) first = j;
        EXPECT_EQ(bad, 0) << params[i]->name << ": " << bad << " elements differ, the first at "
                          << first;
      }
    }
}

}  // namespace octet::test
