// Run by tests/dist/mpi_test.cpp under `mpirun -np N`: reads the launch environment as `octet
// train` does, exchanges a 128-byte id (rank 0's, made from its process id so that no other rank
// can know it in advance) through mpi_broadcast_bytes, and prints one line per rank:
//   rank R of N (launcher L, mpi M): sent|got <hex>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "dist/launch.h"
#include "dist/mpi_exchange.h"

int main() {
  try {
    const octet::LaunchEnv env = octet::launch_env();
    std::vector<uint8_t> id;
    if (env.rank == 0) {
      uint32_t x = static_cast<uint32_t>(::getpid()) * 2654435761u + 1;
      for (int i = 0; i < 128; ++i) {
        x = x * 1664525u + 1013904223u;
        id.push_back(static_cast<uint8_t>(x >> 24));
      }
    }
    const std::vector<uint8_t> got = octet::mpi_broadcast_bytes(env, id);
    std::string hex;
    for (uint8_t b : got) {
      char h[3];
      std::snprintf(h, sizeof h, "%02x", b);
      hex += h;
    }
    std::printf("rank %d of %d (launcher %s, mpi %d): %s %s\n", env.rank, env.world_size,
                env.launcher.c_str(), env.mpi ? 1 : 0, env.rank == 0 ? "sent" : "got", hex.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_probe: %s\n", e.what());
    return 1;
  }
}
