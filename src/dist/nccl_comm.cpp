#include "dist/nccl_comm.h"

#include <cstring>
#include <string>
#include <thread>

#if OCTET_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace octet {

#if OCTET_WITH_NCCL

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t, bool reducing) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    default:
      // FP8 payloads, scales and bytes travel as bytes; they are never reduced.
      OCTET_CHECK(!reducing, "NCCL: reduction over ", dtype_name(t), " is not supported");
      return ncclUint8;
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::kSum ? ncclSum : ncclMax;
}

class NcclComm final : public Comm {
 public:
  NcclComm(ncclComm_t comm, int rank, int size, std::chrono::milliseconds timeout)
      : comm_(comm), rank_(rank), size_(size), timeout_(timeout) {}
  ~NcclComm() override {
    if (!comm_) return;
    if (aborted_)
      ncclCommAbort(comm_);
    else
      ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  void all_reduce(Context& ctx, const void* send, void* recv, int64_t count, DType dtype,
                  ReduceOp op) override {
    check(ctx, "all_reduce");
    wait("all_reduce", ncclAllReduce(send, recv, static_cast<size_t>(count), nccl_type(dtype, true),
                                     nccl_op(op), comm_, stream(ctx)));
  }

  void reduce_scatter(Context& ctx, const void* send, void* recv, int64_t recv_count, DType dtype,
                      ReduceOp op) override {
    check(ctx, "reduce_scatter");
    wait("reduce_scatter",
         ncclReduceScatter(send, recv, static_cast<size_t>(recv_count), nccl_type(dtype, true),
                           nccl_op(op), comm_, stream(ctx)));
  }

  void all_gather(Context& ctx, const void* send, void* recv, int64_t send_count,
                  DType dtype) override {
    check(ctx, "all_gather");
    const int64_t bytes = send_count * dtype_size(dtype);
    wait("all_gather",
         ncclAllGather(send, recv, static_cast<size_t>(bytes), ncclUint8, comm_, stream(ctx)));
  }

  void all_to_all_v(Context& ctx, const void* send, const int64_t* send_counts,
                    const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                    const int64_t* recv_displs, DType dtype) override {
    check(ctx, "all_to_all_v");
    const int64_t es = dtype_size(dtype);
    wait("all_to_all_v (group start)", ncclGroupStart());
    for (int p = 0; p < size_; ++p) {
      if (send_counts[p] > 0)
        wait("all_to_all_v (send)",
             ncclSend(static_cast<const uint8_t*>(send) + send_displs[p] * es,
                      static_cast<size_t>(send_counts[p] * es), ncclUint8, p, comm_, stream(ctx)));
      if (recv_counts[p] > 0)
        wait("all_to_all_v (recv)",
             ncclRecv(static_cast<uint8_t*>(recv) + recv_displs[p] * es,
                      static_cast<size_t>(recv_counts[p] * es), ncclUint8, p, comm_, stream(ctx)));
    }
    wait("all_to_all_v", ncclGroupEnd());
  }

  void broadcast(Context& ctx, void* buf, int64_t count, DType dtype, int root) override {
    check(ctx, "broadcast");
    OCTET_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of ", size_);
    wait("broadcast", ncclBroadcast(buf, buf, static_cast<size_t>(count * dtype_size(dtype)),
                                    ncclUint8, root, comm_, stream(ctx)));
  }

  void barrier(Context& ctx) override {
    check(ctx, "barrier");
    if (!flag_) {
      void* p = nullptr;
      OCTET_CHECK(cudaMalloc(&p, sizeof(int32_t)) == cudaSuccess,
                  "NCCL barrier: cudaMalloc failed");
      flag_ = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
    }
    wait("barrier",
         ncclAllReduce(flag_.get(), flag_.get(), 1, ncclInt32, ncclSum, comm_, stream(ctx)));
    // The stream drains only when every peer took part: poll it against the timeout.
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      const cudaError_t q = cudaStreamQuery(static_cast<cudaStream_t>(ctx.stream));
      if (q == cudaSuccess) return;
      OCTET_CHECK(q == cudaErrorNotReady, "NCCL barrier: ", cudaGetErrorString(q));
      async_check("barrier");
      if (Clock::now() > deadline) fail("barrier", "timed out waiting for the other ranks");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  std::shared_ptr<Comm> split(Context& ctx, int color, int key) override {
    check(ctx, "split");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;  // see make_nccl_comm
    ncclComm_t sub = nullptr;
    wait("split", ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, &config));
    if (!sub) return nullptr;
    // The new communicator finishes its own (non-blocking) initialisation.
    const auto deadline = Clock::now() + timeout_;
    for (ncclResult_t state = ncclInProgress; state == ncclInProgress;) {
      ncclCommGetAsyncError(sub, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        ncclCommAbort(sub);
        fail("split", std::string("failed: ") + ncclGetErrorString(state));
      }
      if (state == ncclInProgress && Clock::now() > deadline) {
        ncclCommAbort(sub);
        fail("split", "timed out");
      }
      if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    int r = 0, n = 0;
    ncclCommUserRank(sub, &r);
    ncclCommCount(sub, &n);
    return std::make_shared<NcclComm>(sub, r, n, timeout_);
  }

  void abort(const std::string& /*reason*/) noexcept override { aborted_ = true; }

 private:
  static cudaStream_t stream(Context& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

  void check(const Context& ctx, const char* op) const {
    OCTET_CHECK(ctx.device == Device::kCuda, "NCCL ", op, ": the context is not on a GPU");
    OCTET_CHECK(!aborted_, "NCCL ", op, ": the communicator was aborted after an earlier failure");
  }

  [[noreturn]] void fail(const char* op, const std::string& why) {
    aborted_ = true;
    ncclCommAbort(comm_);
    comm_ = nullptr;
    OCTET_THROW("rank ", rank_, ": NCCL ", op, " ", why, " (", size_, " ranks, timeout ",
                timeout_.count() / 1000.0, " s); the communicator is aborted");
  }

  void async_check(const char* op) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state != ncclSuccess && state != ncclInProgress)
      fail(op,
           std::string("failed: ") + ncclGetErrorString(state) + ": " + ncclGetLastError(comm_));
  }

  // A non-blocking call returns ncclInProgress until it is enqueued: poll it up to the timeout.
  void wait(const char* op, ncclResult_t r) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress)
      fail(op, std::string("failed: ") + ncclGetErrorString(r) + ": " + ncclGetLastError(comm_));
    const auto deadline = Clock::now() + timeout_;
    for (;;) {
      ncclResult_t state = ncclInProgress;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress)
        fail(op,
             std::string("failed: ") + ncclGetErrorString(state) + ": " + ncclGetLastError(comm_));
      if (Clock::now() > deadline) fail(op, "timed out");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  ncclComm_t comm_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  bool aborted_ = false;
  std::shared_ptr<void> flag_;
};

}  // namespace

