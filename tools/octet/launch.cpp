#include "launch.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "backend/backend.h"
#include "core/check.h"
#include "dist/mpi_exchange.h"
#include "dist/nccl_comm.h"

namespace octet::cli {
namespace {

std::atomic<int> g_forward{0};

extern "C" void on_launcher_signal(int sig) {
  g_forward.store(sig);
}

int free_local_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  OCTET_CHECK(s >= 0, "--nproc: socket: ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(s);
  OCTET_CHECK(ok, "--nproc: cannot find a free local port: ", std::strerror(errno));
  return ntohs(a.sin_port);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended";
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

int spawn_local_ranks(int nproc, const std::vector<std::string>& child_args,
                      const std::vector<std::string>& command) {
  OCTET_CHECK(nproc >= 1 && nproc <= 1024, "--nproc ", nproc, ": expected 1 to 1024 ranks");
  OCTET_CHECK(!std::getenv("RANK") && !std::getenv("WORLD_SIZE"),
              "--nproc starts its own ranks: it cannot run inside a launched rank (RANK or "
              "WORLD_SIZE is set)");
  const int port = free_local_port();
  std::vector<std::string> argv = {"octet"};
  argv.insert(argv.end(), command.begin(), command.end());
  std::string who = "octet";  // "octet train", for the messages
  for (const std::string& c : command) who += " " + c;
  argv.insert(argv.end(), child_args.begin(), child_args.end());
  std::vector<char*> cargv;
  cargv.reserve(argv.size() + 1);
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = ::fork();
    OCTET_CHECK(pid >= 0, "--nproc: fork: ", std::strerror(errno));
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      // NVLink SHARP (multicast) stays off in every environment this launcher builds.
      ::setenv("NCCL_NVLS_ENABLE", "0", 1);
      ::execv("/proc/self/exe", cargv.data());
      std::fprintf(stderr, "%s: rank %d: cannot start %s: %s\n", who.c_str(), r, "/proc/self/exe",
                   std::strerror(errno));
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  // Signals to the launcher go on to the ranks (each finishes its step and writes a checkpoint).
  struct sigaction sa = {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  int first_failure = -1, result = 0, running = nproc;
  std::vector<bool> done(static_cast<size_t>(nproc), false);
  while (running > 0) {
    if (const int sig = g_forward.exchange(0))
      for (int r = 0; r < nproc; ++r)
        if (!done[static_cast<size_t>(r)]) ::kill(pids[static_cast<size_t>(r)], sig);
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    int r = 0;
    while (r < nproc && pids[static_cast<size_t>(r)] != pid) ++r;
    if (r == nproc) continue;
    done[static_cast<size_t>(r)] = true;
    --running;
    if (exit_code(status) != 0 && first_failure < 0) {
      first_failure = r;
      result = exit_code(status);
      std::fprintf(stderr, "%s: rank %d %s%s\n", who.c_str(), r, describe_status(status).c_str(),
                   running > 0 ? "; stopping the other ranks" : "");
      for (int o = 0; o < nproc; ++o)
        if (!done[static_cast<size_t>(o)]) ::kill(pids[static_cast<size_t>(o)], SIGTERM);
    }
  }
  return result;
}

std::shared_ptr<Comm> join_launch(const LaunchEnv& env) {
  if (env.world_size <= 1) return nullptr;
  OCTET_CHECK(nccl_built(), "rank ", env.rank, " of ", env.world_size,
              ": several ranks need NCCL, and this build has none (",
              cuda_built() ? "CUDA without libnccl" : "a CPU-only build", ")");
  const int gpus = cuda_device_count();
  OCTET_CHECK(env.local_rank < gpus, "rank ", env.rank, ": LOCAL_RANK=", env.local_rank,
              " but this machine shows ", gpus, " GPU(s); start at most one rank per GPU");
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);  // unless the user set it
  const auto timeout = default_comm_timeout();
  std::vector<uint8_t> id_bytes;
  if (env.rank == 0) {
    const NcclId id = nccl_unique_id();
    id_bytes.assign(id.bytes.begin(), id.bytes.end());
  }
  if (env.mpi) {
    id_bytes = mpi_broadcast_bytes(env, id_bytes);
  } else {
    if (env.rank == 0 && launched_by_mpi([](const char* n) { return std::getenv(n); }))
      std::fprintf(stderr,
                   "note: launched by MPI, but this build has no MPI (libopenmpi-dev): the NCCL id "
                   "goes through the TCP rendezvous on %s:%d\n",
                   env.master_addr.c_str(), env.master_port);
    id_bytes = tcp_rendezvous(env, id_bytes, timeout);
  }
  NcclId id;
  OCTET_CHECK(id_bytes.size() == id.bytes.size(), "rank ", env.rank, ": the rendezvous returned ",
              id_bytes.size(), " bytes, not an NCCL id");
  std::memcpy(id.bytes.data(), id_bytes.data(), id.bytes.size());
  Context ctx = make_context(Device::kCuda, env.local_rank);
  return make_nccl_comm(ctx, id, env.rank, env.world_size, timeout);
}

}  // namespace octet::cli
