// Multi-process launches of `octet train` and `octet bench comm` (src/dist/launch.h reads the
// environment):
//   - `octet train --nproc N ...` starts N ranks of itself on this machine (RANK, WORLD_SIZE,
//     LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT, NCCL_NVLS_ENABLE=0)
//     and waits for them; when one fails the others are stopped (SIGTERM) and the first failure's
//     status is returned;
//   - a rank started by torchrun, srun, mpirun or --nproc joins the others: rank 0's NCCL id
//     through the TCP rendezvous on MASTER_ADDR:MASTER_PORT, then the NCCL communicator on GPU
//     LOCAL_RANK.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/launch.h"

namespace octet::cli {

// Runs `octet <command> child_args...` (`octet train ...`, `octet bench comm ...`) as `nproc` local
// ranks; returns the exit status to use.
int spawn_local_ranks(int nproc, const std::vector<std::string>& child_args,
                      const std::vector<std::string>& command = {"train"});

// This process's communicator for a launch of several ranks (null for a single process), with the
// GPU it runs on. Throws when the build or the machine cannot (no NCCL, no GPU LOCAL_RANK).
std::shared_ptr<Comm> join_launch(const LaunchEnv& env);

}  // namespace octet::cli
