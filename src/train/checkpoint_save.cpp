#include "train/checkpoint_save.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "io/atomic_file.h"

namespace octet::train {

namespace fs = std::filesystem;

struct CheckpointSaver::State {
  std::string staging, final_dir;
  int rank = 0, world = 1;
  std::string error;  // this rank's failure; "" when it succeeded
  std::atomic<bool> cancel{false};
  bool reported = false;  // thrown by finish()
};

namespace {

std::string marker(const std::string& staging, int rank, bool ok) {
  return staging + "/.rank-" + std::to_string(rank) + (ok ? ".ok" : ".failed");
}

void pwrite_all(int fd, const void* data, int64_t bytes, int64_t at, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, static_cast<size_t>(std::min<int64_t>(bytes, 1 << 30)), at);
    if (n < 0 && errno == EINTR) continue;
    OCTET_CHECK(n > 0, path, ": cannot write: ", std::strerror(errno));
    p += n;
    at += n;
    bytes -= n;
  }
}

// This rank's part: its ranges (from the snapshot at `offsets`) and the headers it writes.
void write_part(const std::string& staging, const CheckpointPlan& plan, int rank,
                const uint8_t* snapshot, const std::vector<int64_t>& offsets,
                const std::function<void(const std::string&)>& hook) {
  for (size_t f = 0; f < plan.files.size(); ++f) {
    std::vector<size_t> mine;
    for (size_t i = 0; i < plan.ranges.size(); ++i)
      if (plan.ranges[i].rank == rank && plan.ranges[i].file == f) mine.push_back(i);
    const bool header = plan.header_writer[f] == rank;
    if (mine.empty() && !header) continue;
    const std::string path = staging + "/" + plan.files[f].name;
    if (hook) hook(plan.files[f].name);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    OCTET_CHECK(fd >= 0, path, ": cannot open for writing: ", std::strerror(errno));
    try {
      const io::SafetensorsLayout& l = plan.layouts[f];
      OCTET_CHECK(::ftruncate(fd, l.file_bytes) == 0, path, ": cannot size it to ", l.file_bytes,
                  " bytes: ", std::strerror(errno));
      if (header) pwrite_all(fd, l.prefix.data(), static_cast<int64_t>(l.prefix.size()), 0, path);
      for (size_t i : mine) {
        const WriteRange& r = plan.ranges[i];
        const int64_t es = dtype_size(plan.files[f].tensors[r.tensor].dtype);
        pwrite_all(fd, snapshot + offsets[i], (r.end - r.begin) * es,
                   l.offset[r.tensor] + r.begin * es, path);
      }
      OCTET_CHECK(::fsync(fd) == 0, path, ": cannot sync: ", std::strerror(errno));
    } catch (...) {
      ::close(fd);
      throw;
    }
    OCTET_CHECK(::close(fd) == 0, path, ": cannot close: ", std::strerror(errno));
  }
}

