#pragma once
// How the processes of a multi-process command agree to start: every process checks its own
// options, then all of them exchange their verdicts and options in one small all-gather,
// before any other collective. Either every process goes on, or every one stops with the
// first failing rank's message (the caller's rank 0 reports it; the others exit quietly).

#include <functional>
#include <string>
#include <vector>

#include "detlogp/comm.hpp"

namespace detlogp::cli {

// `preflight` throws to refuse (its message travels to every rank); `options` are the items
// every process must share, one "--name value" each. Collective over `world`. Returns the
// message ("rank R: <why>" unless rank 0 failed, or which options differ), empty when all
// agree.
std::string agree_on_options(Communicator& world, const std::function<void()>& preflight,
                             const std::vector<std::string>& options);

}  // namespace detlogp::cli
