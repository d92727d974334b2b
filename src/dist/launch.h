// Where this process sits in a multi-process launch, read from the environment the usual
// launchers set, and the TCP rendezvous that hands rank 0's NCCL id to every rank.
//
// Launchers, first match wins:
//   torchrun (and `octet train --nproc N`): RANK, WORLD_SIZE, LOCAL_RANK, [LOCAL_WORLD_SIZE],
//                                          MASTER_ADDR, MASTER_PORT
//   Slurm srun:     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, [SLURM_NTASKS_PER_NODE];
//                   MASTER_ADDR (else SLURM_LAUNCH_NODE_IPADDR), MASTER_PORT (else 29500)
//   OpenMPI mpirun: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//                   [OMPI_COMM_WORLD_LOCAL_SIZE]; MASTER_ADDR, MASTER_PORT (else 29500)
//   none of these:  a single process (rank 0 of 1).
// Under an MPI launcher (OMPI_COMM_WORLD_RANK or PMIX_RANK set: mpirun, or srun --mpi=pmix) in a
// build with MPI, the NCCL id goes through MPI_Bcast (dist/mpi_exchange.h) and MASTER_ADDR is not
// needed; otherwise through tcp_rendezvous below.
// A malformed or inconsistent value is an error naming the variable.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace octet {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // the GPU this process uses
  int local_world_size = 1;  // processes on this node (-1 when the launcher does not say)
  std::string master_addr;   // rank 0's host, for the rendezvous
  int master_port = 0;
  std::string launcher = "none";  // "torchrun", "slurm", "openmpi" or "none"
  bool mpi = false;               // the id goes through MPI (launched by MPI, MPI built)
};

using GetEnv = std::function<const char*(const char*)>;
LaunchEnv launch_env_from(const GetEnv& getenv);
LaunchEnv launch_env();  // from this process's environment

// Rank 0 serves `payload` on master_port (all interfaces); every other rank connects to
// master_addr:master_port and receives it. Returns the payload on every rank once rank 0 has
// served all world_size - 1 peers (so it is also a barrier of the launch). Rank 0 throws when a
// peer has not connected within `timeout`, naming the missing ranks; a peer throws when it cannot
// reach rank 0 within `timeout`. Peers announce their rank and world size; rank 0 refuses (on
// both sides) a duplicate rank or a different world size.
std::vector<uint8_t> tcp_rendezvous(const LaunchEnv& env, const std::vector<uint8_t>& payload,
                                    std::chrono::milliseconds timeout);

}  // namespace octet