// Rank 0: waits for every rank's marker. Returns the first failed rank, or -1 when all are ok.
int wait_for_markers(const CheckpointSaver::State& s, std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int missing = -1;
    for (int r = 0; r < s.world; ++r) {
      std::error_code ec;
      if (fs::exists(marker(s.staging, r, false), ec)) return r;
      if (missing < 0 && !fs::exists(marker(s.staging, r, true), ec)) missing = r;
    }
    if (missing < 0) return -1;
    OCTET_CHECK(!s.cancel.load(), "stopped while waiting for rank ", missing, " to write its part");
    OCTET_CHECK(std::chrono::steady_clock::now() - start < timeout, "rank ", missing,
                " did not report its part within ", timeout.count() / 1000, " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

CheckpointSaver::~CheckpointSaver() {
  if (state_) state_->cancel = true;
  try {
    writer_.wait();  // the job catches its own errors
  } catch (...) {
  }
  if (state_ && !state_->error.empty() && !state_->reported)
    std::fprintf(stderr, "octet: checkpoint %s was not written: %s\n", state_->final_dir.c_str(),
                 state_->error.c_str());
}

void CheckpointSaver::save(Context& ctx, Comm* comm, SaveRequest req) {
  finish(ctx, comm);
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  OCTET_CHECK(req.plan.world == world, "checkpoint ", req.name, ": the plan is for ",
              req.plan.world, " ranks, the run has ", world);
  auto st = std::make_shared<State>();
  st->staging = req.root + "/" + req.name + ".partial";
  st->final_dir = req.root + "/" + req.name;
  st->rank = rank;
  st->world = world;
  if (rank == 0) {
    std::error_code ec;
    fs::remove_all(st->staging, ec);
    fs::create_directories(st->staging, ec);
    OCTET_CHECK(!ec, st->staging,
                ": cannot create the checkpoint's staging directory: ", ec.message());
  }
  if (world > 1) comm->barrier(ctx);  // the staging directory exists before anyone writes

  // The snapshot, stream-ordered into the reused host buffer.
  std::vector<int64_t> offsets(req.plan.ranges.size(), 0);
  int64_t total = 0;
  for (size_t i = 0; i < req.plan.ranges.size(); ++i) {
    const WriteRange& r = req.plan.ranges[i];
    if (r.rank != rank) continue;
    OCTET_CHECK(r.data != nullptr, "checkpoint ", req.name, ": rank ", rank, " writes ",
                req.plan.files[r.file].tensors[r.tensor].name, " but does not hold it");
    offsets[i] = total;
    total += ((r.end - r.begin) * dtype_size(req.plan.files[r.file].tensors[r.tensor].dtype) + 63) /
             64 * 64;
  }
  buffer_.reserve(ctx.device, total);
  for (size_t i = 0; i < req.plan.ranges.size(); ++i) {
    const WriteRange& r = req.plan.ranges[i];
    if (r.rank != rank) continue;
    const int64_t bytes =
        (r.end - r.begin) * dtype_size(req.plan.files[r.file].tensors[r.tensor].dtype);
    if (r.on_host)
      std::memcpy(buffer_.data() + offsets[i], r.data, static_cast<size_t>(bytes));
    else
      io::copy_to_host_async(ctx, buffer_.data() + offsets[i], r.data, bytes);
  }
  std::shared_ptr<io::StreamFence> fence = io::StreamFence::record(ctx);
  state_ = st;
  writer_.submit([st, fence, snapshot = buffer_.data(), offsets = std::move(offsets),
                  req = std::move(req), hook = before_write, timeout = timeout] {
    try {
      fence->wait();
      write_part(st->staging, req.plan, st->rank, snapshot, offsets, hook);
      io::write_text_file_atomic(marker(st->staging, st->rank, true), "ok\n");
    } catch (const std::exception& e) {
      st->error = e.what();
      try {
        io::write_text_file_atomic(marker(st->staging, st->rank, false), st->error);
      } catch (...) {
      }
      return;
    }
    if (st->rank != 0) return;
    try {
      if (wait_for_markers(*st, timeout) >= 0) return;  // that rank reports its own failure
      for (const auto& [name, write] : req.rank0_files) write(st->staging + "/" + name);
      for (int r = 0; r < st->world; ++r) fs::remove(marker(st->staging, r, true));
      std::error_code ec;
      fs::remove_all(st->final_dir, ec);       // the same step saved again (after a rollback)
      fs::rename(st->staging, st->final_dir);  // the checkpoint appears whole or not at all
      if (req.after_commit) req.after_commit();
    } catch (const std::exception& e) {
      st->error = e.what();
      try {
        if (fs::exists(st->staging))
          io::write_text_file_atomic(marker(st->staging, 0, false), st->error);
      } catch (...) {
      }
    }
  });
}

void CheckpointSaver::finish(Context& ctx, Comm* comm) {
  if (!state_) return;
  writer_.wait();
  const std::shared_ptr<State> st = std::move(state_);
  const int64_t mine = st->error.empty() ? 0 : 1;
  std::vector<int64_t> failed = {mine};
  if (comm && comm->size() > 1) failed = all_gather_values(ctx, *comm, mine);
  st->reported = true;
  for (size_t k = 0; k < failed.size(); ++k) {
    if (failed[k] == 0) continue;
    std::string msg = static_cast<int>(k) == st->rank
                          ? st->error
                          : read_text(marker(st->staging, static_cast<int>(k), false));
    if (msg.empty()) msg = "(its message is in that rank's output)";
    OCTET_THROW("checkpoint ", st->final_dir, " was not written: ",
                failed.size() > 1 ? "rank " + std::to_string(k) + " failed: " : "", msg,
                "; the checkpoints before it are untouched");
  }
}

}  // namespace octet::train
