// Dispatcher for embedding.h: validates once, routes to cpu:: or cuda::.
#include "ops/embedding/embedding.h"

#include "backend/dispatch.h"
#include "ops/embedding/embedding_backends.h"

namespace octet {
namespace {

void check_storage(const Tensor& t, const char* name) {
  OCTET_CHECK(t.data() != nullptr || t.numel() == 0, name, ": tensor has no storage");
}

void check_ids(Context& ctx, const Tensor& ids) {
  check_storage(ids, "embedding ids");
  check_dtype(ids, "embedding ids", {DType::kI32});
  check_device(ids, "embedding ids", ctx.device);
}

// `t` must view as (rows, d).
void check_rows(const Tensor& t, const char* name, int64_t rows, int64_t d) {
  OCTET_CHECK(t.rank() >= 1 && t.rows() == rows && t.cols() == d, name, ": expected shape (", rows,
              ", ", d, ") (leading dimensions flattened), got ", shape_str(t.shape()));
}

}  // namespace

void embedding_forward(Context& ctx, const EmbeddingForwardArgs& args) {
  check_ids(ctx, args.ids);
  check_storage(args.table, "embedding table");
  check_dtype(args.table, "embedding table", {DType::kF32, DType::kBF16});
  check_device(args.table, "embedding table", ctx.device);
  OCTET_CHECK(args.table.rank() == 2 && args.table.size(0) >= 1 && args.table.size(1) >= 1,
              "embedding table: expected shape (V, D) with V, D >= 1, got ",
              shape_str(args.table.shape()));
  check_storage(args.out, "embedding out");
  check_dtype(args.out, "embedding out", {DType::kF32, DType::kBF16});
  check_device(args.out, "embedding out", ctx.device);
  check_rows(args.out, "embedding out", args.ids.numel(), args.table.size(1));
  if (args.ids.numel() == 0) return;
  OCTET_DISPATCH(ctx, embedding_forward, ctx, args);
}

void embedding_backward(Context& ctx, const EmbeddingBackwardArgs& args) {
  check_ids(ctx, args.ids);
  check_storage(args.dtable, "embedding dtable");
  check_dtype(args.dtable, "embedding dtable", {DType::kF32});
  check_device(args.dtable, "embedding dtable", ctx.device);
  OCTET_CHECK(args.dtable.rank() == 2 && args.dtable.size(0) >= 1 && args.dtable.size(1) >= 1,
              "embedding dtable: expected shape (V, D) with V, D >= 1, got ",
              shape_str(args.dtable.shape()));
  OCTET_CHECK(args.dtable.size(0) < (int64_t{1} << 30),
              "embedding dtable: V = ", args.dtable.size(0), " exceeds 2^30 (ids are int32)");
  check_storage(args.dout, "embedding dout");
  check_dtype(args.dout, "embedding dout", {DType::kF32, DType::kBF16});
  check_device(args.dout, "embedding dout", ctx.device);
  check_rows(args.dout, "embedding dout", args.ids.numel(), args.dtable.size(1));
  OCTET_CHECK(args.ids.numel() < (int64_t{1} << 31), "embedding ids: ", args.ids.numel(),
              " positions exceed int32 indexing");
  if (args.ids.numel() == 0) return;  // dtable += 0
  OCTET_DISPATCH(ctx, embedding_backward, ctx, args);
}

}  // namespace octet
