// CPU reference for embedding.h: a gather, and per id an FP32 sum over its positions in order.
#include <map>
#include <vector>

#include "numerics/fp8.h"
#include "ops/cpu_elements.h"
#include "ops/embedding/embedding_backends.h"

namespace octet::cpu {
namespace {

int32_t checked_id(const Tensor& ids, int64_t t, int64_t vocab) {
  const int32_t id = ids.data_as<const int32_t>()[t];
  OCTET_CHECK(id >= 0 && id < vocab, "embedding ids: position ", t, " holds ", id, ", outside [0, ",
              vocab, ")");
  return id;
}

}  // namespace

void embedding_forward(Context&, const EmbeddingForwardArgs& a) {
  const int64_t rows = a.ids.numel(), vocab = a.table.size(0), d = a.table.size(1);
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t id = checked_id(a.ids, t, vocab);
    for (int64_t j = 0; j < d; ++j) store(a.out, t * d + j, load(a.table, id * d + j));
  }
}

void embedding_backward(Context&, const EmbeddingBackwardArgs& a) {
  const int64_t rows = a.ids.numel(), vocab = a.dtable.size(0), d = a.dtable.size(1);
  std::map<int32_t, std::vector<int64_t>> positions;  // id -> its positions, increasing
  for (int64_t t = 0; t < rows; ++t) positions[checked_id(a.ids, t, vocab)].push_back(t);
  float* dtable = a.dtable.data_as<float>();
  std::vector<float> sum(static_cast<size_t>(d));
  for (const auto& [id, ts] : positions) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (int64_t t : ts)
      for (int64_t j = 0; j < d; ++j) sum[static_cast<size_t>(j)] += load(a.dout, t * d + j);
    for (int64_t j = 0; j < d; ++j) dtable[id * d + j] += sum[static_cast<size_t>(j)];  // +=
  }
}

}  // namespace octet::cpu