bool nccl_built() {
  return true;
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

NcclId nccl_unique_id() {
  static_assert(sizeof(ncclUniqueId) == sizeof(NcclId::bytes));
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  OCTET_CHECK(r == ncclSuccess, "ncclGetUniqueId: ", ncclGetErrorString(r));
  NcclId out;
  std::memcpy(out.bytes.data(), &id, sizeof id);
  return out;
}

std::shared_ptr<Comm> make_nccl_comm(Context& ctx, const NcclId& id, int rank, int size,
                                     std::chrono::milliseconds timeout) {
  OCTET_CHECK(ctx.device == Device::kCuda, "NCCL needs a CUDA context");
  OCTET_CHECK(size >= 1 && rank >= 0 && rank < size, "NCCL: rank ", rank, " of ", size,
              " is not a rank");
  OCTET_CHECK(cudaSetDevice(ctx.device_index) == cudaSuccess, "NCCL: cannot select GPU ",
              ctx.device_index);
  ncclUniqueId uid;
  std::memcpy(&uid, id.bytes.data(), sizeof uid);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Blocking calls: with non-blocking communicators NCCL 2.28.9 (H100, world size 1) refused the
  // first collective ("invalid argument") and ncclCommSplit gave no communicator. A peer that never
  // joins is caught by the rendezvous's timeout before this call, and a peer lost later by the
  // barrier's polling; wait() still handles ncclInProgress should a call return it.
  config.blocking = 1;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, uid, rank, &config);
  OCTET_CHECK(r == ncclSuccess || r == ncclInProgress, "rank ", rank,
              ": ncclCommInitRankConfig failed: ", ncclGetErrorString(r));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress || std::chrono::steady_clock::now() > deadline) {
      const std::string why = state != ncclInProgress
                                  ? std::string("failed: ") + ncclGetErrorString(state)
                                  : "timed out after " + std::to_string(timeout.count() / 1000) +
                                        " s: not all " + std::to_string(size) + " ranks joined";
      ncclCommAbort(comm);
      OCTET_THROW("rank ", rank, ": NCCL initialisation ", why);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return std::make_shared<NcclComm>(comm, rank, size, timeout);
}

#else  // no NCCL in this build

bool nccl_built() {
  return false;
}

std::string nccl_version() {
  return "";
}

NcclId nccl_unique_id() {
  OCTET_THROW("this build has no NCCL (a CUDA build finds it in the CUDA toolkit)");
}

std::shared_ptr<Comm> make_nccl_comm(Context&, const NcclId&, int, int, std::chrono::milliseconds) {
  OCTET_THROW("this build has no NCCL (a CUDA build finds it in the CUDA toolkit)");
}

#endif

}  // namespace octet
