// The in-process Comm: N ranks as N threads of one process on the CPU backend, sharing one group.
//
// Each collective is a rendezvous: every rank posts its buffers and waits for the others (up to the
// group's timeout), then computes its own part of the result from the others' buffers in rank
// order (deterministic: comm.h), then waits again until every rank is done reading. Ranks check
// that they called the same collective with the same counts; a mismatch fails every rank.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm.h"

namespace octet {

// One communicator per rank of a new group of `size` ranks; give comms[r] to rank r's thread.
std::vector<std::shared_ptr<Comm>> make_inprocess_comms(int size,
                                                        std::chrono::milliseconds timeout);

// Runs fn(ctx) on `size` threads, rank r with a fresh CPU context whose comm is rank r of a new
// in-process group. A rank that throws aborts the group (its peers then fail naming it). Returns
// each rank's error message, "" for a rank that returned normally.
std::vector<std::string> run_inprocess_ranks(int size, const std::function<void(Context&)>& fn,
                                             std::chrono::milliseconds timeout);
// The same, throwing the first failing rank's error ("rank r: ...") when any rank failed.
void run_inprocess_ranks_or_throw(int size, const std::function<void(Context&)>& fn,
                                  std::chrono::milliseconds timeout);

}  // namespace octet
