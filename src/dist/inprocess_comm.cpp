#include "dist/inprocess_comm.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "backend/backend.h"
#include "numerics/fp8.h"

namespace octet {
namespace {

// What one rank posted for the collective in progress.
struct Post {
  std::string op;
  int64_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp reduce = ReduceOp::kSum;
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  const int64_t* send_counts = nullptr;
  const int64_t* send_displs = nullptr;
  const int64_t* recv_counts = nullptr;
  int color = 0, key = 0;
};

std::string describe(const Post& p) {
  return p.op + "(count " + std::to_string(p.count) + ", " + std::string(dtype_name(p.dtype)) +
         (p.op == "broadcast" ? ", root " + std::to_string(p.root) : "") + ")";
}

class Group {
 public:
  Group(int size, std::chrono::milliseconds timeout)
      : size_(size),
        timeout_(timeout),
        posts_(static_cast<size_t>(size)),
        arrived_(static_cast<size_t>(size), false) {}

  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const Post& post(int r) const { return posts_[static_cast<size_t>(r)]; }

  // Posts this rank's call and waits until every rank posted; then checks that the calls match.
  void enter(int rank, const Post& p) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      throw_if_failed(rank);
      posts_[static_cast<size_t>(rank)] = p;
    }
    wait_all(rank, p.op);
    const Post& first = posts_[0];
    for (int r = 1; r < size_; ++r) {
      const Post& o = posts_[static_cast<size_t>(r)];
      const bool same = o.op == first.op && o.dtype == first.dtype &&
                        (o.op == "all_to_all_v" || o.op == "split" || o.count == first.count) &&
                        o.root == first.root && o.reduce == first.reduce;
      if (!same) {
        const std::string msg = "ranks called different collectives: rank 0 " + describe(first) +
                                ", rank " + std::to_string(r) + " " + describe(o);
        fail(msg);
        OCTET_THROW("rank ", rank, ": ", msg);
      }
    }
  }
  // After reading the other ranks' buffers: waits until every rank has, so they may reuse them.
  void leave(int rank, const std::string& op) { wait_all(rank, op + " (completion)"); }

  void fail(const std::string& reason) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    if (failure_.empty()) failure_ = reason;
    cv_.notify_all();
  }

  // The sub-group of a split, shared by the ranks with the same color.
  std::shared_ptr<Group> subgroup(int64_t seq, int color, int size) {
    std::lock_guard<std::mutex> lk(mu_);
    auto& g = subgroups_[{seq, color}];
    if (!g) g = std::make_shared<Group>(size, timeout_);
    return g;
  }
  int64_t next_split_seq(int rank) {
    std::lock_guard<std::mutex> lk(mu_);
    return split_seq_[rank]++;
  }

 private:
  void throw_if_failed(int rank) const {
    if (!failure_.empty()) OCTET_THROW("rank ", rank, ": the process group failed: ", failure_);
  }

  void wait_all(int rank, const std::string& what) {
    std::unique_lock<std::mutex> lk(mu_);
    throw_if_failed(rank);
    const uint64_t gen = generation_;
    arrived_[static_cast<size_t>(rank)] = true;
    if (++count_ == size_) {
      count_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), false);
      ++generation_;
      cv_.notify_all();
      return;
    }
    const bool done =
        cv_.wait_for(lk, timeout_, [&] { return generation_ != gen || !failure_.empty(); });
    if (done && generation_ != gen) return;
    if (!done) {
      std::string missing;
      for (int r = 0; r < size_; ++r)
        if (!arrived_[static_cast<size_t>(r)])
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      const double s = static_cast<double>(timeout_.count()) / 1000.0;
      failure_ = what + " timed out after " + detail::concat(s) + " s waiting for rank(s) " +
                 missing + " (failed, stopped or never joined)";
      cv_.notify_all();
    }
    throw_if_failed(rank);
  }

  const int size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Post> posts_;
  std::vector<bool> arrived_;
  int count_ = 0;
  uint64_t generation_ = 0;
  std::string failure_;
  std::map<std::pair<int64_t, int>, std::shared_ptr<Group>> subgroups_;
  std::map<int, int64_t> split_seq_;
};

// dst[i] op= src[i] for `count` elements, as FP32 (BF16 is widened; the caller rounds).
void combine(float* acc, const void* src, int64_t count, DType dtype, ReduceOp op) {
  for (int64_t i = 0; i < count; ++i) {
    const float v = dtype == DType::kBF16 ? bf16_to_float(static_cast<const uint16_t*>(src)[i])
                                          : static_cast<const float*>(src)[i];
    acc[i] = op == ReduceOp::kSum ? acc[i] + v : std::max(acc[i], v);
  }
}

