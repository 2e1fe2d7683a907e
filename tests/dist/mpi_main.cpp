// tests/dist/mpi_main.cpp: the Catch2 runner of the MPI test programs (tests/dist/*.mpi.cpp),
// between MPI_Init and MPI_Finalize; compiled once, like support/main.cpp. Every rank runs the
// same cases in the same order (they are collective), and the job fails if any rank's failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "solder/dist/mpi.hpp"

int main(int argc, char** argv) {
  solder::dist::mpi_session mpi(&argc, &argv);
  int code = 0;
  {
    Catch::Session session;
    if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
    code = session.run();
    const solder::dist::mpi_communicator world;
    code = int(world.max(code));
  }
  return code;
}
