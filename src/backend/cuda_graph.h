// CUDA graphs and pinned host staging for the training step (issue 11): work enqueued on a
// context's stream captured once and replayed, and host-to-device uploads that never wait.
// Nothing here includes CUDA headers; a build without CUDA links stubs (cuda_stub.cpp) that report
// graphs unsupported and upload with a plain copy.
//
// Capture (CudaGraph::capture) runs `body` with the stream in capture mode: nothing executes, every
// kernel, copy and memset is recorded. Allocations made by `body` become the graph's own memory
// (cudaMallocAsync under capture makes memory nodes): freed inside the body, they are reused within
// the graph; still alive at the end of the body (the graph's outputs), they keep one fixed address
// for every replay, and each replay frees and re-makes them at that address (the graph is
// instantiated with auto-free-on-launch). So a replay overwrites the previous replay's outputs:
// copy what must survive. What cannot be captured fails the capture with one error naming it: a
// host wait (synchronize, a device-to-host copy), a pageable host-to-device copy, a first-use
// allocation that outlives the graph (run the body once eagerly before capturing, which makes the
// plan caches, workspaces and constant tensors), and a free of memory made outside the body.
//
// Memory on the two sides: after a replay the graph keeps physical memory mapped for its whole
// working set (what it allocates and frees inside), ready for the next replay; eager work caches
// its freed blocks in the stream-ordered pool. The same working set run on both sides (an eager
// micro-batch while its graph exists, a replay after eager micro-batches) holds two copies unless
// release_cached_device_memory() is called between.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/context.h"

namespace octet {

class Backend;

// Whether ctx can capture and replay graphs: a CUDA build and a CUDA context.
bool cuda_graphs_supported(const Context& ctx);

class CudaGraph {
 public:
  CudaGraph();
  ~CudaGraph();
  CudaGraph(CudaGraph&&) noexcept;
  CudaGraph& operator=(CudaGraph&&) noexcept;

  // Records what `body` enqueues on ctx's stream, replacing any earlier graph. On an error (thrown
  // by body or by the capture itself) the capture is ended, nothing is kept and the error is
  // rethrown with "CUDA graph capture of <what>: " before it.
  void capture(Context& ctx, const char* what, const std::function<void()>& body);
  // Enqueues one replay on ctx's stream (asynchronous, like the kernels it holds).
  void replay(Context& ctx);
  bool captured() const;
  void reset();
  int64_t replays() const { return replays_; }
  int64_t nodes() const { return nodes_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t replays_ = 0;
  int64_t nodes_ = 0;
};

// Host-to-device uploads through a ring of pinned host buffers: the bytes are copied into a pinned
// slot and the device copy enqueued on ctx's stream, so upload() returns at once. A slot is reused
// only after the device finished reading it (an event; with `slots` slots, the wait is for the
// upload `slots` calls back, long done in a training loop). On the CPU a plain copy.
class PinnedUploader {
 public:
  PinnedUploader(Context& ctx, int slots = 4);
  ~PinnedUploader();
  PinnedUploader(const PinnedUploader&) = delete;
  PinnedUploader& operator=(const PinnedUploader&) = delete;

  // dst (on ctx's device) <- src (host), src.nbytes() bytes; src may change after the call.
  void upload(Context& ctx, const Tensor& dst, const Tensor& src);
  // Host waits an upload made (a slot whose earlier copy had not finished): 0 in steady state.
  int64_t waits() const { return waits_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t waits_ = 0;
};

// Device-to-host reads that do not stall the stream (the training step's lagged results): read()
// enqueues copies of device tensors into a pinned host slot and records an event behind them;
// wait() waits for that event only (a later step's work may already be queued behind it) and
// returns the bytes, the tensors' one after the other. On the CPU a plain copy.
class PinnedReadback {
 public:
  PinnedReadback(Context& ctx, int slots);
  ~PinnedReadback();
  PinnedReadback(const PinnedReadback&) = delete;
  PinnedReadback& operator=(const PinnedReadback&) = delete;

  void read(Context& ctx, int slot, const std::vector<Tensor>& srcs);
  const uint8_t* wait(int slot);
  // wait() calls that found the copies unfinished (and blocked until they were).
  int64_t blocked() const { return blocked_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int64_t blocked_ = 0;
};

// Around a capture (CudaGraph::capture calls it): while capturing, the CUDA backend holds back
// frees of memory allocated before the capture and does them when it ends (a captured free may
// only free what the capture allocated: a layer replacing its prepared weights under capture).
void set_backend_capturing(Backend& be, bool on);

// Clears the CUDA runtime's last error: after a failed capture, frees of the addresses it handed
// out fail harmlessly and must not be reported by the next launch. A no-op without CUDA.
void clear_cuda_last_error();

// Gives back the device memory cached on one side of the graphed / eager boundary (above): waits
// for ctx's stream, then returns to the driver the physical memory graphs keep mapped for what they
// allocate and free inside (what a graph leaves allocated, its outputs, stays) and the free blocks
// the stream-ordered pool caches. For the points where a working set changes sides: after a
// capture (the eager round before it), before and after eager work in a run whose graphs replay (a
// probe step's micro-batches, the BF16 shadow, the validation). The next replay maps its memory
// again. Backend::peak_bytes() keeps the peak reached before the call. Counts as a host wait
// (Backend::host_waits). A no-op on the CPU.
void release_cached_device_memory(Context& ctx);
// How many times release_cached_device_memory() ran on ctx's backend (0 on the CPU): a graph that
// last ran before the latest release holds no mapped working set.
int64_t device_memory_releases(const Context& ctx);

// Bytes the device's stream-ordered pool holds from the driver (reserved, in use or cached) and
// graph memory reserved for graphs; 0 on the CPU. What a step after the first must not grow.
int64_t device_reserved_bytes(const Context& ctx);

}  // namespace octet
