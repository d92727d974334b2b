// Output head: forward and, under it, backward, a chunk of tokens at a time (head.h explains why and
// what stays bitwise).
#include "model/head.h"

#include <algorithm>

#include "backend/backend.h"
#include "ops/cross_entropy/cross_entropy.h"

namespace octet {
namespace {

// Rows [first, first + count) of a contiguous (rows, cols) tensor, sharing its storage (the caller
// keeps the whole tensor alive).
Tensor row_view(const Tensor& t, int64_t first, int64_t count) {
  const int64_t cols = t.rank() == 1 ? 1 : t.cols();
  auto* base = static_cast<char*>(t.data()) + first * cols * dtype_size(t.dtype());
  const Shape shape = t.rank() == 1 ? Shape{count} : Shape{count, cols};
  return Tensor::wrap(base, shape, t.dtype(), t.device());
}

CopyKind same_device(const Context& ctx) {
  return ctx.device == Device::kCpu ? CopyKind::kHostToHost : CopyKind::kDeviceToDevice;
}

}  // namespace

int64_t OutputHead::chunk_rows(const Precision& p, int64_t rows, int64_t vocab) const {
  OCTET_CHECK(chunk_tokens >= 0, "output head: chunk_tokens must be >= 0 (0: automatic), got ",
              chunk_tokens);
  if (rows == 0 || p.recipe.at(head->site).is_delayed()) return rows;
  int64_t chunk = chunk_tokens;
  if (chunk == 0) {
    const int64_t row_bytes = std::max<int64_t>(vocab, 1) * dtype_size(p.act);
    chunk = std::max<int64_t>(kAutoChunkBytes / row_bytes / 128, 1) * 128;
  }
  return std::min(chunk, rows);
}

OutputHead::Result OutputHead::run(Context& ctx, const Precision& p, const Tensor& x,
                                   const Tensor& targets, const Tensor* dloss) const {
  const int64_t rows = x.rows(), vocab = head->param->value.rows();
  NormLayer::Saved ns;
  const Tensor xn = norm.forward(ctx, x.reshape({rows, x.cols()}), ns);
  const Tensor tg = targets.reshape({rows});
  Result r;
  r.loss = Tensor::empty(ctx, {1}, DType::kF32);
  r.count = Tensor::empty(ctx, {1}, DType::kI32);
  Tensor losses = Tensor::empty(ctx, {rows}, DType::kF32);
  Tensor lse = Tensor::empty(ctx, {rows}, DType::kF32);
  const int64_t chunk = chunk_rows(p, rows, vocab);
  Tensor dxn;  // (rows, D): the chunks' dxn rows, or the one chunk's dxn itself
  if (dloss != nullptr) {
    // Every chunk's backward divides by the count of all rows: known before the first chunk.
    cross_entropy_mean(ctx,
                       {.losses = Tensor(), .targets = tg, .count = r.count, .loss = Tensor()});
    if (chunk < rows) dxn = Tensor::empty(ctx, xn.shape(), xn.dtype());
  }
  for (int64_t first = 0; first < rows; first += chunk) {
    const int64_t n = std::min(chunk, rows - first);
    const Tensor xc = row_view(xn, first, n), tc = row_view(tg, first, n),
                 lse_c = row_view(lse, first, n);
    LinearSaved hs;
    Tensor logits = head->forward(ctx, p, xc, hs);  // (n, V)
    cross_entropy_rows(
        ctx, {.logits = logits, .targets = tc, .losses = row_view(losses, first, n), .lse = lse_c});
    if (dloss == nullptr) continue;
    // The logits' gradient overwrites the logits: one buffer of (n, V).
    cross_entropy_backward(ctx, {.logits = logits,
                                 .targets = tc,
                                 .lse = lse_c,
                                 .count = r.count,
                                 .dloss = *dloss,
                                 .dlogits = logits});
    // The head's backward adds its weight gradient (+=) into the shared parameter.
    const Tensor dxc = const_cast<LinearLayer*>(head)->backward(ctx, p, logits, hs);
    if (chunk == rows) {
      dxn = dxc;
    } else {
      const Tensor dst = row_view(dxn, first, n);
      ctx.be().copy(dst.data(), dxc.data(), dxc.nbytes(), same_device(ctx));
    }
  }
  cross_entropy_mean(ctx, {.losses = losses, .targets = tg, .count = r.count, .loss = r.loss});
  if (dloss != nullptr) r.dx = norm.backward(ctx, dxn, ns).reshape(x.shape());
  return r;
}

}  // namespace octet
