// The checkpoint index reader (model.safetensors.index.json, io/safetensors_dir.h) on arbitrary
// text: parse_safetensors_index either returns a weight map of plain file names or refuses with
// octet::Error. An index that parses is then read as the index of a real sharded checkpoint (a tiny
// model written once per process) by read_checkpoint, which must load it or refuse it with
// octet::Error; when it loads, it holds every tensor of the model.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

#include "core/check.h"
#include "fuzz_util.h"
#include "io/safetensors_dir.h"
#include "model/checkpoint.h"

namespace {

// Dense and MoE layers, MTP, and shapes with partial 128-blocks, at a size that reads in well
// under a millisecond.
octet::ModelConfig small_model() {
  octet::ModelConfig c;
  c.vocab_size = 16;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.moe_intermediate_size = 4;
  c.num_hidden_layers = 2;
  c.first_k_dense_replace = 1;
  c.num_attention_heads = 2;
  c.max_position_embeddings = 16;
  c.q_lora_rank = 4;
  c.kv_lora_rank = 4;
  c.qk_nope_head_dim = 4;
  c.qk_rope_head_dim = 2;
  c.v_head_dim = 4;
  c.n_routed_experts = 2;
  c.n_shared_experts = 1;
  c.num_experts_per_tok = 1;
  c.n_group = 1;
  c.topk_group = 1;
  c.num_nextn_predict_layers = 1;
  return c;
}

const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    const std::string d = octet::fuzz::scratch_dir() + "/ckpt";
    const octet::ModelConfig c = small_model();
    octet::io::NamedTensors params;
    int64_t k = 0;
    for (const octet::TensorSpec& s : octet::expected_tensors(c)) {
      octet::Tensor t = octet::Tensor::empty(s.shape, octet::DType::kF32);
      for (int64_t i = 0; i < t.numel(); ++i)
        t.data_as<float>()[i] = std::sin(static_cast<float>(++k));
      params.emplace_back(s.name, t);
    }
    octet::CheckpointWriteOptions o;
    o.shard_bytes = 2048;  // several shards, so there is an index
    octet::write_checkpoint(d, c, params, o);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  checkpoint_dir();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    for (const auto& [name, file] :
         octet::io::parse_safetensors_index(text, "model.safetensors.index.json"))
      if (file.empty() || file == "." || file == ".." ||
          file.find_first_of(std::string("/\0", 2)) != std::string::npos)
        octet::fuzz::fail("weight_map file '" + file + "' is not a plain file name");
  } catch (const octet::Error&) {
    return 0;
  }
  const std::string& dir = checkpoint_dir();
  std::ofstream(dir + "/model.safetensors.index.json", std::ios::binary | std::ios::trunc)
      .write(text.data(), static_cast<std::streamsize>(text.size()));
  try {
    const octet::LoadedCheckpoint ck = octet::read_checkpoint(dir);
    if (ck.tensors.size() + ck.missing_mtp.size() != octet::expected_tensors(small_model()).size())
      octet::fuzz::fail("a checkpoint loaded without all of its tensors");
  } catch (const octet::Error&) {
  }
  return 0;
}