template <typename T>
void combine_int(T* acc, const void* src, int64_t count, ReduceOp op) {
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < count; ++i)
    acc[i] = op == ReduceOp::kSum ? acc[i] + s[i] : std::max(acc[i], s[i]);
}

class InProcessComm final : public Comm {
 public:
  InProcessComm(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string name() const override { return "in-process"; }

  void all_reduce(Context& ctx, const void* send, void* recv, int64_t count, DType dtype,
                  ReduceOp op) override {
    check_ctx(ctx);
    reduce_to("all_reduce", send, recv, 0, count, dtype, op);
  }

  void reduce_scatter(Context& ctx, const void* send, void* recv, int64_t recv_count, DType dtype,
                      ReduceOp op) override {
    check_ctx(ctx);
    reduce_to("reduce_scatter", send, recv, rank_ * recv_count, recv_count, dtype, op);
  }

  void all_gather(Context& ctx, const void* send, void* recv, int64_t send_count,
                  DType dtype) override {
    check_ctx(ctx);
    Post p = make("all_gather", send_count, dtype);
    p.send = send;
    group_->enter(rank_, p);
    const int64_t bytes = send_count * dtype_size(dtype);
    std::vector<uint8_t> out(static_cast<size_t>(bytes * size()));
    for (int r = 0; r < size(); ++r)
      std::memcpy(out.data() + r * bytes, group_->post(r).send, static_cast<size_t>(bytes));
    group_->leave(rank_, p.op);
    std::memcpy(recv, out.data(), out.size());
  }

  void all_to_all_v(Context& ctx, const void* send, const int64_t* send_counts,
                    const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                    const int64_t* recv_displs, DType dtype) override {
    check_ctx(ctx);
    Post p = make("all_to_all_v", 0, dtype);
    p.send = send;
    p.send_counts = send_counts;
    p.send_displs = send_displs;
    p.recv_counts = recv_counts;
    group_->enter(rank_, p);
    const int64_t es = dtype_size(dtype);
    std::string bad;
    for (int r = 0; r < size() && bad.empty(); ++r) {
      const int64_t sent = group_->post(r).send_counts[rank_];
      if (sent != recv_counts[r])
        bad = "all_to_all_v: rank " + std::to_string(rank_) + " expects " +
              std::to_string(recv_counts[r]) + " elements from rank " + std::to_string(r) +
              ", which sends " + std::to_string(sent);
    }
    if (!bad.empty()) {
      group_->fail(bad);
      OCTET_THROW("rank ", rank_, ": ", bad);
    }
    int64_t total = 0;
    for (int r = 0; r < size(); ++r) total += recv_counts[r];
    std::vector<uint8_t> out(static_cast<size_t>(total * es));
    int64_t at = 0;
    for (int r = 0; r < size(); ++r) {
      const Post& o = group_->post(r);
      std::memcpy(out.data() + at * es,
                  static_cast<const uint8_t*>(o.send) + o.send_displs[rank_] * es,
                  static_cast<size_t>(recv_counts[r] * es));
      at += recv_counts[r];
    }
    group_->leave(rank_, p.op);
    at = 0;
    for (int r = 0; r < size(); ++r) {
      std::memcpy(static_cast<uint8_t*>(recv) + recv_displs[r] * es, out.data() + at * es,
                  static_cast<size_t>(recv_counts[r] * es));
      at += recv_counts[r];
    }
  }

  void broadcast(Context& ctx, void* buf, int64_t count, DType dtype, int root) override {
    check_ctx(ctx);
    OCTET_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " is not a rank of ", size());
    Post p = make("broadcast", count, dtype);
    p.root = root;
    p.send = buf;
    group_->enter(rank_, p);
    const size_t bytes = static_cast<size_t>(count * dtype_size(dtype));
    std::vector<uint8_t> out(bytes);
    std::memcpy(out.data(), group_->post(root).send, bytes);
    group_->leave(rank_, p.op);
    if (rank_ != root) std::memcpy(buf, out.data(), bytes);
  }

  void barrier(Context& ctx) override {
    check_ctx(ctx);
    group_->enter(rank_, make("barrier", 0, DType::kU8));
    group_->leave(rank_, "barrier");
  }

  std::shared_ptr<Comm> split(Context& ctx, int color, int key) override {
    check_ctx(ctx);
    Post p = make("split", 0, DType::kU8);
    p.color = color;
    p.key = key;
    const int64_t seq = group_->next_split_seq(rank_);
    group_->enter(rank_, p);
    std::vector<std::pair<int, int>> members;  // (key, rank) of this color
    for (int r = 0; r < size(); ++r)
      if (color >= 0 && group_->post(r).color == color) members.push_back({group_->post(r).key, r});
    group_->leave(rank_, p.op);
    if (color < 0) return nullptr;
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    while (members[static_cast<size_t>(new_rank)].second != rank_) ++new_rank;
    return std::make_shared<InProcessComm>(
        group_->subgroup(seq, color, static_cast<int>(members.size())), new_rank);
  }

