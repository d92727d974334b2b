// The in-process communicator (every collective at 1-4 ranks against a sequential reference, split
// into a 2 x 2 grid, failures and timeouts on every rank), the launch environment and the TCP
// rendezvous.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "dist/comm.h"
#include "dist/inprocess_comm.h"
#include "dist/launch.h"
#include "dist/nccl_comm.h"
#include "numerics/fp8.h"

namespace octet {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kTimeout{20000};

// A value no two (rank, index) pairs share, with bits below FP32's rounding of sums.
float value(int rank, int64_t i) {
  return 1.0f / static_cast<float>(3 + rank * 7 + i) + static_cast<float>(rank) * 0.37f;
}

class CommRanks : public ::testing::TestWithParam<int> {};

TEST_P(CommRanks, AllReduceIsTheRankOrderSum) {
  const int n = GetParam();
  const int64_t count = 1000;
  std::vector<float> expected(count);
  for (int64_t i = 0; i < count; ++i) {
    float acc = value(0, i);
    for (int r = 1; r < n; ++r) acc += value(r, i);
    expected[static_cast<size_t>(i)] = acc;
  }
  run_inprocess_ranks_or_throw(
      n,
      [&](Context& ctx) {
        Comm& c = comm_of(ctx);
        EXPECT_EQ(c.size(), n);
        std::vector<float> x(count), y(count);
        for (int64_t i = 0; i < count; ++i) x[static_cast<size_t>(i)] = value(c.rank(), i);
        c.all_reduce(ctx, x.data(), y.data(), count, DType::kF32, ReduceOp::kSum);
        EXPECT_EQ(0, std::memcmp(y.data(), expected.data(), count * 4)) << "rank " << c.rank();
        c.all_reduce(ctx, x.data(), x.data(), count, DType::kF32, ReduceOp::kSum);  // in place
        EXPECT_EQ(0, std::memcmp(x.data(), expected.data(), count * 4)) << "rank " << c.rank();
        int32_t m = 10 * c.rank() - 3, mx = 0;
        c.all_reduce(ctx, &m, &mx, 1, DType::kI32, ReduceOp::kMax);
        EXPECT_EQ(mx, 10 * (n - 1) - 3);
        std::vector<uint16_t> b(4), bs(4);
        for (int i = 0; i < 4; ++i) b[i] = float_to_bf16(value(c.rank(), i));
        c.all_reduce(ctx, b.data(), bs.data(), 4, DType::kBF16, ReduceOp::kSum);
        for (int i = 0; i < 4; ++i) {
          float acc = bf16_to_float(float_to_bf16(value(0, i)));
          for (int r = 1; r < n; ++r) acc += bf16_to_float(float_to_bf16(value(r, i)));
          EXPECT_EQ(bs[i], float_to_bf16(acc));
        }
      },
      kTimeout);
}

TEST_P(CommRanks, ReduceScatterAllGatherBroadcast) {
  const int n = GetParam();
  const int64_t block = 37;
  run_inprocess_ranks_or_throw(
      n,
      [&](Context& ctx) {
        Comm& c = comm_of(ctx);
        const int me = c.rank();
        std::vector<float> x(block * n), y(block);
        for (int64_t i = 0; i < block * n; ++i) x[static_cast<size_t>(i)] = value(me, i);
        c.reduce_scatter(ctx, x.data(), y.data(), block, DType::kF32, ReduceOp::kSum);
        for (int64_t i = 0; i < block; ++i) {
          float acc = value(0, me * block + i);
          for (int r = 1; r < n; ++r) acc += value(r, me * block + i);
          ASSERT_EQ(y[static_cast<size_t>(i)], acc) << "rank " << me << " element " << i;
        }
        std::vector<int64_t> g(static_cast<size_t>(2 * n));
        const int64_t mine[2] = {me, 100 + me};
        c.all_gather(ctx, mine, g.data(), 2, DType::kI64);
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(g[static_cast<size_t>(2 * r)], r);
          EXPECT_EQ(g[static_cast<size_t>(2 * r + 1)], 100 + r);
        }
        int32_t v[3] = {me, me + 1, me + 2};
        c.broadcast(ctx, v, 3, DType::kI32, n - 1);
        EXPECT_EQ(v[0], n - 1);
        EXPECT_EQ(v[2], n + 1);
        c.barrier(ctx);
        const std::vector<double> losses = all_gather_values(ctx, c, 0.5 * me);
        ASSERT_EQ(losses.size(), static_cast<size_t>(n));
        EXPECT_EQ(losses.back(), 0.5 * (n - 1));
      },
      kTimeout);
}

