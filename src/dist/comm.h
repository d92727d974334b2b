// Comm: the collectives a distributed run needs, over the ranks of one group.
//
// Two implementations: NCCL on CUDA (dist/nccl_comm.h; one process per GPU) and an in-process one
// (dist/inprocess_comm.h) where the ranks are threads of one process on the CPU backend, so that
// every parallel code path runs in CI without GPUs. A Context carries its rank's Comm
// (Context::comm), like the GEMM state; comm_of(ctx) reads it.
//
// Buffers are on the context's device (host memory for the CPU backend). Counts are in elements of
// `dtype`. Every rank of the group calls the same collectives in the same order with matching
// counts; the in-process implementation checks this and fails on every rank when they differ.
// Ordering: NCCL enqueues on the context's stream (the call returns before the data moved, like a
// kernel launch); the in-process implementation completes before returning.
//
// Reductions are deterministic in the in-process implementation: element i of the result is
// ((x_0 + x_1) + x_2) + ... in rank order, each addition one FP32 rounding (BF16 inputs widened,
// the result rounded to BF16 once at the end). NCCL's order depends on its algorithm (ring or tree)
// and the topology; it is fixed for a given world size and machine, not across them.
//
// Failures: a collective that waits longer than the group's timeout for its peers, or a peer that
// failed (threw, or aborted its communicator), throws octet::Error on every rank that waits, naming
// the rank(s) it waited for; after that every call on the group throws at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/dtype.h"

namespace octet {

enum class ReduceOp : uint8_t { kSum, kMax };

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "nccl" or "in-process", for logs and errors

  // recv[i] = op over ranks of send[i], on every rank; send == recv is allowed (in place).
  virtual void all_reduce(Context& ctx, const void* send, void* recv, int64_t count, DType dtype,
                          ReduceOp op) = 0;
  // send holds size() * recv_count elements; rank r receives the reduction of block r.
  virtual void reduce_scatter(Context& ctx, const void* send, void* recv, int64_t recv_count,
                              DType dtype, ReduceOp op) = 0;
  // recv holds size() * send_count elements: block r is rank r's send.
  virtual void all_gather(Context& ctx, const void* send, void* recv, int64_t send_count,
                          DType dtype) = 0;
  // Rank r sends send_counts[p] elements from send + send_displs[p] to rank p, and receives
  // recv_counts[p] elements from rank p at recv + recv_displs[p]. The count and displacement
  // arrays are host memory, size() entries each, in elements; a rank's recv_counts[p] must equal
  // rank p's send_counts[r] (exchange the counts first, with all_gather or all_to_all).
  virtual void all_to_all_v(Context& ctx, const void* send, const int64_t* send_counts,
                            const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                            const int64_t* recv_displs, DType dtype) = 0;
  // buf on every rank = buf on `root`.
  virtual void broadcast(Context& ctx, void* buf, int64_t count, DType dtype, int root) = 0;
  // Returns on every rank once every rank has called it and, on NCCL, the work each rank enqueued
  // before it has completed (so a barrier also bounds how long a hung peer can stall a rank).
  virtual void barrier(Context& ctx) = 0;
  // A collective over this group: a new group of the ranks with the same color, ranked by key
  // (then by rank here). Every rank must call it; color < 0 gives no group (null).
  virtual std::shared_ptr<Comm> split(Context& ctx, int color, int key) = 0;
  // Marks the group failed (this rank gave up: an exception): peers waiting in a collective, and
  // every later call, throw naming this rank and the reason. Never throws.
  virtual void abort(const std::string& reason) noexcept = 0;
};

// The context's Comm; throws when the context has none (a single-process run sets none).
Comm& comm_of(const Context& ctx);
// The context's world: rank 0 of 1 without a Comm.
int comm_rank(const Context& ctx);
int comm_size(const Context& ctx);

// Element-count helpers over tensors (buffers on ctx's device); checks the dtypes and sizes, naming
// the tensor.
void all_reduce(Context& ctx, Comm& comm, Tensor& t, ReduceOp op = ReduceOp::kSum);
void broadcast(Context& ctx, Comm& comm, Tensor& t, int root);
// Every rank's host values, in rank order (a small host exchange through the device).
std::vector<double> all_gather_values(Context& ctx, Comm& comm, double value);
std::vector<int64_t> all_gather_values(Context& ctx, Comm& comm, int64_t value);

// Default timeout of a collective's wait for its peers (in-process groups, NCCL's watchdog,
// the TCP rendezvous): OCTET_DIST_TIMEOUT_S seconds when set (a positive number), else 300 s.
std::chrono::milliseconds default_comm_timeout();

}  // namespace octet
