#include "dist/launch.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/check.h"
#include "dist/mpi_exchange.h"

namespace octet {
namespace {

int parse_int(const GetEnv& getenv, const char* name, int lo, int hi) {
  const char* s = getenv(name);
  OCTET_CHECK(s && *s, name, " is not set");
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  OCTET_CHECK(end != s && *end == '\0' && errno == 0 && v >= lo && v <= hi, name, "=", s,
              ": expected an integer in [", lo, ", ", hi, "]");
  return static_cast<int>(v);
}

int parse_int_or(const GetEnv& getenv, const char* name, int lo, int hi, int fallback) {
  const char* s = getenv(name);
  return s && *s ? parse_int(getenv, name, lo, hi) : fallback;
}

constexpr int kMaxWorld = 1 << 20;
constexpr uint32_t kMagic = 0x6f637430;  // "oct0"

}  // namespace

LaunchEnv launch_env_from(const GetEnv& getenv) {
  LaunchEnv e;
  auto set = [&](const char* name) {
    const char* s = getenv(name);
    return s && *s;
  };
  const char* rank_var = nullptr;
  const char* size_var = nullptr;
  const char* local_var = nullptr;
  const char* local_size_var = nullptr;
  if (set("RANK") || set("WORLD_SIZE")) {
    e.launcher = "torchrun";
    rank_var = "RANK", size_var = "WORLD_SIZE", local_var = "LOCAL_RANK";
    local_size_var = "LOCAL_WORLD_SIZE";
  } else if (set("SLURM_PROCID")) {
    e.launcher = "slurm";
    rank_var = "SLURM_PROCID", size_var = "SLURM_NTASKS", local_var = "SLURM_LOCALID";
    local_size_var = "SLURM_NTASKS_PER_NODE";
  } else if (set("OMPI_COMM_WORLD_RANK")) {
    e.launcher = "openmpi";
    rank_var = "OMPI_COMM_WORLD_RANK", size_var = "OMPI_COMM_WORLD_SIZE";
    local_var = "OMPI_COMM_WORLD_LOCAL_RANK", local_size_var = "OMPI_COMM_WORLD_LOCAL_SIZE";
  } else {
    return e;
  }
  e.world_size = parse_int(getenv, size_var, 1, kMaxWorld);
  e.rank = parse_int(getenv, rank_var, 0, kMaxWorld);
  OCTET_CHECK(e.rank < e.world_size, rank_var, "=", e.rank, " is not below ", size_var, "=",
              e.world_size);
  e.local_rank = parse_int_or(getenv, local_var, 0, kMaxWorld, -1);
  OCTET_CHECK(e.local_rank >= 0 || e.world_size == 1, local_var, " is not set (", e.launcher,
              " sets it: the GPU of this process)");
  if (e.local_rank < 0) e.local_rank = 0;
  // Slurm writes SLURM_NTASKS_PER_NODE as "4" or "4(x2)": the leading number is this node's.
  if (const char* s = getenv(local_size_var); s && *s) {
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    OCTET_CHECK(end != s && v >= 1 && v <= kMaxWorld, local_size_var, "=", s,
                ": expected a positive integer");
    e.local_world_size = static_cast<int>(v);
    OCTET_CHECK(e.local_rank < e.local_world_size, local_var, "=", e.local_rank, " is not below ",
                local_size_var, "=", e.local_world_size);
  } else {
    e.local_world_size = -1;
  }
  if (const char* a = getenv("MASTER_ADDR"); a && *a)
    e.master_addr = a;
  else if (const char* b = getenv("SLURM_LAUNCH_NODE_IPADDR"); e.launcher == "slurm" && b && *b)
    e.master_addr = b;
  e.mpi = mpi_built() && launched_by_mpi(getenv);
  if (e.world_size > 1 && !e.mpi)
    OCTET_CHECK(!e.master_addr.empty(), "MASTER_ADDR is not set: ", e.launcher, " launched ",
                e.world_size,
                " ranks and rank 0's host is needed for the "
                "rendezvous (export MASTER_ADDR=<rank 0's hostname>)");
  const bool port_required = e.launcher == "torchrun" && e.world_size > 1 && !e.mpi;
  e.master_port = port_required ? parse_int(getenv, "MASTER_PORT", 1, 65535)
                                : parse_int_or(getenv, "MASTER_PORT", 1, 65535, 29500);
  return e;
}

LaunchEnv launch_env() {
  return launch_env_from([](const char* n) { return std::getenv(n); });
}

namespace {

using Clock = std::chrono::steady_clock;

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)) : 0;
}

