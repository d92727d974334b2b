// Run directories (run_dir.h).
#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/check.h"
#include "io/atomic_file.h"

namespace octet::train {
namespace {

namespace fs = std::filesystem;

const char* const kLockFile = ".lock";
// What a run writes into its directory besides run.json and the lock.
const char* const kRunFiles[] = {"config.toml", "metrics.jsonl", "checkpoints"};

std::string new_run_id() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(r));
  return buf;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string write_record(const std::string& dir) {
  std::string id = new_run_id();
  const nlohmann::json j = {{"run_id", id}, {"created", utc_now()}};
  io::write_text_file_atomic((fs::path(dir) / kRunRecordFile).string(), j.dump(1) + "\n");
  return id;
}

// "run 0123abcd... (created ...)" or "a run" for one without run.json, for messages.
std::string describe_run(const std::string& dir) {
  std::ifstream in(fs::path(dir) / kRunRecordFile);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object() || !j.contains("run_id") || !j["run_id"].is_string()) return "a run";
  std::string s = "run " + j["run_id"].get<std::string>();
  if (j.contains("created") && j["created"].is_string())
    s += " (started " + j["created"].get<std::string>() + ")";
  return s;
}

}  // namespace

RunDirLock& RunDirLock::operator=(RunDirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
}

RunDirLock lock_run_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  OCTET_CHECK(!ec && fs::is_directory(dir), "run_dir ", dir, ": cannot create the directory (",
              ec ? ec.message() : "not a directory", ")");
  OCTET_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "run_dir ", dir, ": not writable");
  const std::string path = (fs::path(dir) / kLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  OCTET_CHECK(fd >= 0, "run_dir ", dir, ": cannot open its lock file ", path, ": ",
              std::strerror(errno));
  RunDirLock lock(fd);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    OCTET_CHECK(err != EWOULDBLOCK, "run_dir ", dir, " is in use by another octet process",
                holder.empty() ? "" : " (pid " + holder + ")",
                "; wait for it to finish, or stop it");
    OCTET_THROW("run_dir ", dir, ": cannot lock ", path, ": ", std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) == 0) {
    const ssize_t w = ::pwrite(fd, pid.data(), pid.size(), 0);
    (void)w;  // the pid is for messages only
  }
  return lock;
}

bool holds_run(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kRunRecordFile, ec)) return true;
  for (const char* f : kRunFiles)
    if (fs::exists(fs::symlink_status(fs::path(dir) / f, ec))) return true;
  return false;
}

std::string run_id_of(const std::string& dir) {
  std::ifstream in(fs::path(dir) / kRunRecordFile);
  if (!in) return "";
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  return j.is_object() && j.contains("run_id") && j["run_id"].is_string()
             ? j["run_id"].get<std::string>()
             : "";
}

std::string start_new_run(const std::string& dir, RunStart how, std::string* removed) {
  if (holds_run(dir)) {
    OCTET_CHECK(how == RunStart::kOverwrite, "run_dir ", dir, " already holds ", describe_run(dir),
                "; continue it with --resume ", dir,
                ", choose another run_dir, or pass --overwrite to delete that run and start over");
    std::string list;
    for (const char* f : {kRunRecordFile, kRunFiles[0], kRunFiles[1], kRunFiles[2]}) {
      std::error_code ec;
      const fs::path p = fs::path(dir) / f;
      if (!fs::exists(fs::symlink_status(p, ec))) continue;
      fs::remove_all(p, ec);
      OCTET_CHECK(!ec, "run_dir ", dir, ": cannot remove ", p.string(),
                  " of the old run: ", ec.message());
      list += (list.empty() ? "" : ", ") + std::string(f);
    }
    if (removed) *removed = "removed the previous run in " + dir + " (" + list + ")";
  }
  return write_record(dir);
}

std::string ensure_run_record(const std::string& dir) {
  const std::string id = run_id_of(dir);
  return id.empty() ? write_record(dir) : id;
}

int remove_stale_checkpoint_staging(const std::string& checkpoints_dir) {
  std::error_code ec;
  if (!fs::is_directory(checkpoints_dir, ec)) return 0;
  int n = 0;
  for (const auto& e : fs::directory_iterator(checkpoints_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) != 0) continue;
    if (name.find(".partial") == std::string::npos && name.find(".tmp.") == std::string::npos)
      continue;
    std::error_code rm;
    fs::remove_all(e.path(), rm);
    if (!rm) ++n;
  }
  return n;
}

std::string run_dir_of_checkpoint(const std::string& ckpt) {
  fs::path c = fs::path(ckpt).lexically_normal();
  if (c.filename().empty()) c = c.parent_path();
  if (c.parent_path().filename() != "checkpoints") {  // e.g. "." inside the checkpoint
    c = fs::absolute(c).lexically_normal();
    if (c.filename().empty()) c = c.parent_path();
    if (c.parent_path().filename() != "checkpoints") return "";
  }
  const fs::path run = c.parent_path().parent_path();
  return run.empty() ? "." : run.string();
}

std::string first_free_run_dir(const std::string& base) {
  if (!holds_run(base)) return base;
  for (int i = 2;; ++i) {
    std::string d = base + "-" + std::to_string(i);
    if (!holds_run(d)) return d;
  }
}

}  // namespace octet::train
