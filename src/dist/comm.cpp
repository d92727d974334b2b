#include "dist/comm.h"

#include <cstdlib>
#include <cstring>

#include "core/backend_interface.h"

namespace octet {

Comm& comm_of(const Context& ctx) {
  OCTET_CHECK(ctx.comm, "this context has no communicator (a single-process run)");
  return *ctx.comm;
}

int comm_rank(const Context& ctx) {
  return ctx.comm ? ctx.comm->rank() : 0;
}

int comm_size(const Context& ctx) {
  return ctx.comm ? ctx.comm->size() : 1;
}

void all_reduce(Context& ctx, Comm& comm, Tensor& t, ReduceOp op) {
  OCTET_CHECK(t.defined() && t.device() == ctx.device, "all_reduce: the tensor must be on the ",
              device_name(ctx.device));
  comm.all_reduce(ctx, t.data(), t.data(), t.numel(), t.dtype(), op);
}

void broadcast(Context& ctx, Comm& comm, Tensor& t, int root) {
  OCTET_CHECK(t.defined() && t.device() == ctx.device, "broadcast: the tensor must be on the ",
              device_name(ctx.device));
  comm.broadcast(ctx, t.data(), t.numel(), t.dtype(), root);
}

namespace {

template <typename T>
std::vector<T> gather_host(Context& ctx, Comm& comm, T value) {
  static_assert(sizeof(T) == 8);
  Tensor host = Tensor::empty({1}, DType::kI64);
  std::memcpy(host.data(), &value, sizeof value);
  const Tensor send = host.to(ctx, ctx.device);
  Tensor recv = Tensor::empty(ctx, {comm.size()}, DType::kI64);
  comm.all_gather(ctx, send.data(), recv.data(), 1, DType::kI64);
  const Tensor back = recv.to_host(ctx);
  std::vector<T> out(static_cast<size_t>(comm.size()));
  std::memcpy(out.data(), back.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace

std::vector<double> all_gather_values(Context& ctx, Comm& comm, double value) {
  return gather_host(ctx, comm, value);
}

std::vector<int64_t> all_gather_values(Context& ctx, Comm& comm, int64_t value) {
  return gather_host(ctx, comm, value);
}

std::chrono::milliseconds default_comm_timeout() {
  if (const char* s = std::getenv("OCTET_DIST_TIMEOUT_S")) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    OCTET_CHECK(end != s && *end == '\0' && v > 0, "OCTET_DIST_TIMEOUT_S=", s,
                ": expected a positive number of seconds");
    return std::chrono::milliseconds(static_cast<int64_t>(v * 1000.0));
  }
  return std::chrono::seconds(300);
}

}  // namespace octet
