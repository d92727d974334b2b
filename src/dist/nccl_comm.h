// The NCCL Comm: one process per GPU, collectives enqueued on the context's stream.
//
// The communicator is created non-blocking, so that no call can hang for ever: initialisation and
// every enqueue are polled (ncclCommGetAsyncError) up to the timeout, and barrier() waits for the
// stream the same way. On a timeout or an asynchronous NCCL error the communicator is aborted
// (ncclCommAbort) and the call throws naming the operation; the peers, blocked in a collective
// with this rank, then time out the same way. Without NCCL in the build (the CPU build, or CUDA
// without libnccl) make_nccl_comm throws saying so.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>

#include "dist/comm.h"

namespace octet {

// ncclUniqueId's bytes: made by rank 0, handed to every rank (dist/rendezvous.h).
struct NcclId {
  std::array<uint8_t, 128> bytes{};
};

bool nccl_built();
// "2.28.9" or "" without NCCL.
std::string nccl_version();
// A fresh id (rank 0 makes it, once per communicator).
NcclId nccl_unique_id();
// Rank `rank` of `size` on ctx's GPU (ctx.device must be kCuda). Returns when every rank has
// joined; throws after `timeout` naming the ranks' count when they did not.
std::shared_ptr<Comm> make_nccl_comm(Context& ctx, const NcclId& id, int rank, int size,
                                     std::chrono::milliseconds timeout);

}  // namespace octet