  void abort(const std::string& reason) noexcept override {
    group_->fail("rank " + std::to_string(rank_) + " failed: " + reason);
  }

 private:
  // Elements [offset, offset + count) of every rank's send, reduced in rank order, into recv.
  void reduce_to(const char* op_name, const void* send, void* recv, int64_t offset, int64_t count,
                 DType dtype, ReduceOp op) {
    Post p = make(op_name, count, dtype);
    p.reduce = op;
    p.send = send;
    group_->enter(rank_, p);
    std::vector<uint8_t> out(static_cast<size_t>(count * dtype_size(dtype)));
    reduce_into(out.data(), offset, count, dtype, op);
    group_->leave(rank_, p.op);  // every rank has read the inputs: recv may alias send
    std::memcpy(recv, out.data(), out.size());
  }

  Post make(const char* op, int64_t count, DType dtype) const {
    OCTET_CHECK(count >= 0, op, ": negative count ", count);
    Post p;
    p.op = op;
    p.count = count;
    p.dtype = dtype;
    return p;
  }
  static void check_ctx(const Context& ctx) {
    OCTET_CHECK(ctx.device == Device::kCpu,
                "the in-process communicator runs on the CPU backend only (use NCCL on CUDA)");
  }

  // out = op over ranks of elements [first, first + count) of every rank's send, in rank order.
  void reduce_into(uint8_t* out, int64_t first, int64_t count, DType dtype, ReduceOp op) const {
    const int64_t es = dtype_size(dtype);
    auto src = [&](int r) {
      return static_cast<const uint8_t*>(group_->post(r).send) + first * es;
    };
    switch (dtype) {
      case DType::kF32:
      case DType::kBF16: {
        std::vector<float> acc(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i)
          acc[static_cast<size_t>(i)] =
              dtype == DType::kBF16 ? bf16_to_float(reinterpret_cast<const uint16_t*>(src(0))[i])
                                    : reinterpret_cast<const float*>(src(0))[i];
        for (int r = 1; r < size(); ++r) combine(acc.data(), src(r), count, dtype, op);
        if (dtype == DType::kF32) {
          std::memcpy(out, acc.data(), static_cast<size_t>(count * 4));
        } else {
          auto* o = reinterpret_cast<uint16_t*>(out);
          for (int64_t i = 0; i < count; ++i) o[i] = float_to_bf16(acc[static_cast<size_t>(i)]);
        }
        return;
      }
      case DType::kI32:
      case DType::kI64:
        std::memcpy(out, src(0), static_cast<size_t>(count * es));
        for (int r = 1; r < size(); ++r) {
          if (dtype == DType::kI32)
            combine_int(reinterpret_cast<int32_t*>(out), src(r), count, op);
          else
            combine_int(reinterpret_cast<int64_t*>(out), src(r), count, op);
        }
        return;
      default:
        OCTET_THROW("reduction over ", dtype_name(dtype),
                    " is not supported (f32, bf16, i32, i64)");
    }
  }

  std::shared_ptr<Group> group_;
  int rank_;
};

}  // namespace

std::vector<std::shared_ptr<Comm>> make_inprocess_comms(int size,
                                                        std::chrono::milliseconds timeout) {
  OCTET_CHECK(size >= 1, "in-process group: size must be at least 1, got ", size);
  OCTET_CHECK(timeout.count() > 0, "in-process group: the timeout must be positive");
  auto group = std::make_shared<Group>(size, timeout);
  std::vector<std::shared_ptr<Comm>> comms;
  comms.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) comms.push_back(std::make_shared<InProcessComm>(group, r));
  return comms;
}

std::vector<std::string> run_inprocess_ranks(int size, const std::function<void(Context&)>& fn,
                                             std::chrono::milliseconds timeout) {
  const auto comms = make_inprocess_comms(size, timeout);
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      const std::shared_ptr<Comm>& comm = comms[static_cast<size_t>(r)];
      try {
        Context ctx = make_context(Device::kCpu);
        ctx.comm = comm;
        fn(ctx);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        comm->abort(e.what());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

void run_inprocess_ranks_or_throw(int size, const std::function<void(Context&)>& fn,
                                  std::chrono::milliseconds timeout) {
  const std::vector<std::string> errors = run_inprocess_ranks(size, fn, timeout);
  // The root cause first: a rank whose own work failed, not one that failed waiting for it.
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty() && errors[r].find("the process group failed") == std::string::npos)
      OCTET_THROW("rank ", r, ": ", errors[r]);
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) OCTET_THROW(errors[r]);
}

}  // namespace octet
