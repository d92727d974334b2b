#include "dist/mpi_exchange.h"

#include "core/check.h"

#if OCTET_WITH_MPI
// The C API only: OpenMPI's and MPICH's mpi.h otherwise pull in their C++ bindings (libmpi_cxx).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace octet {

bool launched_by_mpi(const GetEnv& getenv) {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK"})
    if (const char* s = getenv(v); s && *s) return true;
  return false;
}

#if OCTET_WITH_MPI

namespace {
void mpi_ok(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = {};
  int n = 0;
  MPI_Error_string(rc, msg, &n);
  OCTET_THROW("MPI: ", what, " failed: ", std::string(msg, static_cast<size_t>(n)));
}
}  // namespace

bool mpi_built() {
  return true;
}

std::vector<uint8_t> mpi_broadcast_bytes(const LaunchEnv& env,
                                         const std::vector<uint8_t>& payload) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  OCTET_CHECK(!finalized, "MPI: the id exchange runs once per process (MPI is finalised)");
  if (!inited) mpi_ok(MPI_Init(nullptr, nullptr), "MPI_Init");
  // Errors come back as return codes (the default aborts the job without a word).
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = -1, size = 0;
  mpi_ok(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  mpi_ok(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  OCTET_CHECK(rank == env.rank && size == env.world_size, "MPI: MPI_COMM_WORLD has rank ", rank,
              " of ", size, " but the launch environment (", env.launcher, ") says rank ", env.rank,
              " of ", env.world_size);
  // The length first, so that rank 0 alone decides it.
  auto n = static_cast<int64_t>(payload.size());
  mpi_ok(MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast (length)");
  OCTET_CHECK(n >= 0 && n < (int64_t{1} << 30), "MPI: bad broadcast length ", n);
  std::vector<uint8_t> out(static_cast<size_t>(n));
  if (rank == 0) out = payload;
  if (n > 0)
    mpi_ok(MPI_Bcast(out.data(), static_cast<int>(n), MPI_BYTE, 0, MPI_COMM_WORLD),
           "MPI_Bcast (id)");
  if (!inited) mpi_ok(MPI_Finalize(), "MPI_Finalize");
  return out;
}

#else  // no MPI in this build

bool mpi_built() {
  return false;
}

std::vector<uint8_t> mpi_broadcast_bytes(const LaunchEnv&, const std::vector<uint8_t>&) {
  OCTET_THROW(
      "this build has no MPI (install libopenmpi-dev and reconfigure; scripts/setup.sh does)");
}

#endif

}  // namespace octet