// Reads or writes exactly n bytes before the deadline; false on timeout, a closed peer or an error.
bool io_all(int fd, void* buf, size_t n, bool write, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    const int ready = ::poll(&pfd, 1, ms_left(deadline));
    if (ready <= 0) return false;
    const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

struct Hello {
  uint32_t magic;
  int32_t rank;
  int32_t world;
};

std::vector<uint8_t> serve(const LaunchEnv& env, const std::vector<uint8_t>& payload,
                           std::chrono::milliseconds timeout) {
  Fd s(::socket(AF_INET6, SOCK_STREAM, 0));
  bool v6 = s.fd >= 0;
  if (!v6) s.fd = ::socket(AF_INET, SOCK_STREAM, 0);
  OCTET_CHECK(s.fd >= 0, "rendezvous: socket: ", std::strerror(errno));
  const int one = 1, zero = 0;
  ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc;
  if (v6) {
    ::setsockopt(s.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(env.master_port));
    rc = ::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(env.master_port));
    rc = ::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  OCTET_CHECK(rc == 0, "rank 0: cannot listen on MASTER_PORT=", env.master_port, ": ",
              std::strerror(errno), " (another run on this port? pick a free MASTER_PORT)");
  OCTET_CHECK(::listen(s.fd, 128) == 0, "rank 0: listen: ", std::strerror(errno));
  const auto deadline = Clock::now() + timeout;
  std::vector<bool> seen(static_cast<size_t>(env.world_size), false);
  seen[0] = true;
  std::vector<std::unique_ptr<Fd>> peers;
  for (int joined = 1; joined < env.world_size;) {
    pollfd pfd{s.fd, POLLIN, 0};
    if (::poll(&pfd, 1, ms_left(deadline)) <= 0) {
      std::string missing;
      int n = 0;
      for (int r = 0; r < env.world_size; ++r)
        if (!seen[static_cast<size_t>(r)] && n++ < 16)
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      if (n > 16) missing += ", ... (" + std::to_string(n) + " in all)";
      OCTET_THROW("rank 0: rendezvous on port ", env.master_port, " timed out after ",
                  timeout.count() / 1000.0, " s: rank(s) ", missing, " never connected");
    }
    auto c = std::make_unique<Fd>(::accept(s.fd, nullptr, nullptr));
    if (c->fd < 0) continue;
    Hello h{};
    if (!io_all(c->fd, &h, sizeof h, false, deadline) || h.magic != kMagic) continue;  // a stray
    std::string refuse;
    if (h.world != env.world_size)
      refuse = "rank " + std::to_string(h.rank) + " has world size " + std::to_string(h.world) +
               ", rank 0 has " + std::to_string(env.world_size);
    else if (h.rank <= 0 || h.rank >= env.world_size || seen[static_cast<size_t>(h.rank)])
      refuse = "rank " + std::to_string(h.rank) + " joined twice or is not a rank";
    const uint64_t status = refuse.empty() ? payload.size() : ~uint64_t{0};
    io_all(c->fd, const_cast<uint64_t*>(&status), sizeof status, true, deadline);
    if (!refuse.empty()) {
      uint64_t n = refuse.size();
      io_all(c->fd, &n, sizeof n, true, deadline);
      io_all(c->fd, refuse.data(), refuse.size(), true, deadline);
      OCTET_THROW("rank 0: rendezvous: ", refuse);
    }
    io_all(c->fd, const_cast<uint8_t*>(payload.data()), payload.size(), true, deadline);
    seen[static_cast<size_t>(h.rank)] = true;
    ++joined;
    peers.push_back(std::move(c));
  }
  // Every peer has its copy: wait until each closed its end (read them to EOF), so that rank 0
  // does not close first and leave a peer's read racing the reset.
  for (auto& c : peers) {
    uint8_t b;
    io_all(c->fd, &b, 1, false, deadline);
  }
  return payload;
}

std::vector<uint8_t> join(const LaunchEnv& env, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error = "no attempt";
  while (Clock::now() < deadline) {
    addrinfo* res = nullptr;
    const std::string port = std::to_string(env.master_port);
    const int g = ::getaddrinfo(env.master_addr.c_str(), port.c_str(), &hints, &res);
    if (g != 0) {
      last_error =
          std::string("cannot resolve MASTER_ADDR=") + env.master_addr + ": " + gai_strerror(g);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      Fd c(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
      if (c.fd < 0) continue;
      if (::connect(c.fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        last_error = std::strerror(errno);
        continue;
      }
      const Hello h{kMagic, env.rank, env.world_size};
      uint64_t status = 0;
      if (!io_all(c.fd, const_cast<Hello*>(&h), sizeof h, true, deadline) ||
          !io_all(c.fd, &status, sizeof status, false, deadline)) {
        last_error = "rank 0 closed the connection";
        continue;
      }
      if (status == ~uint64_t{0}) {
        uint64_t n = 0;
        std::string why = "refused";
        if (io_all(c.fd, &n, sizeof n, false, deadline) && n < 4096) {
          why.resize(n);
          io_all(c.fd, why.data(), n, false, deadline);
        }
        ::freeaddrinfo(res);
        OCTET_THROW("rank ", env.rank, ": rendezvous refused by rank 0: ", why);
      }
      OCTET_CHECK(status < (1u << 20), "rank ", env.rank, ": rendezvous: bad reply");
      std::vector<uint8_t> payload(status);
      if (!io_all(c.fd, payload.data(), payload.size(), false, deadline)) {
        last_error = "rank 0 closed the connection";
        continue;
      }
      ::freeaddrinfo(res);
      return payload;
    }
    ::freeaddrinfo(res);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  OCTET_THROW("rank ", env.rank, ": rendezvous: could not reach rank 0 at ", env.master_addr, ":",
              env.master_port, " within ", timeout.count() / 1000.0, " s (", last_error,
              "); is rank 0 running and MASTER_ADDR/MASTER_PORT the same on every rank?");
}

}  // namespace

std::vector<uint8_t> tcp_rendezvous(const LaunchEnv& env, const std::vector<uint8_t>& payload,
                                    std::chrono::milliseconds timeout) {
  if (env.world_size == 1) return payload;
  OCTET_CHECK(env.master_port > 0, "rendezvous: MASTER_PORT is not set");
  return env.rank == 0 ? serve(env, payload, timeout) : join(env, timeout);
}

}  // namespace octet