// Rank r sends (r + p + 1) bytes "r*16+p" to rank p; the receiver checks every byte.
TEST_P(CommRanks, AllToAllVUnevenCounts) {
  const int n = GetParam();
  run_inprocess_ranks_or_throw(
      n,
      [&](Context& ctx) {
        Comm& c = comm_of(ctx);
        const int me = c.rank();
        std::vector<int64_t> sc(n), sd(n), rc(n), rd(n);
        std::vector<uint8_t> send;
        for (int p = 0; p < n; ++p) {
          sc[p] = me + p + 1;
          sd[p] = static_cast<int64_t>(send.size());
          send.insert(send.end(), static_cast<size_t>(sc[p]), static_cast<uint8_t>(me * 16 + p));
        }
        int64_t total = 0;
        for (int p = 0; p < n; ++p) {  // received back to front: displacements need not ascend
          rc[n - 1 - p] = (n - 1 - p) + me + 1;
        }
        for (int p = n - 1; p >= 0; --p) {
          rd[p] = total;
          total += rc[p];
        }
        std::vector<uint8_t> recv(static_cast<size_t>(total), 0xEE);
        c.all_to_all_v(ctx, send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(),
                       DType::kE4M3);
        for (int p = 0; p < n; ++p)
          for (int64_t k = 0; k < rc[p]; ++k)
            ASSERT_EQ(recv[static_cast<size_t>(rd[p] + k)], p * 16 + me)
                << "rank " << me << " from " << p;
      },
      kTimeout);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommRanks, ::testing::Values(1, 2, 3, 4));

TEST(Comm, SplitMakesADataByExpertGrid) {
  // World 4 as DP 2 x EP 2: EP groups {0,1} {2,3} (color rank / 2), DP groups {0,2} {1,3}.
  run_inprocess_ranks_or_throw(
      4,
      [&](Context& ctx) {
        Comm& world = comm_of(ctx);
        const int me = world.rank();
        const std::shared_ptr<Comm> ep = world.split(ctx, me / 2, me);
        const std::shared_ptr<Comm> dp = world.split(ctx, me % 2, me);
        ASSERT_EQ(ep->size(), 2);
        ASSERT_EQ(dp->size(), 2);
        EXPECT_EQ(ep->rank(), me % 2);
        EXPECT_EQ(dp->rank(), me / 2);
        int32_t x = 1 << me, s = 0;
        ep->all_reduce(ctx, &x, &s, 1, DType::kI32, ReduceOp::kSum);
        EXPECT_EQ(s, me < 2 ? 3 : 12);
        dp->all_reduce(ctx, &x, &s, 1, DType::kI32, ReduceOp::kSum);
        EXPECT_EQ(s, me % 2 == 0 ? 5 : 10);
        EXPECT_EQ(world.split(ctx, me == 0 ? 0 : -1, 0) == nullptr, me != 0);
      },
      kTimeout);
}

TEST(Comm, APeerThatNeverJoinsFailsEveryRankWithinTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::string> errors = run_inprocess_ranks(
      3,
      [](Context& ctx) {
        Comm& c = comm_of(ctx);
        if (c.rank() == 1) return;  // never joins
        float x = 1, y = 0;
        c.all_reduce(ctx, &x, &y, 1, DType::kF32, ReduceOp::kSum);
      },
      milliseconds(300));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 10.0);
  EXPECT_EQ(errors[1], "");
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find("all_reduce timed out after 0.3 s waiting for rank(s) 1"),
              std::string::npos)
        << errors[r];
  }
}

TEST(Comm, ARankThatFailsFailsItsPeers) {
  const std::vector<std::string> errors = run_inprocess_ranks(
      4,
      [](Context& ctx) {
        Comm& c = comm_of(ctx);
        if (c.rank() == 2) throw std::runtime_error("out of data");
        c.barrier(ctx);
      },
      kTimeout);
  EXPECT_EQ(errors[2], "out of data");
  for (int r : {0, 1, 3})
    EXPECT_NE(errors[r].find("rank 2 failed: out of data"), std::string::npos) << errors[r];
  try {
    run_inprocess_ranks_or_throw(
        2,
        [](Context& ctx) {
          if (comm_of(ctx).rank() == 1) throw std::runtime_error("bad batch");
          comm_of(ctx).barrier(ctx);
        },
        kTimeout);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 1: bad batch");  // the cause, not the peer's wait
  }
}

TEST(Comm, MismatchedCollectivesFailEveryRank) {
  const std::vector<std::string> errors = run_inprocess_ranks(
      2,
      [](Context& ctx) {
        Comm& c = comm_of(ctx);
        float x[4] = {}, y[4];
        c.all_reduce(ctx, x, y, c.rank() == 0 ? 4 : 3, DType::kF32, ReduceOp::kSum);
      },
      kTimeout);
  for (const std::string& e : errors)
    EXPECT_NE(e.find("ranks called different collectives: rank 0 all_reduce(count 4, F32), "
                     "rank 1 all_reduce(count 3, F32)"),
              std::string::npos)
        << e;
}

