// The NCCL id's exchange through MPI, for ranks that an MPI launcher started (OpenMPI's mpirun, or
// srun with PMIx): rank 0's bytes reach every rank by MPI_Bcast over MPI_COMM_WORLD, instead of
// the TCP rendezvous on MASTER_ADDR:MASTER_PORT (dist/launch.h), so MASTER_ADDR is not needed.
//
// Built only when CMake found MPI (find_package(MPI COMPONENTS C); Debian: libopenmpi-dev);
// without it mpi_built() is false and an MPI-launched run uses the TCP rendezvous (the launcher
// prints a note). MPI is initialised for the exchange and finalised right after it: the ranks
// talk through NCCL from then on. MPI_Bcast has no timeout of its own: a rank that dies is
// reported by mpirun, which then ends the others.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/launch.h"

namespace octet {

bool mpi_built();
// Whether an MPI launcher started this process: OMPI_COMM_WORLD_RANK or PMIX_RANK is set.
bool launched_by_mpi(const GetEnv& getenv);

// Rank 0's `payload` (the other ranks' is ignored) on every rank, through MPI_Bcast (collective:
// every rank of the launch calls it once). Checks that MPI's world agrees with `env` (rank and
// size), naming both on a mismatch. Throws when this build has no MPI.
std::vector<uint8_t> mpi_broadcast_bytes(const LaunchEnv& env, const std::vector<uint8_t>& payload);

}  // namespace octet
