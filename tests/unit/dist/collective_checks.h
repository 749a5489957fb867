// Checks of every collective against a serial reference each rank computes locally. Each rank's inputs are a
// pure function of (rank, index, seed), so any rank can rebuild every peer's contribution. Called on every
// rank of a communicator, by the fake test (threads) and by the MPI test (processes under mpirun).
#pragma once

#include "dist/communicator.h"

namespace kestrel::dist::testing {

void check_all_reduce_matches_serial(Communicator& comm);
void check_all_reduce_reproducible(Communicator& comm);
void check_reduce_scatter(Communicator& comm);
void check_all_gather_v(Communicator& comm);
void check_all_to_all_v(Communicator& comm);
void check_broadcast(Communicator& comm);
void check_barrier_and_bad_arguments(Communicator& comm);

// All of the above in order.
void check_all(Communicator& comm);

}  // namespace kestrel::dist::testing