TEST(Comm, NcclWithoutNcclSaysSo) {
  if (nccl_built()) GTEST_SKIP() << "this build has NCCL (the GPU suite tests it)";
  Context ctx;
  EXPECT_THROW(nccl_unique_id(), Error);
}

using Env = std::map<std::string, std::string>;
LaunchEnv parse(const Env& env) {
  return launch_env_from([&](const char* n) -> const char* {
    const auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}
std::string parse_error(const Env& env) {
  try {
    parse(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Launch, ReadsTorchrunSlurmAndOpenMpi) {
  LaunchEnv e = parse({});
  EXPECT_EQ(e.launcher, "none");
  EXPECT_EQ(e.world_size, 1);
  e = parse({{"RANK", "3"},
             {"WORLD_SIZE", "8"},
             {"LOCAL_RANK", "1"},
             {"LOCAL_WORLD_SIZE", "2"},
             {"MASTER_ADDR", "node0"},
             {"MASTER_PORT", "29501"}});
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29501);
  e = parse({{"SLURM_PROCID", "5"},
             {"SLURM_NTASKS", "16"},
             {"SLURM_LOCALID", "5"},
             {"SLURM_NTASKS_PER_NODE", "8(x2)"},
             {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.1"}});
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_world_size, 8);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  e = parse({{"OMPI_COMM_WORLD_RANK", "1"},
             {"OMPI_COMM_WORLD_SIZE", "2"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
             {"MASTER_ADDR", "h"},
             {"MASTER_PORT", "1234"}});
  EXPECT_EQ(e.launcher, "openmpi");
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_port, 1234);
}

TEST(Launch, BadValuesNameTheVariable) {
  EXPECT_EQ(parse_error({{"RANK", "2"},
                         {"WORLD_SIZE", "2"},
                         {"LOCAL_RANK", "0"},
                         {"MASTER_ADDR", "h"},
                         {"MASTER_PORT", "1"}}),
            "RANK=2 is not below WORLD_SIZE=2");
  EXPECT_EQ(parse_error({{"RANK", "0"}, {"WORLD_SIZE", "two"}}),
            "WORLD_SIZE=two: expected an integer in [1, 1048576]");
  EXPECT_EQ(parse_error({{"RANK", "0"}}), "WORLD_SIZE is not set");
  EXPECT_NE(parse_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}})
                .find("MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_EQ(parse_error({{"RANK", "0"},
                         {"WORLD_SIZE", "2"},
                         {"LOCAL_RANK", "0"},
                         {"MASTER_ADDR", "h"},
                         {"MASTER_PORT", "70000"}}),
            "MASTER_PORT=70000: expected an integer in [1, 65535]");
  EXPECT_EQ(parse_error({{"RANK", "1"},
                         {"WORLD_SIZE", "2"},
                         {"LOCAL_RANK", "3"},
                         {"LOCAL_WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "h"},
                         {"MASTER_PORT", "9"}}),
            "LOCAL_RANK=3 is not below LOCAL_WORLD_SIZE=2");
}

int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

TEST(Rendezvous, RankZeroHandsItsPayloadToEveryRank) {
  const int port = free_port();
  const int n = 4;
  std::vector<std::vector<uint8_t>> got(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      LaunchEnv e;
      e.rank = r;
      e.world_size = n;
      e.master_addr = "localhost";
      e.master_port = port;
      try {
        got[r] =
            tcp_rendezvous(e, r == 0 ? std::vector<uint8_t>{1, 2, 3, 250} : std::vector<uint8_t>{},
                           milliseconds(20000));
      } catch (const Error& x) {
        errors[r] = x.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(got[r], (std::vector<uint8_t>{1, 2, 3, 250})) << "rank " << r;
  }
}

TEST(Rendezvous, MissingRanksAndAnAbsentRankZeroTimeOut) {
  LaunchEnv e;
  e.rank = 0;
  e.world_size = 3;
  e.master_addr = "127.0.0.1";
  e.master_port = free_port();
  try {
    tcp_rendezvous(e, {7}, milliseconds(300));
    FAIL() << "no error";
  } catch (const Error& x) {
    EXPECT_NE(std::string(x.what()).find("timed out after 0.3 s: rank(s) 1, 2 never connected"),
              std::string::npos)
        << x.what();
  }
  e.rank = 2;
  try {
    tcp_rendezvous(e, {}, milliseconds(300));
    FAIL() << "no error";
  } catch (const Error& x) {
    EXPECT_NE(std::string(x.what()).find("rank 2: rendezvous: could not reach rank 0 at "
                                         "127.0.0.1:" +
                                         std::to_string(e.master_port)),
              std::string::npos)
        << x.what();
  }
}

}  // namespace
}  // namespace octet
